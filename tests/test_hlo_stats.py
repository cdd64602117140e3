"""hlo_stats: collective ops, bytes and execution counts from compiled HLO text."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rubric_jax import hlo_stats

# A hand-written module: an all-gather in the entry, an async all-reduce in a scan-like loop of 4
# iterations (called through a fusion wrapper), and a reduce-scatter in a loop of unknown length.
_HLO = """HloModule m, entry_computation_layout={()->f32[]}

%add (x: f32[], y: f32[]) -> f32[] {
  ROOT %a = f32[] add(f32[] %x, f32[] %y)
}

%inner (p: bf16[16,8]) -> bf16[16,8] {
  %ars = bf16[16,8]{1,0} all-reduce-start(bf16[16,8]{1,0} %p), to_apply=%add
  ROOT %ard = bf16[16,8]{1,0} all-reduce-done(bf16[16,8]{1,0} %ars)
}

%body4 (t: (s32[], bf16[16,8])) -> (s32[], bf16[16,8]) {
  %c = bf16[16,8]{1,0} call(bf16[16,8]{1,0} %g), to_apply=%inner
  ROOT %r = (s32[], bf16[16,8]) tuple(%i, %c)
}

%cond4 (t: (s32[], bf16[16,8])) -> pred[] {
  ROOT %lt = pred[] compare(s32[] %i, s32[] %n), direction=LT
}

%bodyn (t: (s32[], f32[8,4])) -> (s32[], f32[8,4]) {
  %rs = f32[2,4]{1,0} reduce-scatter(f32[8,4]{1,0} %x), dimensions={0}, to_apply=%add, metadata={op_name="jit(f)/decode"}
  ROOT %r = (s32[], f32[8,4]) tuple(%i, %x)
}

%condn (t: (s32[], f32[8,4])) -> pred[] {
  ROOT %lt = pred[] compare(s32[] %i, s32[] %n), direction=LT
}

ENTRY %main (p0: f32[2,3]) -> f32[] {
  %ag = f32[16,3]{1,0} all-gather(f32[2,3]{1,0} %p0), dimensions={0}
  %w4 = (s32[], bf16[16,8]) while((s32[], bf16[16,8]) %t0), condition=%cond4, body=%body4, backend_config={"known_trip_count":{"n":"4"}}
  %wn = (s32[], f32[8,4]) while((s32[], f32[8,4]) %t1), condition=%condn, body=%bodyn
  ROOT %z = f32[] constant(0)
}
"""


def test_custom_calls_count_executions_through_loops():
    text = _HLO.replace("%c = bf16[16,8]{1,0} call(bf16[16,8]{1,0} %g), to_apply=%inner",
                        '%c = bf16[16,8]{1,0} custom-call(bf16[16,8]{1,0} %g), custom_call_target="__cudnn$fmhaSoftmax"')
    text = text.replace("%ag = f32[16,3]{1,0} all-gather(f32[2,3]{1,0} %p0), dimensions={0}",
                        '%ag = f32[16,3]{1,0} custom-call(f32[2,3]{1,0} %p0), custom_call_target="__cublas$gemm"')
    assert hlo_stats.custom_calls(text) == {"__cudnn$fmhaSoftmax": 4, "__cublas$gemm": 1}
    assert hlo_stats.custom_calls(_HLO) == {}


def test_hand_written_module():
    found = {c.kind: c for c in hlo_stats.collectives(_HLO)}
    assert set(found) == {"all-gather", "all-reduce", "reduce-scatter"}
    assert (found["all-gather"].bytes, found["all-gather"].executions, found["all-gather"].in_loop) == (16 * 3 * 4, 1, False)
    assert (found["all-reduce"].bytes, found["all-reduce"].executions, found["all-reduce"].in_loop) == (16 * 8 * 2, 4, True)
    assert (found["reduce-scatter"].executions, found["reduce-scatter"].in_loop) == (None, True)
    assert found["reduce-scatter"].op_name == "jit(f)/decode"
    summary = hlo_stats.summarize(hlo_stats.collectives(_HLO))
    assert summary["all-reduce"] == hlo_stats.KindSummary(4, 4 * 256, 0, 0)
    assert summary["reduce-scatter"] == hlo_stats.KindSummary(0, 0, 1, 32)
    assert summary["collective-permute"] == hlo_stats.KindSummary(0, 0, 0, 0)
    assert "all-gather" in hlo_stats.format_table(summary)


def test_a_loop_condition_counts_with_its_body():
    """The sampler's decode loop tests `~all(done)` across the data replicas in its condition: an all-reduce
    per generated token beside the body's own (filed as a separate loop and dropped, the 7B rollout read 61
    collectives per token where it runs 62)."""
    text = _HLO.replace("  ROOT %lt = pred[] compare(s32[] %i, s32[] %n), direction=LT\n}\n\nENTRY",
                        "  ROOT %any = pred[] all-reduce(pred[] %live), to_apply=%add\n}\n\nENTRY").replace(
        "  ROOT %r = (s32[], f32[8,4]) tuple(%i, %x)",
        "  %ar = f32[8,4]{1,0} all-reduce(f32[8,4]{1,0} %x), to_apply=%add\n  ROOT %r = (s32[], f32[8,4]) tuple(%i, %ar)")
    found = {c.computation: c for c in hlo_stats.collectives(text) if c.executions is None and c.kind == "all-reduce"}
    assert found["condn"].loop == found["bodyn"].loop == "bodyn" and found["condn"].per_iteration == 1
    summary = hlo_stats.summarize(hlo_stats.collectives(text))
    assert summary["all-reduce"] == hlo_stats.KindSummary(4, 4 * 256, 2, 8 * 4 * 4 + 1)


# A decode-like module: a loop of unknown length whose body all-gathers once and runs a 28-step layer
# loop that all-gathers twice per step: 1 + 2 * 28 = 57 all-gathers per iteration of the outer loop.
_NESTED_HLO = """HloModule m, entry_computation_layout={()->f32[]}

%layer (t: (s32[], bf16[4,8])) -> (s32[], bf16[4,8]) {
  %ag1 = bf16[32,8]{1,0} all-gather(bf16[4,8]{1,0} %x), dimensions={0}
  %ag2 = bf16[32,8]{1,0} all-gather(bf16[4,8]{1,0} %y), dimensions={0}
  ROOT %r = (s32[], bf16[4,8]) tuple(%i, %x)
}

%layer_cond (t: (s32[], bf16[4,8])) -> pred[] {
  ROOT %lt = pred[] compare(s32[] %i, s32[] %n), direction=LT
}

%token (t: (s32[], bf16[4,8])) -> (s32[], bf16[4,8]) {
  %head = f32[16,4]{1,0} all-gather(f32[2,4]{1,0} %h), dimensions={0}
  %layers = (s32[], bf16[4,8]) while((s32[], bf16[4,8]) %t), condition=%layer_cond, body=%layer, backend_config={"known_trip_count":{"n":"28"}}
  ROOT %r = (s32[], bf16[4,8]) tuple(%i, %x)
}

%token_cond (t: (s32[], bf16[4,8])) -> pred[] {
  ROOT %lt = pred[] compare(s32[] %i, s32[] %n), direction=LT
}

ENTRY %main (p0: f32[2,3]) -> f32[] {
  %decode = (s32[], bf16[4,8]) while((s32[], bf16[4,8]) %t0), condition=%token_cond, body=%token
  ROOT %z = f32[] constant(0)
}
"""


def test_known_loops_nested_in_a_loop_of_unknown_length_multiply_per_iteration_counts():
    found = hlo_stats.collectives(_NESTED_HLO)
    assert sorted((c.computation, c.executions, c.per_iteration) for c in found) == [
        ("layer", None, 28), ("layer", None, 28), ("token", None, 1)]
    summary = hlo_stats.summarize(found)["all-gather"]
    assert summary == hlo_stats.KindSummary(0, 0, 1 + 2 * 28, 16 * 4 * 4 + 2 * 28 * 32 * 8 * 2)



def test_loop_kernels_count_launches_per_iteration_of_a_decode_loop():
    """Per iteration of the decode-like loop: its body's fusion, custom call and copy (the async pair once), 28 times
    the layer loop's two all-gathers, and its own condition's compare; the layer loop's condition never runs (a known
    trip count) and the plumbing (tuples, parameters, the while) launches nothing. The float32 [16, 4] result of
    the body's fusion is found, the bf16 ones and the fusion's inside are not."""
    text = _NESTED_HLO.replace(
        "  %head = f32[16,4]{1,0} all-gather(f32[2,4]{1,0} %h), dimensions={0}",
        "  %head = f32[16,4]{1,0} fusion(f32[2,4]{1,0} %h), kind=kLoop, calls=%fused\n"
        '  %gemm = bf16[4,8]{1,0} custom-call(bf16[4,8]{1,0} %x), custom_call_target="__cublas$gemm"\n'
        "  %cs = (bf16[4,8]{1,0}, bf16[4,8]{1,0}) copy-start(bf16[4,8]{1,0} %gemm)\n"
        "  %cd = bf16[4,8]{1,0} copy-done((bf16[4,8]{1,0}, bf16[4,8]{1,0}) %cs)").replace(
        "%layer (t:", "%fused (p: f32[2,4]) -> f32[16,4] {\n  ROOT %b = f32[16,4]{1,0} broadcast(f32[2,4]{1,0} %p)\n}"
        "\n\n%layer (t:")
    (decode,) = hlo_stats.loop_kernels(text)
    assert decode.loop == "token" and decode.launches == 1 + 1 + 1 + 2 * 28 + 1
    assert decode.by_kind == {"fusion:kLoop": 1, "custom-call:__cublas$gemm": 1, "copy-start": 1, "all-gather": 56,
                              "compare": 1}
    assert hlo_stats.float32_outputs(text, (16, 4)) == ["head (fusion, in token)"]
    assert hlo_stats.float32_outputs(text, (4, 8)) == [] and hlo_stats.loop_kernels(_HLO)[0].launches == 1 + 1

def test_shape_bytes():
    assert hlo_stats.shape_bytes("bf16[32,2560,18944]{2,1,0}") == 32 * 2560 * 18944 * 2
    assert hlo_stats.shape_bytes("(f32[2]{0}, s8[3]{0})") == 11
    assert hlo_stats.shape_bytes("f32[]") == 4
    with pytest.raises(ValueError, match="unknown HLO element type"):
        hlo_stats.shape_bytes("q7[2]")


def test_compiled_program_on_8_devices():
    """A weight sharded over 8 devices inside a data-dependent while loop and a 3-step scan: the
    contraction over the sharded dim all-reduces once per iteration of each."""
    mesh = Mesh(np.asarray(jax.devices()[:8]), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(w, x):
        y = jax.lax.while_loop(lambda c: c[0] < x[0, 0], lambda c: (c[0] + 1, jnp.tanh(c[1] @ w)), (0.0, x))[1]
        return jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), y, None, length=3)[0]

    compiled = jax.jit(f, in_shardings=(NamedSharding(mesh, PartitionSpec("fsdp", None)),
                                        NamedSharding(mesh, PartitionSpec()))).lower(
        jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((4, 64), jnp.float32)).compile()
    found = hlo_stats.collectives(compiled.as_text())
    assert found and all(c.in_loop for c in found)
    assert sorted((c.executions is None) for c in found if c.kind == "all-reduce") == [False, True]
    assert sum(c.executions for c in found if c.executions is not None) == 3


def test_compiled_scan_inside_a_while_loop_counts_per_iteration():
    """A 3-step scan nested in a data-dependent while loop (the sampler's layer scan inside its decode
    loop): its all-reduce executes 3 times per iteration of the outer loop."""
    mesh = Mesh(np.asarray(jax.devices()[:8]), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(w, x):
        def token(c):
            return c[0] + 1, jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), c[1], None, length=3)[0]

        return jax.lax.while_loop(lambda c: c[0] < x[0, 0], token, (0.0, x))[1]

    compiled = jax.jit(f, in_shardings=(NamedSharding(mesh, PartitionSpec("fsdp", None)),
                                        NamedSharding(mesh, PartitionSpec()))).lower(
        jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((4, 64), jnp.float32)).compile()
    summary = hlo_stats.summarize(hlo_stats.collectives(compiled.as_text()))["all-reduce"]
    assert (summary.count, summary.per_iteration_count) == (0, 3)


def test_sequential_loops_of_unknown_length_report_the_busiest_per_iteration():
    """Two data-dependent loops one after the other (the sampler's decode segments: each generated token
    runs in one of them), the first with a 3-step scan, the second with a 2-step one: 3 all-reduces per
    iteration, not 5."""
    mesh = Mesh(np.asarray(jax.devices()[:8]), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(w, x):
        def token(steps):
            return lambda c: (c[0] + 1, jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), c[1], None, length=steps)[0])

        first = jax.lax.while_loop(lambda c: c[0] < x[0, 0], token(3), (0.0, x))
        return jax.lax.while_loop(lambda c: c[0] < x[0, 1], token(2), first)[1]

    compiled = jax.jit(f, in_shardings=(NamedSharding(mesh, PartitionSpec("fsdp", None)),
                                        NamedSharding(mesh, PartitionSpec()))).lower(
        jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((4, 64), jnp.float32)).compile()
    found = [c for c in hlo_stats.collectives(compiled.as_text()) if c.kind == "all-reduce"]
    assert sorted(c.per_iteration for c in found) == [2, 3] and len({c.loop for c in found}) == 2
    summary = hlo_stats.summarize(found)["all-reduce"]
    assert (summary.count, summary.per_iteration_count, summary.per_iteration_bytes) == (0, 3, 3 * 4 * 64 * 4)


def test_no_entry_is_an_error():
    with pytest.raises(ValueError, match="no ENTRY"):
        hlo_stats.collectives("HloModule m\n")


# A GPU-like module: a 4-step layer loop whose body slices one layer of a stacked weight (a fusion reading
# only the slice), runs a gemm fusion on it, and writes a per-layer result in place (a dynamic-update-slice
# fusion); the entry adds two arrays (a loop fusion) and runs a float32 dot as a custom call.
_KERNEL_HLO = """HloModule k, entry_computation_layout={()->f32[]}

%slice_layer (w: f32[4,16,8], i: s32[]) -> bf16[16,8] {
  %w = f32[4,16,8]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = f32[1,16,8]{2,1,0} dynamic-slice(%w, %i, %z, %z), dynamic_slice_sizes={1,16,8}
  %b = f32[16,8]{1,0} bitcast(%ds)
  ROOT %c = bf16[16,8]{1,0} convert(%b)
}

%gemm (x: bf16[2,16], y: bf16[16,8]) -> bf16[2,8] {
  %x = bf16[2,16]{1,0} parameter(0)
  %y = bf16[16,8]{1,0} parameter(1)
  ROOT %d = bf16[2,8]{1,0} dot(%x, %y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%write_layer (acc: bf16[4,2,8], u: bf16[2,8], i: s32[]) -> bf16[4,2,8] {
  %acc = bf16[4,2,8]{2,1,0} parameter(0)
  %u = bf16[2,8]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  %u3 = bf16[1,2,8]{2,1,0} bitcast(%u)
  ROOT %dus = bf16[4,2,8]{2,1,0} dynamic-update-slice(%acc, %u3, %i, %z, %z)
}

%body (t: (s32[], f32[4,16,8], bf16[2,16], bf16[4,2,8])) -> (s32[], f32[4,16,8], bf16[2,16], bf16[4,2,8]) {
  %t = (s32[], f32[4,16,8], bf16[2,16], bf16[4,2,8]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %w = f32[4,16,8]{2,1,0} get-tuple-element(%t), index=1
  %x = bf16[2,16]{1,0} get-tuple-element(%t), index=2
  %acc = bf16[4,2,8]{2,1,0} get-tuple-element(%t), index=3
  %layer = bf16[16,8]{1,0} fusion(%w, %i), kind=kLoop, calls=%slice_layer
  %y = bf16[2,8]{1,0} fusion(%x, %layer), kind=kCustom, calls=%gemm
  %acc2 = bf16[4,2,8]{2,1,0} fusion(%acc, %y, %i), kind=kLoop, calls=%write_layer
  ROOT %r = (s32[], f32[4,16,8], bf16[2,16], bf16[4,2,8]) tuple(%i, %w, %x, %acc2)
}

%cond (t: (s32[], f32[4,16,8], bf16[2,16], bf16[4,2,8])) -> pred[] {
  %t = (s32[], f32[4,16,8], bf16[2,16], bf16[4,2,8]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%sum (a: f32[1024], b: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %b = f32[1024]{0} parameter(1)
  ROOT %s = f32[1024]{0} add(%a, %b)
}

ENTRY %main (t0: (s32[], f32[4,16,8], bf16[2,16], bf16[4,2,8]), a: f32[1024], m: f32[8,8]) -> f32[] {
  %t0 = (s32[], f32[4,16,8], bf16[2,16], bf16[4,2,8]) parameter(0)
  %a = f32[1024]{0} parameter(1)
  %m = f32[8,8]{1,0} parameter(2)
  %w = (s32[], f32[4,16,8], bf16[2,16], bf16[4,2,8]) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %s = f32[1024]{0} fusion(%a, %a), kind=kLoop, calls=%sum, metadata={op_name="jit(f)/add"}
  %mm = f32[8,8]{1,0} custom-call(%m, %m), custom_call_target="__cublas$gemm"
  %d = f32[8,8]{1,0} dot(%m, %m), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %z = f32[] constant(0)
}
"""


def test_kernels_count_launches_and_the_bytes_of_non_matmul_kernels():
    found = {k.name: k for k in hlo_stats.kernels(_KERNEL_HLO)}
    # Fused bodies, tuples, loops, constants launch nothing; the loop's stop test does (counted with its body).
    assert sorted(found) == ["acc2", "d", "layer", "lt", "mm", "s", "y"]
    assert sum(k.executions for k in found.values()) == 4 * 4 + 3
    # The layer slice reads one layer of the stacked weight (16 x 8 float32), not all 4, and writes it in bf16.
    assert (found["layer"].bytes, found["layer"].executions, found["layer"].matmul) == (16 * 8 * 4 + 4 + 16 * 8 * 2, 4, False)
    # The in-place write reads the update (and the index) and writes the update: not the whole [4, 2, 8] buffer.
    assert found["acc2"].bytes == 2 * 8 * 2 + 4 + 2 * 8 * 2
    assert found["s"].bytes == 3 * 1024 * 4 and found["s"].op == "fusion:kLoop" and found["s"].op_name == "jit(f)/add"
    assert found["y"].matmul and found["mm"].matmul and found["mm"].op == "custom-call:__cublas$gemm" and found["d"].matmul
    assert hlo_stats.non_matmul_bytes(found.values()) == (4 * (found["layer"].bytes + found["acc2"].bytes + 2 * 4 + 1)
                                                          + 3 * 1024 * 4)


def test_float32_dots_are_those_with_float32_operands():
    """The gemm fusion's bf16 dot is not one; the entry's f32 dot is (a custom call's operands are not a dot)."""
    assert [d.split(":")[0] for d in hlo_stats.float32_dots(_KERNEL_HLO)] == ["d"]

"""One-shot accelerator benchmark (issue #9 §7): Qwen2.5-1.5B and 7B shapes with random weights, on one device.

  PYTHONPATH=. python benchmarks/gpu.py [--sizes=1.5b,7b]       # one H200: the whole table in < 8 minutes
  PYTHONPATH=. python benchmarks/gpu.py --smoke                  # toy shapes on CPU (tests/test_gpu_benchmark.py)
  PYTHONPATH=. python benchmarks/gpu.py --sizes=1.5b --attention=einsum,fused
      # the GRPO update with our einsum attention and with cuDNN flash attention, a column each
  PYTHONPATH=. .venv-aot/bin/python benchmarks/gpu.py --sizes=1.5b --attention=einsum,fused --aot_target=h200
      # no GPU: the same GRPO update compiled for an H200 by XLA's GPU compiler on this machine

Per size, in this order (each measurement after a warm-up call that compiles it):
  * GRPO update: one `jit_grpo_step` (AdamW, float32 params, bf16 compute, remat, scan) on ROWS x
    (PROMPT + RESPONSE) tokens in MICRO micro-batches of one group (its prompt runs once); tokens/s (of
    the rollouts) and MFU = model FLOPs of the tokens computed / time / peak bf16 FLOP/s, model FLOPs
    per token = 6 N + 12 L H T (PaLM, appendix B: N matmul parameters, L layers, H = heads x head_dim,
    T tokens of context, here bounded by PROMPT + RESPONSE). Compiled memory (XLA's memory_analysis:
    arguments + outputs + temporaries - aliased) next to the device's measured peak after the step.
  * Decode at batch DECODE_BATCH: `sampling.generate` (greedy, bf16 weights in the decode layout) run to
    SHORT and to LONG new tokens with one compiled program (max_new_tokens is runtime data); the
    difference is LONG - SHORT decode steps without the prefill. tokens/s = batch / step time; MBU =
    bytes a step reads (bf16 weights + the KV cache window it attends over, `mean_decode_window`) / time /
    peak memory bandwidth.
  * Judge: `llm_judge.judge_rows` end to end (prompt, chat template, tokenize, one batched generate,
    parse) on JUDGE_ITEMS items with the model as judge (the tiny tokenizer's ids are a subset of the
    vocabulary), items/s, and per-item calls on a few items for the ratio.
Peaks are the device's datasheet numbers (H200 SXM: 989 TFLOP/s bf16 dense, 4.8 TB/s); on a device
without an entry MFU and MBU print as n/a. A step that runs out of memory prints OOM, one that fails prints
its error, and the table goes on (printed after every size); the exit status is 1 when any measurement
failed other than by OOM.

`--attention` measures the GRPO update once per attention implementation of the teacher-forced forward
(`ModelConfig.attention`): einsum (ours), fused (cuDNN flash attention on an NVIDIA GPU; on CPU the XLA
implementation of the same `jax.nn.dot_product_attention` call), or a ModelConfig value (xla, cudnn).
`--aot_target` compiles the GRPO update for a GPU of rubric_jax.aot_targets instead of running anything
(needs XLA's GPU compiler: requirements-aot.txt): compiled memory and the cuDNN attention custom calls of
the program, the proof that "fused" replaced the einsums.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from transformers import AutoTokenizer

from rubric_jax import aot, grpo, hlo_stats, loader, padding, sampling, sharding
from rubric_jax.assets import TINY_DIR
from rubric_jax.judges.backends import SamplerBackend
from rubric_jax.judges.llm_judge import Judge, judge_rows
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.models.config import ModelConfig
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.train import state as train_state, step as train_step

_SIZES = flags.DEFINE_list("sizes", ["1.5b", "7b"], "Qwen2.5 shapes to measure (1.5b, 7b).")
_SMOKE = flags.DEFINE_bool("smoke", False, "Toy shapes and sizes, for a CPU test of the script.")
_PARTS = flags.DEFINE_list("parts", ["grpo", "decode", "judge"], "Measurements to run (the judge needs decode).")
_MICRO = flags.DEFINE_list("micro", [], "GRPO micro-batch counts to measure, a column each (default: the settings').")
_ATTENTION = flags.DEFINE_list("attention", [], "Attentions of the GRPO update to measure, a column each: einsum, "
                                "fused (cudnn on NVIDIA GPUs, xla elsewhere), xla, cudnn (default: auto, the "
                                "config default for this platform).")
_AOT_TARGET = flags.DEFINE_enum("aot_target", None, list(aot.TARGETS[1:]), "Only compile the GRPO update for this "
                                "GPU (XLA's GPU compiler on this machine, no GPU needed) and print its memory and "
                                "cuDNN attention calls.")
_TRACE_DIR = flags.DEFINE_string("trace_dir", None, "Write a profiler trace (Perfetto JSON) of one GRPO update "
                                 "and of a 16-token generate here.")

# Qwen2.5-{1.5B,7B}-Instruct config.json (Hugging Face, 2024-09): the shapes, no weights.
QWEN25 = {
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                 num_kv_heads=2, head_dim=128, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
               num_kv_heads=4, head_dim=128, tie_word_embeddings=False),
    "toy": dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=16, tie_word_embeddings=True),
}
# device_kind substring -> (peak dense bf16 FLOP/s, peak memory bandwidth bytes/s), from the datasheets.
PEAKS = {"H200": (989.4e12, 4.8e12), "H100": (989.4e12, 3.35e12), "A100": (312e12, 2.039e12)}
GRPO_CELLS = ("GRPO update tokens/s", "GRPO update MFU", "GRPO compiled memory (GiB)", "GRPO measured peak (GiB)",
              "GRPO compile (s)")
RUBRIC = Path(__file__).resolve().parents[1] / "configs" / "rubrics" / "medical_qa.yaml"  # its LLM dimensions


@dataclasses.dataclass(frozen=True)
class Settings:
    """Workload sizes (the full run's, or --smoke's)."""

    rows: int = 16  # GRPO rows per update
    prompt: int = 512  # GRPO prompt tokens (and decode prompt slots)
    response: int = 512  # GRPO response tokens
    micro: int = 4  # GRPO micro-batches
    decode_batch: int = 64
    decode_prompt: int = 128
    short: int = 260  # decode runs to SHORT and LONG new tokens: one response bucket (512), one program
    long: int = 512
    judge_items: int = 64
    judge_per_item: int = 4
    judge_new_tokens: int = 16
    repeats: int = 3  # timed runs per measurement (the fastest counts), after the warm-up


SMOKE = Settings(rows=4, prompt=16, response=16, micro=2, decode_batch=4, decode_prompt=8, short=5, long=8,
                 judge_items=4, judge_per_item=1, judge_new_tokens=4, repeats=1)


def model_config(size: str, attention: str = "auto", backend: str | None = None) -> ModelConfig:
    """The size's shapes as a ModelConfig in the accelerator dtypes (float32 compute on CPU), for `backend`
    (default: jax's); `attention` as `--attention` names it."""
    compute = loader.resolve_dtype("auto", "compute_dtype", backend)
    if attention == "fused":
        attention = "cudnn" if loader.resolve_attention("auto", "bfloat16", "--attention", backend) == "cudnn" else "xla"
    return ModelConfig(architecture="qwen2", rope_theta=1_000_000.0, rms_norm_eps=1e-6, attention_bias=True,
                       rope_scaling=None, max_position_embeddings=32768, param_dtype="float32",
                       compute_dtype=compute, remat=True, scan_layers=True,
                       attention=loader.resolve_attention(attention, compute, "--attention", backend), **QWEN25[size])


def matmul_params(cfg: ModelConfig) -> int:
    """N: parameters that take part in a matmul (every weight but the input embedding lookup; a tied
    head counts once, as the head)."""
    d, f, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    attention = d * h * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + h * (cfg.num_heads + 2 * cfg.num_kv_heads)
    return cfg.num_layers * (attention + 3 * d * f) + d * cfg.vocab_size


def mean_decode_window(s: Settings) -> float:
    """Cache slots a decode step between SHORT and LONG attends over, on average (n = 1): the prompt bucket
    and the response-cache window of the segment it runs in (`sampling.decode_windows`: the first that holds
    the tokens so far)."""
    windows = sampling.decode_windows(padding.bucket_size(s.long), sampling.DECODE_BLOCK)
    return padding.bucket_size(s.decode_prompt) + float(np.mean([min(w for w in windows if t <= w)
                                                                   for t in range(s.short, s.long)]))


def _timed(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` runs of `fn` (results waited for), in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def measured_ceilings(n: int, copy_bytes: int) -> tuple[float, float]:
    """What this device reaches on the simplest kernels, as the roofs next to the datasheet's: an n x n x n
    bf16 matmul (FLOP/s) and a device-to-device copy of `copy_bytes` (bytes read + written per second)."""
    a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in (0, 1))
    matmul = jax.jit(jnp.matmul)
    jax.block_until_ready(matmul(a, b))
    flops = 2 * n**3 / _timed(lambda: matmul(a, b), 10)
    x = jax.random.normal(jax.random.key(2), (copy_bytes // 4,), jnp.float32)
    copy = jax.jit(lambda v: v + 1)  # one read and one write of every element
    jax.block_until_ready(copy(x))
    return flops, 2 * x.nbytes / _timed(lambda: copy(x), 10)


def _oom(e: Exception) -> bool:
    return "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()


def _grpo_step(s: Settings, shardings: train_state.TrainState, mesh: jax.sharding.Mesh) -> Callable:
    """The jitted GRPO update of `s.rows` rows in `s.micro` micro-batches of one group each (its prompt runs once)."""
    gcfg = grpo.GRPOConfig(group_size=s.rows // s.micro, kl_coef=0.04)
    return train_step.jit_grpo_step(gcfg, micro_batches=s.micro, shardings=shardings, mesh=mesh)


def grpo_batch(cfg: ModelConfig, s: Settings) -> dict[str, np.ndarray]:
    """A GRPO batch of random tokens: `s.micro` prompts of `s.prompt` tokens (one per group) and their rows."""
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, cfg.vocab_size, (s.micro, s.prompt)).astype(np.int32)
    response = np.full((s.rows, s.response), -3.0, np.float32)
    return {"prompt_tokens": prompts, "prompt_mask": np.ones((s.micro, s.prompt), bool),
            "response_tokens": rng.integers(0, cfg.vocab_size, (s.rows, s.response)).astype(np.int32),
            "response_mask": np.ones((s.rows, s.response), bool), "loss_mask": np.ones((s.rows, s.response), bool),
            "old_logp": response, "ref_logp": response, "advantages": rng.standard_normal(s.rows).astype(np.float32)}


def _compiled_bytes(memory: object) -> int | None:
    """A compiled program's peak as XLA plans it: arguments + outputs + temporaries - aliased."""
    if memory is None:
        return None
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
            - memory.alias_size_in_bytes)


def compile_grpo(cfg: ModelConfig, s: Settings, devices: list[jax.Device]) -> dict[str, str]:
    """The GRPO update compiled (not run) for `devices[0]`, e.g. a GPU target's on this CPU machine: its
    compiled memory and executions per update of cuDNN's attention forward and backward and of XLA dots
    (every matmul, the einsum attention's batched dots among them)."""
    layout = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(1, 1, 1), devices[:1]))
    tx = train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=1e-6))
    state, shardings = train_state.abstract_train_state(loader.abstract_weights(cfg, layout), tx, layout.mesh)
    host = grpo_batch(cfg, s)
    placed = train_step.batch_shardings(host, layout.mesh)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=placed[k]) for k, v in host.items()}
    start = time.perf_counter()
    with aot.cudnn_of_this_build():
        compiled = _grpo_step(s, shardings, layout.mesh).lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    text = compiled.as_text()
    calls = {k: v for k, v in hlo_stats.custom_calls(text).items() if k.startswith(hlo_stats.CUDNN_ATTENTION)}
    backward = sum(v for k, v in calls.items() if k.endswith("Backward"))
    return {"GRPO compiled memory (GiB)": f"{_compiled_bytes(compiled.memory_analysis()) / 2**30:.1f}",
            "GRPO compile (s)": f"{compile_s:.0f}",
            "GRPO cuDNN attention calls (fwd / bwd)": f"{sum(calls.values()) - backward} / {backward}",
            "GRPO dots executed": str(hlo_stats.summarize(hlo_stats.collectives(text, ("dot",)), ("dot",))["dot"].count)}


def bench_grpo(cfg: ModelConfig, s: Settings, peak_flops: float | None) -> dict[str, str]:
    """One GRPO update: tokens/s, MFU, compiled vs measured memory."""
    layout = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(1, 1, 1), jax.devices()[:1]))
    tx = train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=1e-6))
    state, shardings = train_state.init_train_state(cfg, tx, jax.random.key(0), layout)
    step = _grpo_step(s, shardings, layout.mesh)
    t = s.prompt + s.response
    host = grpo_batch(cfg, s)
    batch = jax.device_put(host, train_step.batch_shardings(host, layout.mesh))
    compile_start = time.perf_counter()
    compiled = _compiled_bytes(step.lower(state, batch).compile().memory_analysis())
    compile_s = time.perf_counter() - compile_start
    limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    if compiled is not None and limit is not None and compiled > limit:  # would only OOM after minutes of setup
        return {"GRPO update tokens/s": f"does not fit ({limit / 2**30:.0f} GiB)",
                "GRPO compiled memory (GiB)": f"{compiled / 2**30:.1f}", "GRPO compile (s)": f"{compile_s:.0f}"}
    current = [state]  # the step donates its state: each call takes the previous call's

    def update() -> dict[str, jax.Array]:
        current[0], metrics = step(current[0], batch)
        return metrics

    update()  # compile and warm up
    seconds = _timed(update, s.repeats)
    if _TRACE_DIR.value:
        with jax.profiler.trace(f"{_TRACE_DIR.value}/grpo", create_perfetto_trace=True):
            jax.block_until_ready(update())
    stats = jax.devices()[0].memory_stats() or {}
    tokens = s.rows * t  # the rollouts' tokens; the model computes each group's prompt once:
    computed = s.micro * s.prompt + s.rows * s.response
    flops = computed * (6 * matmul_params(cfg) + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * t)
    del state, current, batch
    return {"GRPO update tokens/s": f"{tokens / seconds:,.0f}",
            "GRPO update MFU": "n/a" if peak_flops is None else f"{flops / seconds / peak_flops:.1%}",
            "GRPO compiled memory (GiB)": "n/a" if compiled is None else f"{compiled / 2**30:.1f}",
            "GRPO measured peak (GiB)": f"{stats['peak_bytes_in_use'] / 2**30:.1f}" if stats else "n/a",
            "GRPO compile (s)": f"{compile_s:.0f}"}


def bench_decode(cfg: ModelConfig, s: Settings, peak_bandwidth: float | None) -> tuple[dict[str, str], loader.Weights]:
    """Decode steps at batch `s.decode_batch`: tokens/s and MBU; returns the bf16 weights for the judge."""
    decode_cfg = cfg.replace(param_dtype=cfg.compute_dtype, remat=False)
    layout = sharding.decode_layout(sharding.make_mesh(sharding.MeshConfig(1, 1, 1), jax.devices()[:1]), 1)
    weights = loader.init_weights(decode_cfg, layout, jax.random.key(1))
    rng = np.random.default_rng(1)
    prompts = rng.integers(0, cfg.vocab_size, (s.decode_batch, s.decode_prompt)).tolist()

    def run(new_tokens: int) -> sampling.GenerationResult:
        return sampling.generate(weights, prompts, key=jax.random.key(2), max_new_tokens=new_tokens, sampler="greedy",
                                 stop_tokens=(), pad_id=0, layout=layout)

    run(s.long)  # compile and warm up
    if _TRACE_DIR.value:  # max_new_tokens is runtime data: the same program
        with jax.profiler.trace(f"{_TRACE_DIR.value}/decode", create_perfetto_trace=True):
            jax.block_until_ready(run(16))
    long_s, short_s = _timed(lambda: run(s.long), s.repeats), _timed(lambda: run(s.short), s.repeats)
    step_s = (long_s - short_s) / (s.long - s.short)
    itemsize = jnp.dtype(decode_cfg.param_dtype).itemsize
    weight_bytes = sum(x.size for x in jax.tree.leaves(weights.params)) * itemsize
    cache_bytes = 2 * cfg.num_layers * s.decode_batch * mean_decode_window(s) * cfg.num_kv_heads * cfg.head_dim * itemsize
    mbu = "n/a" if peak_bandwidth is None else f"{(weight_bytes + cache_bytes) / step_s / peak_bandwidth:.1%}"
    return {f"decode tokens/s (batch {s.decode_batch})": f"{s.decode_batch / step_s:,.0f}",
            "decode step (ms)": f"{step_s * 1e3:.2f}", "decode MBU": mbu}, weights


def bench_judge(weights: loader.Weights, s: Settings) -> dict[str, str]:
    """Batched judge items/s and the ratio to one call per item."""
    tokenizer = AutoTokenizer.from_pretrained(TINY_DIR / "tokenizer")
    layout = sharding.decode_layout(sharding.make_mesh(sharding.MeshConfig(1, 1, 1), jax.devices()[:1]), 1)
    judge = Judge("random", tokenizer, SamplerBackend(weights, sampling.generate, layout), sampler="greedy",
                  max_new_tokens=s.judge_new_tokens, max_prompt_tokens=4096)
    config = JudgeSpec(samples=1, max_retries=0, shuffle_anchors=False)
    dims = [d for d in load_rubric(RUBRIC).dimensions if d.kind == "llm"]
    n = s.judge_items
    questions = ["How should I treat a mild burn at home?"] * n
    responses = [f"Cool it under running water for ten minutes ({i})." for i in range(n)]
    per_row = [[dims[i % len(dims)]] for i in range(n)]

    def batched(rows: slice) -> object:
        return judge_rows([judge], config, questions[rows], responses[rows], per_row[rows], jax.random.key(3))

    batched(slice(None))
    for i in range(s.judge_per_item):  # compile every shape timed (items' prompts differ by dimension)
        batched(slice(i, i + 1))
    batched_s = _timed(lambda: batched(slice(None)), s.repeats)
    single_s = _timed(lambda: [batched(slice(i, i + 1)) for i in range(s.judge_per_item)], 1) / s.judge_per_item
    return {f"judge items/s (batched, {n} items)": f"{n / batched_s:,.1f}",
            "judge batched / per-item": f"{single_s * n / batched_s:.1f}x"}


def _guarded(measure: Callable[[], dict[str, str]], names: tuple[str, ...], errors: list[str]) -> dict[str, str]:
    """A measurement, or OOM / its error in each of its cells: on a one-shot lease a failing measurement must
    not lose the others. Errors other than OOM are printed and appended to `errors` (the exit status)."""
    try:
        return measure()
    except Exception as e:  # noqa: BLE001 -- reported in the table and the exit status, not swallowed
        if isinstance(e, jax.errors.JaxRuntimeError) and _oom(e):
            return dict.fromkeys(names, "OOM")
        traceback.print_exc()
        errors.append(f"{names[0]}: {type(e).__name__}: {e}")
        return dict.fromkeys(names, f"error ({type(e).__name__})")


def _attentions() -> list[str]:
    """--attention's values (one "auto" by default), each checked: a usage error names a bad one."""
    attentions = _ATTENTION.value or ["auto"]
    bad = sorted(set(attentions) - {"fused", *loader.ATTENTION_CHOICES})
    if bad:
        raise app.UsageError(f"--attention: unknown {bad}; expected some of fused, {', '.join(loader.ATTENTION_CHOICES)}")
    return attentions


def _grpo_variants(attentions: list[str], micros: list[int]) -> list[tuple[str, int]]:
    return [(attention, micro) for attention in attentions for micro in micros]


def _column(size: str, attention: str, micro: int, attentions: list[str], micros: list[int]) -> str:
    """A table column's name: the size, then the micro-batch count and attention where several are measured."""
    return ", ".join([size] + [f"{micro} micro"] * (len(micros) > 1) + [attention] * (len(attentions) > 1))


def compile_only(target: str) -> None:
    """--aot_target: the GRPO update of every size, micro-batch count and attention compiled for `target`."""
    devices = aot.target_devices(target, 1)
    s = SMOKE if _SMOKE.value else Settings()
    micros = [int(m) for m in _MICRO.value] or [s.micro]
    attentions = _attentions()
    print(f"compiling for {devices[0].device_kind} with XLA's GPU compiler on {platform.node()}", flush=True)
    columns: dict[str, dict[str, str]] = {}
    for size in ["toy"] if _SMOKE.value else _SIZES.value:
        for attention, micro in _grpo_variants(attentions, micros):
            cfg = model_config(size, attention, backend="gpu")
            columns[_column(size, attention, micro, attentions, micros)] = {
                "attention": cfg.attention, **compile_grpo(cfg, dataclasses.replace(s, micro=micro), devices)}
    _print_table(columns)


def _print_table(columns: dict[str, dict[str, str]]) -> None:
    names = list(dict.fromkeys(name for row in columns.values() for name in row))
    print("| metric | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name in names:
        print(f"| {name} | " + " | ".join(columns[size].get(name, "-") for size in columns) + " |", flush=True)


def main(argv: list[str]) -> None:
    del argv
    start = time.perf_counter()
    if _AOT_TARGET.value:
        compile_only(_AOT_TARGET.value)
        return
    device = jax.devices()[0]
    peak_flops, peak_bandwidth = next((v for k, v in PEAKS.items() if k in device.device_kind), (None, None))
    sizes = ["toy"] if _SMOKE.value else _SIZES.value
    unknown = sorted(set(sizes) - set(QWEN25))
    if unknown:
        raise app.UsageError(f"--sizes: unknown {unknown}; expected some of {sorted(QWEN25)}")
    s = SMOKE if _SMOKE.value else Settings()
    micros = [int(m) for m in _MICRO.value if m.isdigit()]
    if len(micros) < len(_MICRO.value) or any(m < 1 or s.rows % m for m in micros) or not set(_PARTS.value) <= {"grpo", "decode", "judge"}:
        raise app.UsageError(f"--micro={_MICRO.value} must divide the {s.rows} GRPO rows; --parts={_PARTS.value} "
                             "must be some of grpo, decode, judge")
    micros = micros or [s.micro]
    attentions = _attentions()
    print(f"{device.device_kind} ({jax.default_backend()}), jax {jax.__version__}, {platform.node()}, "
          f"load {os.getloadavg()[0]:.1f}, GRPO {s.rows}x({s.prompt}+{s.response}) in {s.micro} micro-batches, "
          f"decode {s.decode_batch}x{s.decode_prompt} prompt, steps {s.short}->{s.long}", flush=True)
    matmul_flops, copy_bandwidth = measured_ceilings(*((256, 2**22) if _SMOKE.value else (8192, 2**32)))
    print(f"measured: bf16 matmul {matmul_flops / 1e12:.1f} TFLOP/s, copy {copy_bandwidth / 1e12:.2f} TB/s", flush=True)
    columns: dict[str, dict[str, str]] = {}
    errors: list[str] = []
    for size in sizes:
        cfg = model_config(size)
        for attention, micro in _grpo_variants(attentions, micros):  # a column each; decode and the judge in the first
            column = _column(size, attention, micro, attentions, micros)
            columns[column] = row = {}
            if "grpo" in _PARTS.value:
                row |= _guarded(lambda: bench_grpo(model_config(size, attention), dataclasses.replace(s, micro=micro),
                                                   peak_flops), GRPO_CELLS, errors)
                print(f"{column}: GRPO done at {time.perf_counter() - start:.0f} s", flush=True)
        weights: list[loader.Weights] = []  # the decode weights, which the judge reuses

        def decode() -> dict[str, str]:
            cells, decode_weights = bench_decode(cfg, s, peak_bandwidth)
            weights.append(decode_weights)
            return cells

        first = columns[_column(size, attentions[0], micros[0], attentions, micros)]
        if "decode" in _PARTS.value:
            first |= _guarded(decode, (f"decode tokens/s (batch {s.decode_batch})", "decode step (ms)", "decode MBU"),
                              errors)
            print(f"{size}: decode done at {time.perf_counter() - start:.0f} s", flush=True)
        if weights and "judge" in _PARTS.value:
            first |= _guarded(lambda: bench_judge(weights[0], s),
                              (f"judge items/s (batched, {s.judge_items} items)", "judge batched / per-item"), errors)
        weights.clear()
        first["N (matmul params)"] = f"{matmul_params(cfg) / 1e9:.2f}B"
        print(f"{size}: done at {time.perf_counter() - start:.0f} s", flush=True)
        _print_table(columns)  # after every size: a lease that ends early still leaves the sizes done
    print(f"\nwall {time.perf_counter() - start:.0f} s, process CPU {time.process_time():.0f} s; "
          f"peaks: {'n/a' if peak_flops is None else f'{peak_flops / 1e12:.0f} TFLOP/s, {peak_bandwidth / 1e12:.2f} TB/s'}")
    if errors:
        raise SystemExit("measurements failed:\n" + "\n".join(errors))


if __name__ == "__main__":
    app.run(main)

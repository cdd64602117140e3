"""Sharded train steps on 8 simulated CPU devices == the unsharded step (fsdp-only and mixed meshes), and
the compiled steps really run as FSDP: activations stay sharded over the batch, never all-reduced."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_jax import grpo, hlo_stats, loader, sharding
from rubric_jax.models import transformer
from rubric_jax.models.checkpoint import abstract_model
from rubric_jax.models.config import ModelConfig
from rubric_jax.train import state as train_state
from rubric_jax.train import step as train_step

VOCAB, B, P, R, GROUP = 40, 8, 4, 6, 2
MODEL = ModelConfig(architecture="qwen2", vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=4, rope_theta=10000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, attention_bias=True, rope_scaling=None, max_position_embeddings=32)
# A large Adam eps keeps the first update a smooth function of the gradient (not ~sign(g)).
TX = train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=1e-2, eps=1e-3))
CFG = grpo.GRPOConfig(group_size=GROUP, kl_coef=0.04, clip_high=0.28)


def _close(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6), a, b)


@pytest.fixture(scope="module")
def unsharded():
    """Reference: the unsharded state, a batch, and the results of two GRPO steps and one SFT step."""
    state, shardings = train_state.init_train_state(MODEL, TX, jax.random.key(0))
    assert shardings is None
    rng = np.random.default_rng(1)
    prompt_mask = np.arange(P)[None, :] >= np.array([0, 2, 1, 3])[:, None]  # each group's prompt once
    response_mask = np.arange(R)[None, :] < np.array([6, 4, 2, 6, 5, 3, 6, 1])[:, None]
    batch = {"prompt_tokens": jnp.asarray(np.where(prompt_mask, rng.integers(1, VOCAB, (B // GROUP, P)), 0), jnp.int32),
             "prompt_mask": jnp.asarray(prompt_mask),
             "response_tokens": jnp.asarray(np.where(response_mask, rng.integers(1, VOCAB, (B, R)), 0), jnp.int32),
             "response_mask": jnp.asarray(response_mask), "loss_mask": jnp.asarray(response_mask),
             "advantages": grpo.group_advantages(jnp.asarray(rng.uniform(size=B), jnp.float32), GROUP)[0]}
    logprobs = train_step.jit_rollout_logprobs(state.graphdef, group_size=GROUP, temperature=CFG.temperature)
    logp = logprobs(state.params, *train_step.logprob_inputs(batch))
    shift = np.where(np.arange(R)[None, :] % 2 == 0, 0.3, -0.3).astype(np.float32)  # off-policy enough that both
    batch["old_logp"] = jnp.asarray(np.where(response_mask, np.asarray(logp) + shift, np.float32(0)))  # clip sides act
    ref = jax.jit(functools.partial(jax.tree.map, lambda x: x * 0.95))(state.params)  # one program, not one per leaf
    batch["ref_logp"] = logprobs(ref, *train_step.logprob_inputs(batch))
    init = _copy(state)
    step = train_step.jit_grpo_step(CFG)
    s1, m1 = step(_copy(state), batch)
    s2, m2 = step(s1, batch)
    s_sft, m_sft = train_step.jit_sft_step()(_copy(state), _sft(batch))
    return dict(state=init, batch=batch, ref=ref, grpo=(m1, m2, s2), sft=(m_sft, s_sft), logp=logp)


def _copy(tree):
    """A copy of every array in its own sharding (the steps donate their state), by transfer: jnp.copy compiled a
    program per leaf shape and sharding."""
    return jax.device_put(tree, may_alias=False)


def _sft(batch):
    """The GRPO rows as SFT sequences (host arrays): [prompt | response] (each row its group's prompt), trained on the
    response. Arrays go into shardings from the host (`jax.device_get` first): from one device, `jax.device_put`
    compiled a slicing program per leaf shape and sharding."""
    batch = jax.device_get(batch)
    prompts, mask = (np.repeat(batch[k], GROUP, axis=0) for k in ("prompt_tokens", "prompt_mask"))
    return {"tokens": np.concatenate([prompts, batch["response_tokens"]], axis=1),
            "input_mask": np.concatenate([mask, batch["response_mask"]], axis=1),
            "loss_mask": np.concatenate([np.zeros_like(mask), batch["loss_mask"]], axis=1)}


def _check_layout(state, shardings):
    """Every array of the state sits in exactly the sharding the plan asked for."""
    jax.tree.map(lambda x, s: _assert_sharding(x, s), state, shardings)


def _assert_sharding(x, want):
    assert x.sharding.is_equivalent_to(want, x.ndim), (x.sharding, want)


@pytest.mark.parametrize("mesh_cfg, micro_batches, attention", [
    (sharding.MeshConfig(data=1, fsdp=8, tensor=1), 1, "einsum"),
    (sharding.MeshConfig(data=2, fsdp=2, tensor=2), 2, "einsum"),
    # jax.nn.dot_product_attention (cuDNN's call, XLA's implementation) against the einsum reference, heads split
    # over tensor and each micro-batch's 2 prompts' tokens over the batch shards they leave idle.
    (sharding.MeshConfig(data=2, fsdp=2, tensor=2), 2, "xla"),
])
def test_sharded_grpo_and_sft_steps_match_unsharded(unsharded, mesh_cfg, micro_batches, attention):
    layout = sharding.Layout(sharding.make_mesh(mesh_cfg))
    mesh = layout.mesh
    model = MODEL.replace(attention=attention)
    if micro_batches == 1:
        state, shardings = train_state.init_train_state(model, TX, jax.random.key(0), layout)
        _close(state.params, unsharded["state"].params)  # sharded init draws the same weights
    else:  # existing params, placed explicitly (the state builder never moves them itself)
        placed = jax.device_put(jax.device_get(unsharded["state"].params), loader.expected_shardings(model, layout))
        state, shardings = train_state.new_train_state(loader.as_weights(model, placed, layout), TX, mesh)
    assert state.graphdef != unsharded["state"].graphdef  # the FSDP activation constraint is in the model
    _check_layout(state, shardings)
    embed = state.params["embed_tokens"]["embedding"]
    assert len(embed.sharding.device_set) == 8 and not embed.sharding.is_fully_replicated

    batch = jax.device_put(jax.device_get(unsharded["batch"]),  # explicit
                           train_step.batch_shardings(unsharded["batch"], mesh))
    ref = jax.device_put(jax.device_get(unsharded["ref"]), shardings.params)
    logprobs = train_step.jit_rollout_logprobs(state.graphdef, group_size=GROUP, temperature=CFG.temperature,
                                               micro_batches=micro_batches, param_shardings=shardings.params,
                                               mesh=mesh)
    logp = logprobs(state.params, *train_step.logprob_inputs(batch))
    ref_logp = logprobs(ref, *train_step.logprob_inputs(batch))
    _close(logp, unsharded["logp"])
    _close(ref_logp, batch["ref_logp"])
    _assert_sharding(ref_logp, sharding.batch_sharding(mesh))
    batch = {**batch, "ref_logp": ref_logp}

    step = train_step.jit_grpo_step(CFG, micro_batches=micro_batches, shardings=shardings, mesh=mesh)
    sft_state = _copy(state)
    s1, m1 = step(state, batch)
    s2, m2 = step(s1, batch)
    ref_m1, ref_m2, ref_s2 = unsharded["grpo"]
    assert float(ref_m1["clip_frac_low"]) > 0 and float(ref_m1["clip_frac_high"]) > 0 and float(ref_m2["kl"]) > 0
    for got, want in ((m1, ref_m1), (m2, ref_m2)):
        assert set(got) == set(want)
        for name in want:
            assert float(got[name]) == pytest.approx(float(want[name]), rel=1e-4, abs=1e-6), name
    _close(s2.params, ref_s2.params)
    _close(s2.opt_state, ref_s2.opt_state)
    _check_layout(s2, shardings)

    sft = train_step.jit_sft_step(micro_batches=micro_batches, shardings=shardings, mesh=mesh)
    s_sft, m_sft = sft(sft_state, jax.device_put(_sft(unsharded["batch"]), sharding.batch_sharding(mesh)))
    ref_m_sft, ref_s_sft = unsharded["sft"]
    assert float(m_sft["loss"]) == pytest.approx(float(ref_m_sft["loss"]), rel=1e-5)
    _close(s_sft.params, ref_s_sft.params)
    _check_layout(s_sft, shardings)


def _activation_all_reduces(compiled_text, batch, length):
    """All-reduces of an array with a [rows, length, ...] activation shape (bytes that scale with B x T;
    no parameter has a dimension of `length`)."""
    found = []
    for c in hlo_stats.collectives(compiled_text):
        shapes = [tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\[([0-9,]*)\]", c.shape)]
        if c.kind == "all-reduce" and any(len(s) >= 2 and s[0] <= batch and s[1] == length for s in shapes):
            found.append(c)
    return found


def _gathered_prefix_activations(compiled_text, rows, prompt_len, model):
    """All-gathers of the shared prompts' hidden states [U, P, D] or queries [U, P, N, H]: split along P in
    the training layout, they must stay split (only the prompts' keys/values are gathered, PREFIX_KV_AXES)."""
    activation_dims = ((model.hidden_size,), (model.num_heads, model.head_dim))
    found = []
    for c in hlo_stats.collectives(compiled_text):
        dims = [tuple(int(d) for d in m.split(",") if d) for m in re.findall(r"\[([0-9,]*)\]", c.shape)]
        if c.kind == "all-gather" and any(s[:1] <= (rows,) and s[1:2] == (prompt_len,) and s[2:] in activation_dims
                                          for s in dims if len(s) >= 3):
            found.append(c)
    return found


def _abstract_grpo_batch(b, p, r, mesh):
    """A GRPO batch of b rows (b // GROUP prompts of p tokens, responses of r) as ShapeDtypeStructs placed as the
    trainer places batches: what a step is lowered for."""
    spec = {k: jax.ShapeDtypeStruct(shape, dtype) for k, shape, dtype in
            (("prompt_tokens", (b // GROUP, p), jnp.int32), ("prompt_mask", (b // GROUP, p), bool),
             ("response_tokens", (b, r), jnp.int32),
             ("response_mask", (b, r), bool), ("loss_mask", (b, r), bool), ("old_logp", (b, r), jnp.float32),
             (train_step.REF_LOGP, (b, r), jnp.float32), ("advantages", (b,), jnp.float32))}
    placed = train_step.batch_shardings(spec, mesh)
    return {k: jax.ShapeDtypeStruct(spec[k].shape, spec[k].dtype, sharding=placed[k])
            for k in train_step.grpo_batch_keys(CFG)}


def test_compiled_steps_run_as_fsdp_without_activation_all_reduces():
    """GRPO and SFT steps of a small model on data 2 x fsdp 4: with the model's per-layer residual
    constraint (the training layout's), no all-reduce of [rows, T, ...] activations is left; the same
    model without it all-reduces activations inside the layer loop (what the 7B compile showed). The
    shared prompts' tokens, split over fsdp, are never gathered with the einsum attention this test compiles
    (the CPU's): their projections stay 3-D contractions (`_token_matmul(length_split=True)`; merged into U·P
    rows, the hidden states and queries were gathered). A fused kernel is another matter: cuDNN's partitioner
    refuses a split token axis, so on the GPU (`attention=auto` -> cudnn) each prompt's queries and keys /
    values are gathered whole along its length for the kernel (`FUSED_QUERY_AXES`): 672 query and 448 key/value
    gathers, 21.9 GiB per 7B update, asserted by tests/test_aot.py's GPU-compiler test."""
    b, t = 16, 128
    layout = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=4, tensor=1)))
    model = MODEL.replace(hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8,
                          vocab_size=64, max_position_embeddings=t)
    # Lowered from the abstract state (ShapeDtypeStructs in their shardings, as aot.py lowers): the same programs
    # as from an initialised one, without compiling and running the init.
    state, shardings = train_state.abstract_train_state(loader.abstract_weights(model, layout), TX, layout.mesh)
    unconstrained = state.replace(graphdef=abstract_model(model)[0])
    p, r = 40, 88  # the GRPO rows: [prompt | response] of t tokens, as the SFT rows (no parameter has a
    # dimension of 40 or 88); a micro-batch's 4 prompts leave fsdp free for their length
    grpo_batch = _abstract_grpo_batch(b, p, r, layout.mesh)
    sft_batch = {k: jax.ShapeDtypeStruct((b, t), dtype) for k, dtype in
                 (("tokens", jnp.int32), ("input_mask", bool), ("loss_mask", bool))}
    counts = {}
    for name, s in (("fsdp", state), ("unconstrained", unconstrained)):
        s_shardings = shardings.replace(graphdef=s.graphdef)
        grpo_step = train_step.jit_grpo_step(CFG, micro_batches=2, shardings=s_shardings, mesh=layout.mesh)
        sft_step = train_step.jit_sft_step(micro_batches=2, shardings=s_shardings, mesh=layout.mesh)
        grpo_hlo = grpo_step.lower(s, grpo_batch).compile().as_text()
        sft_hlo = sft_step.lower(s, sft_batch).compile().as_text()
        grpo_found = _activation_all_reduces(grpo_hlo, b, p) + _activation_all_reduces(grpo_hlo, b, r)
        counts[name] = (len(grpo_found), len(_activation_all_reduces(sft_hlo, b, t)))
        if name == "fsdp":
            assert _gathered_prefix_activations(grpo_hlo, b, p, model) == []
    assert counts["unconstrained"][0] > 0 and counts["unconstrained"][1] > 0, counts
    assert counts["fsdp"] == (0, 0), counts


def _fsdp8_grpo_compile_log(capfd) -> str:
    """XLA's log while compiling a GRPO step on fsdp 8 whose micro-batches hold 4 prompts (the 7B update's shape:
    fewer prompts than devices, so the prompts' length is split)."""
    b, p, r = 32, 64, 24
    layout = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=8, tensor=1)))
    model = MODEL.replace(hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8,
                          vocab_size=64, max_position_embeddings=128)
    state, shardings = train_state.abstract_train_state(loader.abstract_weights(model, layout), TX, layout.mesh)
    batch = _abstract_grpo_batch(b, p, r, layout.mesh)
    capfd.readouterr()
    train_step.jit_grpo_step(CFG, micro_batches=b // GROUP // 4, shardings=shardings, mesh=layout.mesh).lower(
        state, batch).compile()
    return capfd.readouterr().err


def test_prompt_ids_split_like_their_states_compile_without_full_rematerialization(capfd, monkeypatch):
    """The prompts' token ids take their residual stream's layout (transformer.PREFIX_TOKEN_AXES, split along the
    prompt length) before the embedding: XLA's partitioner then has no reshard from a length split into a prompt
    split to give up on. The control, compiled second (an identical program would come from the compile cache,
    silent), ids left unconstrained as before, logs the warning the 7B dry run logged (benchmarks/AOT_RESULTS.md):
    proof that this process shows XLA's warnings."""
    assert "Involuntary full rematerialization" not in _fsdp8_grpo_compile_log(capfd)
    shard = transformer.Transformer._shard
    monkeypatch.setattr(transformer.Transformer, "_shard", lambda self, x, axes=transformer.RESIDUAL_AXES:
                        x if axes == transformer.PREFIX_TOKEN_AXES else shard(self, x, axes))
    assert "Involuntary full rematerialization" in _fsdp8_grpo_compile_log(capfd)

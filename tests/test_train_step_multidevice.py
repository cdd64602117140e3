"""Sharded train steps on 8 simulated CPU devices == the unsharded step (fsdp-only and mixed meshes)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_jax import grpo, sharding
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.transformer import Transformer
from rubric_jax.train import state as train_state
from rubric_jax.train import step as train_step

VOCAB, B, T = 40, 8, 10
MODEL = ModelConfig(architecture="qwen2", vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=4, rope_theta=10000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, attention_bias=True, rope_scaling=None, max_position_embeddings=32)
# A large Adam eps keeps the first update a smooth function of the gradient (not ~sign(g)).
TX = train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=1e-2, eps=1e-3))
CFG = grpo.GRPOConfig(group_size=2, kl_coef=0.04, clip_high=0.28)


def _factory(rngs):
    return Transformer(MODEL, rngs=rngs)


def _close(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6), a, b)


@pytest.fixture(scope="module")
def unsharded():
    """Reference: the unsharded state, a batch, and the results of two GRPO steps and one SFT step."""
    state, shardings = train_state.init_train_state(_factory, TX, jax.random.key(0))
    assert shardings is None
    k1, k2 = jax.random.split(jax.random.key(1))
    pos = jnp.arange(T)[None, :]
    input_mask = (pos >= jnp.array([0, 2, 1, 0, 3, 0, 1, 2])[:, None]) & (pos < jnp.array([10, 8, 6, 9, 10, 7, 10, 5])[:, None])
    batch = {"tokens": jnp.where(input_mask, jax.random.randint(k1, (B, T), 1, VOCAB), 0),
             "input_mask": input_mask, "loss_mask": input_mask & (pos >= 3),
             "advantages": grpo.group_advantages(jax.random.uniform(k2, (B,)), 2)[0]}
    logprobs = train_step.jit_sequence_logprobs(state.graphdef, temperature=CFG.temperature)
    logp = logprobs(state.params, batch["tokens"], input_mask)
    shift = jnp.where(pos % 2 == 0, 0.3, -0.3)  # off-policy enough that both clip sides are active
    batch["old_logp"] = jnp.where(batch["loss_mask"], logp + shift, 0.0)
    ref = jax.tree.map(lambda x: x * 0.95, state.params)
    batch["ref_logp"] = logprobs(ref, batch["tokens"], input_mask)
    init = jax.tree.map(jnp.copy, state)
    step = train_step.jit_grpo_step(CFG)
    s1, m1 = step(jax.tree.map(jnp.copy, state), batch)
    s2, m2 = step(s1, batch)
    sft_batch = {k: batch[k] for k in train_step.SFT_BATCH_KEYS}
    s_sft, m_sft = train_step.jit_sft_step()(jax.tree.map(jnp.copy, state), sft_batch)
    return dict(state=init, batch=batch, ref=ref, grpo=(m1, m2, s2), sft=(m_sft, s_sft), logp=logp)


def _check_layout(state, shardings):
    """Every array of the state sits in exactly the sharding the plan asked for."""
    jax.tree.map(lambda x, s: _assert_sharding(x, s), state, shardings)


def _assert_sharding(x, want):
    assert x.sharding.is_equivalent_to(want, x.ndim), (x.sharding, want)


@pytest.mark.parametrize("mesh_cfg, micro_batches", [
    (sharding.MeshConfig(data=1, fsdp=8, tensor=1), 1),
    (sharding.MeshConfig(data=2, fsdp=2, tensor=2), 2),
])
def test_sharded_grpo_and_sft_steps_match_unsharded(unsharded, mesh_cfg, micro_batches):
    mesh = sharding.make_mesh(mesh_cfg)
    if micro_batches == 1:
        state, shardings = train_state.init_train_state(_factory, TX, jax.random.key(0), mesh)
        _close(state.params, unsharded["state"].params)  # sharded init draws the same weights
    else:
        abstract_nnx = train_state.abstract_model(_factory)[1]
        shardings = train_state.state_shardings(abstract_nnx, unsharded["state"], mesh)
        state = train_state.train_state_from_params(unsharded["state"].graphdef, unsharded["state"].params, TX,
                                                    jax.random.key(0), shardings)
    _check_layout(state, shardings)
    embed = state.params["embed_tokens"]["embedding"]
    assert len(embed.sharding.device_set) == 8 and not embed.sharding.is_fully_replicated

    batch = unsharded["batch"]
    ref = jax.device_put(unsharded["ref"], shardings.params)
    logprobs = train_step.jit_sequence_logprobs(state.graphdef, temperature=CFG.temperature,
                                                micro_batches=micro_batches, param_shardings=shardings.params,
                                                mesh=mesh)
    logp = logprobs(state.params, batch["tokens"], batch["input_mask"])
    ref_logp = logprobs(ref, batch["tokens"], batch["input_mask"])
    _close(logp, unsharded["logp"])
    _close(ref_logp, batch["ref_logp"])
    _assert_sharding(ref_logp, sharding.batch_sharding(mesh))
    batch = {**batch, "ref_logp": ref_logp}

    step = train_step.jit_grpo_step(CFG, micro_batches=micro_batches, shardings=shardings, mesh=mesh)
    sft_state = jax.tree.map(jnp.copy, state)
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
    s_sft, m_sft = sft(sft_state, {k: batch[k] for k in train_step.SFT_BATCH_KEYS})
    ref_m_sft, ref_s_sft = unsharded["sft"]
    assert float(m_sft["loss"]) == pytest.approx(float(ref_m_sft["loss"]), rel=1e-5)
    _close(s_sft.params, ref_s_sft.params)
    _check_layout(s_sft, shardings)

"""Train state, optimizer and the jitted GRPO / SFT steps on a tiny model (single device)."""

import functools
import math
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rubric_jax import grpo
from rubric_jax.models.accumulating_layers import AccumulatingLayers
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.checkpoint import abstract_model
from rubric_jax.models.transformer import unstack_layers
from rubric_jax.train import state as train_state
from rubric_jax.train import step as train_step

VOCAB, B, P, R, GROUP = 37, 8, 4, 8, 2


def _model_cfg(**kw):
    fields = dict(architecture="qwen2", vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_layers=2,
                  num_heads=2, num_kv_heads=1, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=True, rope_scaling=None, max_position_embeddings=64)
    return ModelConfig(**{**fields, **kw})


def _tx(lr=1e-2, **opt):
    return train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=lr, **opt))


@pytest.fixture(scope="module")
def state0():
    """One random init for the whole module (tests take copies: the jitted steps donate the state)."""
    return train_state.init_train_state(_model_cfg(), _tx(), jax.random.key(0))[0]


def _with_tx(state, tx, graphdef=None):
    """A step-0 state with the same params and another optimizer (or model graphdef)."""
    return train_state.train_state_from_params(graphdef or state.graphdef, _copy(state.params), tx)


@pytest.fixture(scope="module")
def batch0(state0):
    """4 prompts of 4, 3, 1 and 2 real tokens (left-padded to 4), 2 responses each of 1-8 tokens (right-padded
    to 8), behaviour log-probs = the policy's; each group's prompt once."""
    rng = np.random.default_rng(1)
    prompt_mask = np.arange(P)[None, :] >= np.array([0, 1, 3, 2])[:, None]
    prompt_tokens = np.where(prompt_mask, rng.integers(1, VOCAB, (B // GROUP, P)), 0)
    response_mask = np.arange(R)[None, :] < np.array([8, 5, 2, 8, 6, 1, 4, 7])[:, None]
    batch = {"prompt_tokens": jnp.asarray(prompt_tokens, jnp.int32), "prompt_mask": jnp.asarray(prompt_mask),
             "response_tokens": jnp.asarray(np.where(response_mask, rng.integers(1, VOCAB, (B, R)), 0), jnp.int32),
             "response_mask": jnp.asarray(response_mask), "loss_mask": jnp.asarray(response_mask),
             "advantages": grpo.group_advantages(jnp.asarray(rng.uniform(size=B), jnp.float32), GROUP)[0]}
    return {**batch, "old_logp": _logprobs(state0.params, batch)}


def _with_ref(batch, ref_params):
    """The batch with the reference log-probs a rollout adds when β > 0."""
    return {**batch, "ref_logp": _logprobs(ref_params, batch)}


SGD = optax.sgd(0.5)  # one object, so states built with it share compiled steps
KL_CFG = grpo.GRPOConfig(group_size=GROUP, kl_coef=0.05, clip_low=0.2, clip_high=0.28, loss_aggregation="token_mean")


@functools.lru_cache(maxsize=None)
def _grpo_step(cfg, micro_batches):
    """Jitted GRPO steps shared by the tests of this module (each compiles once per optimizer)."""
    return train_step.jit_grpo_step(cfg, micro_batches=micro_batches)


@pytest.fixture(scope="module")
def grpo_step():
    """The plain GRPO step (β = 0, one micro-batch)."""
    return _grpo_step(grpo.GRPOConfig(group_size=GROUP, kl_coef=0.0), 1)


@functools.lru_cache(maxsize=None)
def _logprobs_fn():
    return train_step.jit_rollout_logprobs(abstract_model(_model_cfg())[0], group_size=GROUP, temperature=1.0)


def _logprobs(params, batch):
    """Teacher-forced response log-probs of the module's model (the function rollouts use for ref/old log-probs)."""
    return _logprobs_fn()(params, *train_step.logprob_inputs(batch))


@functools.lru_cache(maxsize=None)
def _row_logprobs_fn():
    graphdef = abstract_model(_model_cfg())[0]
    return jax.jit(lambda p, t, m: grpo.sequence_logprobs(nnx.merge(graphdef, p), t, m, chunk_size=256,
                                                          temperature=1.0)[0])


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


def _sft(batch):
    """The GRPO batch's rows as SFT sequences: [prompt | response] (each row its group's prompt), trained on the
    response."""
    prompts, mask = (jnp.repeat(batch[k], GROUP, axis=0) for k in ("prompt_tokens", "prompt_mask"))
    return {"tokens": jnp.concatenate([prompts, batch["response_tokens"]], axis=1),
            "input_mask": jnp.concatenate([mask, batch["response_mask"]], axis=1),
            "loss_mask": jnp.concatenate([jnp.zeros_like(mask), batch["loss_mask"]], axis=1)}


def _assert_trees_close(a, b, rtol=1e-5, atol=1e-7):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


# --------------------------------------------------------------------------------- optimizer


def test_schedules_hand_computed():
    sched = train_state.make_schedule(train_state.OptimizerConfig(learning_rate=1e-3, warmup_steps=4))
    np.testing.assert_allclose([sched(i) for i in (0, 2, 4, 100)], [0.0, 5e-4, 1e-3, 1e-3], rtol=1e-6)
    sched = train_state.make_schedule(train_state.OptimizerConfig(
        learning_rate=1e-3, warmup_steps=2, schedule="cosine", total_steps=12, min_lr_ratio=0.1))
    # Half-way through the 10 decay steps the cosine is at the mid point of peak and floor.
    np.testing.assert_allclose([sched(1), sched(2), sched(7), sched(12)], [5e-4, 1e-3, 5.5e-4, 1e-4], rtol=1e-5)


def test_current_lr_reports_the_rate_each_update_used():
    tx = train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=1.0, warmup_steps=4, max_grad_norm=1e9))
    params = {"w": jnp.ones(3)}
    opt_state = tx.init(params)
    for expected in (0.0, 0.25, 0.5):
        updates, opt_state = tx.update({"w": jnp.ones(3)}, opt_state, params)
        assert float(train_state.current_lr(opt_state)) == pytest.approx(expected)
        assert float(-updates["w"][0]) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("kw, field", [
    ({"learning_rate": 0.0}, "learning_rate"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"schedule": "linear"}, "schedule"),
    ({"schedule": "cosine"}, "total_steps"),
    ({"schedule": "cosine", "warmup_steps": 5, "total_steps": 5}, "total_steps"),
    ({"total_steps": 10}, "total_steps"),
    ({"min_lr_ratio": 2.0}, "min_lr_ratio"),
    ({"b2": 1.0}, "b2"),
    ({"max_grad_norm": 0.0}, "max_grad_norm"),
])
def test_optimizer_config_rejects_bad_values(kw, field):
    with pytest.raises(ValueError, match=f"OptimizerConfig.{field}="):
        train_state.OptimizerConfig(**kw)


def test_init_requires_float32_master_weights():
    with pytest.raises(ValueError, match="param_dtype='float32'"):
        train_state.init_train_state(_model_cfg(param_dtype="bfloat16"), _tx(), jax.random.key(0))


def _leaf(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def test_state_layout(state0):
    assert state0.step.dtype == jnp.int32 and int(state0.step) == 0
    assert _leaf(state0.params, ("layers", "self_attn", "q_proj", "kernel")).shape == (2, 16, 2, 8)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state0.params))
    assert float(train_state.current_lr(state0.opt_state)) == pytest.approx(1e-2)
    assert train_state.current_lr(optax.sgd(1.0).init(state0.params)) is None


def test_weight_decay_skips_norms_and_biases(state0):
    tx = _tx(lr=0.1, weight_decay=0.5)
    zero_grads = jax.tree.map(jnp.zeros_like, state0.params)
    updates, opt_state = jax.jit(tx.update)(zero_grads, tx.init(state0.params), state0.params)
    assert float(train_state.current_lr(opt_state)) == pytest.approx(0.1)
    for path in (("layers", "self_attn", "q_proj", "kernel"), ("lm_head", "kernel"), ("embed_tokens", "embedding")):
        np.testing.assert_allclose(_leaf(updates, path), -0.1 * 0.5 * _leaf(state0.params, path), rtol=1e-6)
    for path in (("layers", "self_attn", "q_proj", "bias"), ("norm", "scale"), ("layers", "input_layernorm", "scale")):
        np.testing.assert_array_equal(_leaf(updates, path), 0.0)


def test_sft_loss_decreases_and_matches_masked_nll(state0, batch0):
    state = _copy(state0)
    batch = _sft(batch0)
    logp = _row_logprobs_fn()(state.params, batch["tokens"], batch["input_mask"])
    mask = batch["loss_mask"]
    expected = -float(jnp.sum(jnp.where(mask, logp, 0.0)) / mask.sum())
    step = train_step.jit_sft_step()
    losses = []
    for _ in range(8):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert int(metrics["num_tokens"]) == int(mask.sum())
    assert losses[-1] < losses[0] - 0.5 and all(b < a for a, b in zip(losses, losses[1:]))
    assert int(state.step) == 8


def test_grpo_loss_decreases_and_moves_towards_positive_advantages(state0, batch0):
    state = _with_tx(state0, SGD)
    mask = batch0["loss_mask"]

    def seq_logp(s):
        return jnp.sum(jnp.where(mask, _logprobs(s.params, batch0), 0.0), axis=1)

    before = seq_logp(state)
    losses = []
    batch = _with_ref(batch0, state0.params)
    for _ in range(4):
        state, metrics = _grpo_step(KL_CFG, 1)(state, batch)
        losses.append(float(metrics["loss"]))
    gain = seq_logp(state) - before
    adv = batch0["advantages"]
    assert losses[-1] < losses[0]
    assert float(jnp.mean(gain[adv > 0])) > float(jnp.mean(gain[adv < 0]))
    assert float(metrics["kl"]) > 0 and 0 <= float(metrics["clip_frac"]) <= 1 and int(metrics["skipped"]) == 0


# The entropy bonus at a rollout temperature of 0.5: one program for both entropy tests (the bonus does not change
# the logged entropy, which is the policy's before the update).
ENTROPY_CFG = grpo.GRPOConfig(group_size=GROUP, kl_coef=0.0, temperature=0.5, entropy_coef=10.0)


@functools.lru_cache(maxsize=None)
def _row_entropy_fn(temperature):
    graphdef = abstract_model(_model_cfg())[0]
    return jax.jit(lambda p, t, m: grpo.sequence_logprobs(nnx.merge(graphdef, p), t, m, chunk_size=256,
                                                          temperature=temperature)[1])


def _expected_entropy(params, batch, temperature):
    """Token mean over the trained response tokens of the full-distribution entropy of softmax(logits / T), from
    the per-row forward (`grpo.sequence_logprobs`, not the step's shared-prompt one)."""
    rows = _sft(batch)
    entropy = _row_entropy_fn(temperature)(params, rows["tokens"], rows["input_mask"])[:, P:]
    return float(jnp.sum(jnp.where(batch["loss_mask"], entropy, 0.0)) / batch["loss_mask"].sum())


def test_entropy_metric_is_the_policy_entropy_at_the_rollout_temperature(state0, batch0, grpo_step):
    """`entropy`, logged every step, is the token-mean entropy of the sampled tokens' distributions softmax(z / T):
    it follows the logits' temperature (lower T, sharper, lower entropy)."""
    found = {}
    for temperature, step, state in ((1.0, grpo_step, _copy(state0)),
                                     (0.5, _grpo_step(ENTROPY_CFG, 1), _with_tx(state0, SGD))):
        _, metrics = step(state, batch0)
        found[temperature] = float(metrics["entropy"])
        assert found[temperature] == pytest.approx(_expected_entropy(state0.params, batch0, temperature), rel=1e-5)
    assert 0 < found[0.5] < found[1.0] - 1e-3 and found[1.0] < math.log(VOCAB)  # a near-uniform random init


def test_entropy_bonus_raises_the_policy_entropy(state0, batch0, grpo_step):
    """rl.entropy_coef: with zero advantages the only gradient is the bonus's, −α·∇H (aggregated as the loss), so
    an SGD step raises the logged entropy; without the bonus the same batch gives a zero gradient."""
    batch = {**batch0, "advantages": jnp.zeros_like(batch0["advantages"])}
    step = _grpo_step(ENTROPY_CFG, 1)
    state, first = step(_with_tx(state0, SGD), batch)
    _, second = step(state, batch)
    assert float(second["entropy"]) > float(first["entropy"]) + 1e-3
    # seq_mean_token_mean: the bonus is the mean over rows of each row's token-mean entropy, the loss −α times it.
    assert float(first["loss"]) == pytest.approx(-10.0 * float(first["entropy_bonus"]), rel=1e-6)
    _, plain = grpo_step(_copy(state0), batch)
    assert float(plain["grad_norm"]) == 0.0 and float(first["grad_norm"]) > 0 and "entropy_bonus" not in plain


def test_nan_loss_skips_update_and_keeps_state(state0, batch0, grpo_step):
    state = _copy(state0)
    bad = {**batch0, "advantages": batch0["advantages"].at[3].set(jnp.nan)}
    state, metrics = grpo_step(state, bad)
    assert int(metrics["skipped"]) == 1 and not np.isfinite(float(metrics["loss"]))
    jax.tree.map(np.testing.assert_array_equal, (state.params, state.opt_state), (state0.params, state0.opt_state))
    assert int(state.step) == 1
    state, metrics = grpo_step(state, batch0)
    assert int(metrics["skipped"]) == 0 and int(state.step) == 2
    assert not np.array_equal(state.params["norm"]["scale"], state0.params["norm"]["scale"])


def test_gradient_accumulation_equals_one_big_batch(state0, batch0):
    # Plain SGD so the new params expose the summed gradient itself (Adam's first step is ~sign(g)).
    state = _with_tx(state0, SGD)
    batch = _with_ref(batch0, jax.tree.map(lambda x: x * 0.9, state0.params))
    s1, m1 = _grpo_step(KL_CFG, 1)(_copy(state), batch)
    assert "lr" not in m1  # sgd records no learning rate
    # 4 micro-batches of one group; 8 of one row each: every group split in 2, its prompt run once per part.
    for micro in (4, 8):
        s_m, m_m = _grpo_step(KL_CFG, micro)(_copy(state), batch)
        _assert_trees_close(s_m.params, s1.params, rtol=1e-5, atol=1e-7)
        for name in ("loss", "kl", "grad_norm", "entropy", "clip_frac", "num_tokens", "abs_log_ratio"):
            assert float(m_m[name]) == pytest.approx(float(m1[name]), rel=1e-5, abs=1e-7)
    split_logprobs = train_step.jit_rollout_logprobs(state0.graphdef, group_size=GROUP, temperature=1.0, micro_batches=8)
    np.testing.assert_allclose(split_logprobs(state0.params, *train_step.logprob_inputs(batch0)), batch0["old_logp"],
                               rtol=1e-5, atol=1e-6)


def test_padding_does_not_change_the_update(state0, batch0):
    """4 more response slots (masked, holding garbage) and 3 more left-padding prompt slots: same update."""
    def pad(x, value, width=4, left=False):
        extra = jnp.full((x.shape[0], width), value, x.dtype)
        return jnp.concatenate([extra, x] if left else [x, extra], axis=1)

    batch = _with_ref(batch0, state0.params)
    padded = {"prompt_tokens": pad(batch["prompt_tokens"], 0, 3, True),
              "prompt_mask": pad(batch["prompt_mask"], False, 3, True),
              "response_tokens": pad(batch["response_tokens"], 5), "response_mask": pad(batch["response_mask"], False),
              "loss_mask": pad(batch["loss_mask"], True), "old_logp": pad(batch["old_logp"], -3.0),
              "ref_logp": pad(batch["ref_logp"], 40.0), "advantages": batch["advantages"]}
    state = _with_tx(state0, SGD)
    s_a, m_a = _grpo_step(KL_CFG, 1)(_copy(state), batch)
    s_b, m_b = _grpo_step(KL_CFG, 1)(_copy(state), padded)
    for name in ("loss", "kl", "entropy", "grad_norm"):
        assert float(m_b[name]) == pytest.approx(float(m_a[name]), rel=1e-5, abs=1e-8)
    assert int(m_b["num_tokens"]) == int(m_a["num_tokens"])
    _assert_trees_close(s_b.params, s_a.params, rtol=1e-5, atol=1e-7)


def test_the_step_runs_only_the_policy_forward_and_compiles_once(monkeypatch, state0, batch0):
    traced = []
    real = grpo.shared_prompt_logprobs

    def counting(model, prompt, *args, **kwargs):
        traced.append(prompt.shape)
        return real(model, prompt, *args, **kwargs)

    monkeypatch.setattr(grpo, "shared_prompt_logprobs", counting)
    step = train_step.jit_grpo_step(grpo.GRPOConfig(group_size=GROUP, kl_coef=0.0), micro_batches=2)
    state = _with_tx(state0, SGD)
    state, metrics = step(state, batch0)
    policy_only = len(traced)
    assert policy_only > 0 and "kl" not in metrics
    assert set(traced) == {(B // GROUP // 2, P)}  # each micro-batch runs its 2 groups' prompts once
    for _ in range(3):
        state, metrics = step(state, _copy(batch0))
    assert len(traced) == policy_only and step._cache_size() == 1  # no retrace across steps

    # With β > 0 the reference log-probs come in the batch: the traced step has no second forward.
    traced.clear()
    cfg_kl = grpo.GRPOConfig(group_size=GROUP, kl_coef=0.01)
    with_ref = {**batch0, "ref_logp": batch0["old_logp"]}
    train_step.jit_grpo_step(cfg_kl, micro_batches=2).trace(state, with_ref)
    assert len(traced) == policy_only
    with pytest.raises(ValueError, match="expected exactly.*ref_logp"):
        train_step.jit_grpo_step(cfg_kl).trace(state, batch0)  # β > 0 needs the reference log-probs
    with pytest.raises(ValueError, match="expected exactly"):
        step.trace(state, with_ref)  # β = 0 computes none: a batch that carries them is a caller's mistake


def test_bad_batches_are_rejected(state0, batch0, grpo_step):
    with pytest.raises(ValueError, match=r"micro_batches=3 must be >= 1 and divide the 4 groups of 2 rows, or split "
                                         r"each group into equal parts that they divide"):
        train_step.jit_grpo_step(grpo.GRPOConfig(group_size=GROUP, kl_coef=0.0), micro_batches=3).trace(state0, batch0)
    with pytest.raises(ValueError, match="8 rows are not whole groups of group_size=3"):
        train_step.jit_grpo_step(grpo.GRPOConfig(group_size=3, kl_coef=0.0)).trace(state0, batch0)
    with pytest.raises(ValueError, match="expected exactly"):
        grpo_step.trace(state0, _sft(batch0))
    with pytest.raises(ValueError, match=r"batch\['loss_mask'\] has dtype int32"):
        grpo_step.trace(state0, {**batch0, "loss_mask": batch0["loss_mask"].astype(jnp.int32)})
    with pytest.raises(ValueError, match=r"batch\['advantages'\] has shape"):
        grpo_step.trace(state0, {**batch0, "advantages": jnp.zeros(B + 1)})
    with pytest.raises(ValueError, match=r"batch\['prompt_mask'\] has shape \(4, 3\), expected \(4, 4\)"):
        grpo_step.trace(state0, {**batch0, "prompt_mask": batch0["prompt_mask"][:, 1:]})
    with pytest.raises(ValueError, match="micro_batches=3"):
        train_step.jit_rollout_logprobs(state0.graphdef, group_size=GROUP, temperature=1.0, micro_batches=3).trace(
            state0.params, *train_step.logprob_inputs(batch0))


def test_bf16_compute_keeps_float32_state(state0, batch0, grpo_step):
    graphdef, _ = abstract_model(_model_cfg(compute_dtype="bfloat16"))
    state = _with_tx(state0, state0.tx, graphdef)
    state, metrics = grpo_step(state, batch0)
    assert int(metrics["skipped"]) == 0 and np.isfinite(float(metrics["loss"]))
    floats = [x.dtype for x in jax.tree.leaves((state.params, state.opt_state)) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert set(floats) == {jnp.dtype(jnp.float32)}


def test_accumulating_layers_add_their_gradient_to_the_given_one(state0, batch0):
    """`AccumulatingLayers(compute, grads)`: the layers compute with `compute` and the gradient of the model's layer
    weights comes out as `grads` plus this forward's, added layer by layer in the backward (GRPO's shared-prompt
    forward and SFT's plain one); the other parameters' gradients are as without it."""
    graphdef, _ = abstract_model(_model_cfg(remat=True))
    params = _copy(state0.params)
    keys = iter(jax.random.split(jax.random.key(3), 100))
    grads0 = jax.tree.map(lambda a: jax.random.normal(next(keys), a.shape, a.dtype), params["layers"])
    sft = _sft(batch0)
    forwards = ((lambda model, into: grpo.shared_prompt_logprobs(model, *train_step.logprob_inputs(batch0), chunk_size=8,
                                                                temperature=1.0, into=into)[0],
                 batch0["response_tokens"].shape[1]),
                (lambda model, into: grpo.sequence_logprobs(model, sft["tokens"], sft["input_mask"], chunk_size=8,
                                                           temperature=1.0, into=into)[0], sft["tokens"].shape[1]))
    per_layer = unstack_layers(params, 2)["layers"]
    for forward, tokens in forwards:
        def loss(p, into):
            logp = forward(nnx.merge(graphdef, p), into)
            return jnp.sum(logp * jnp.linspace(0.5, 1.5, logp.shape[-1])[None])

        plain = jax.jit(jax.grad(loss))(params, None)
        # The stacked weights (a loop slices them), one tree per layer (unrolled, each read in place: a program
        # XLA fuses differently, up to 7e-7 apart in the embedding's gradient), and the latter with the head's
        # projection made outside (read in place of the head's own cast).
        head = nnx.merge(graphdef, params).vocab_projection(grpo.vocab_slices(VOCAB, tokens, 8))
        for given, atol in ((AccumulatingLayers(params["layers"], grads0), 1e-7),
                            (AccumulatingLayers(per_layer, grads0), 1e-6),
                            (AccumulatingLayers(per_layer, grads0, head), 1e-6)):
            into = jax.jit(jax.grad(loss))(params, given)
            _assert_trees_close(into["layers"], jax.tree.map(jnp.add, grads0, plain["layers"]), rtol=1e-5, atol=1e-6)
            _assert_trees_close({k: v for k, v in into.items() if k != "layers"},
                                {k: v for k, v in plain.items() if k != "layers"}, rtol=1e-5, atol=atol)


def test_bf16_full_remat_update_equals_the_stacked_gradient_one(state0, batch0):
    """bf16 compute under full remat (the layers' backward adds into the float32 accumulator) gives the update of
    remat_policy="dots" (each micro-batch's layer gradients stacked, then added), in 1 and 2 micro-batches, within
    bf16 rounding (the two programs round the bf16 gradients at different places: up to 3.5e-5 apart here); the
    layers scanned (their bf16 copy stacked) or unrolled (one copy per layer, `train/step.py` `_per_layer`)."""
    batch = _with_ref(batch0, jax.tree.map(lambda x: x * 0.9, state0.params))
    for micro, scan in ((1, True), (2, True), (2, False)):
        states = [_grpo_step(KL_CFG, micro)(_with_tx(state0, SGD, abstract_model(_model_cfg(
            compute_dtype="bfloat16", remat=True, remat_policy=policy, scan_layers=scan))[0]), batch)[0]
            for policy in ("full", "dots")]
        _assert_trees_close(states[0].params, states[1].params, rtol=0, atol=1e-4)


def test_train_state_from_params_starts_at_step_zero(state0):
    again = _with_tx(state0, state0.tx)
    assert int(again.step) == 0 and jax.tree.structure(again.opt_state) == jax.tree.structure(state0.opt_state)
    jax.tree.map(np.testing.assert_array_equal, again.params, state0.params)
    assert again.graphdef == state0.graphdef

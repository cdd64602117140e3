"""GRPO maths: hand-computed cases, finite differences in float64, and invariants."""

import functools
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_jax import grpo
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.transformer import causal_padding_mask, padding_to_positions
from tests.random_model import random_model


def _cfg(**kw):
    return grpo.GRPOConfig(**{"group_size": 2, "kl_coef": 0.0, **kw})


# --------------------------------------------------------------------------------- config validation


def test_config_defaults_follow_rubricrl():
    cfg = grpo.GRPOConfig()
    assert cfg.group_size == 8 and 0.01 <= cfg.kl_coef <= 0.05 and cfg.kl_estimator == "k3"
    assert 0.2 <= cfg.clip_low <= 0.3 and cfg.loss_aggregation == "seq_mean_token_mean"


@pytest.mark.parametrize("kw, field", [
    ({"kl_coef": -0.1}, "kl_coef"),
    ({"kl_coef": float("nan")}, "kl_coef"),
    ({"kl_estimator": "k4"}, "kl_estimator"),
    ({"clip_low": -0.1}, "clip_low"),
    ({"clip_low": 1.0}, "clip_low"),
    ({"clip_low": 0.3, "clip_high": 0.2}, "clip_high"),
    ({"advantage_scaling": "std"}, "advantage_scaling"),
    ({"advantage_eps": 0.0}, "advantage_eps"),
    ({"loss_aggregation": "mean"}, "loss_aggregation"),
    ({"loss_aggregation": "seq_mean_token_sum_norm"}, "loss_norm_length"),
    ({"loss_norm_length": 128}, "loss_norm_length"),
    ({"logprob_chunk_size": 0}, "logprob_chunk_size"),
    ({"advantage_eps": float("nan")}, "advantage_eps"),
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
])
def test_config_rejects_bad_values(kw, field):
    with pytest.raises(ValueError, match=f"GRPOConfig.{field}="):
        grpo.GRPOConfig(**kw)


def test_config_accepts_dapo_and_dr_grpo():
    grpo.GRPOConfig(clip_low=0.2, clip_high=0.28, loss_aggregation="token_mean")
    grpo.GRPOConfig(advantage_scaling="none", loss_aggregation="seq_mean_token_sum_norm", loss_norm_length=512)


# --------------------------------------------------------------------------------- advantages


def test_group_advantages_hand_computed():
    rewards = jnp.array([1.0, 2.0, 3.0, 4.0, 0.5, 0.5, 0.5, 0.5])
    adv, zero_frac = grpo.group_advantages(rewards, 4, scaling="group", eps=1e-12)
    std = math.sqrt(5.0 / 3.0)  # sample std of 1..4
    np.testing.assert_allclose(adv[:4], np.array([-1.5, -0.5, 0.5, 1.5]) / std, rtol=1e-6)
    np.testing.assert_array_equal(adv[4:], 0.0)
    assert float(zero_frac) == 0.5

    adv, _ = grpo.group_advantages(rewards, 4, scaling="none")
    np.testing.assert_allclose(adv, [-1.5, -0.5, 0.5, 1.5, 0, 0, 0, 0], rtol=1e-6)

    adv, _ = grpo.group_advantages(rewards, 4, scaling="batch", eps=1e-12)
    batch_mean = 12.0 / 8
    batch_std = math.sqrt((0.25 + 0.25 + 2.25 + 6.25 + 4 * 1.0) / 7)
    assert abs(batch_mean - float(rewards.mean())) < 1e-12
    np.testing.assert_allclose(adv[:4], np.array([-1.5, -0.5, 0.5, 1.5]) / batch_std, rtol=1e-6)
    np.testing.assert_array_equal(adv[4:], 0.0)


def test_group_advantages_drop_invalid_samples():
    rewards = jnp.array([1.0, jnp.nan, 3.0, 5.0, 0.2, 0.9, 0.7, 0.1, 2.0, jnp.nan, jnp.nan, jnp.nan])
    valid = jnp.array([True] * 4 + [True, False, True, True] + [True] * 4)
    adv, zero_frac = grpo.group_advantages(rewards, 4, eps=1e-12, valid_N=valid)
    # group 0: valid {1, 3, 5}: mean 3, sample std 2.
    np.testing.assert_allclose(adv[:4], [-1.0, 0.0, 0.0, 1.0], rtol=1e-6)
    # group 1: sample 1 marked invalid: {0.2, 0.7, 0.1}, mean 1/3.
    r = np.array([0.2, 0.7, 0.1])
    expected = (r - r.mean()) / r.std(ddof=1)
    np.testing.assert_allclose(np.asarray(adv[4:8])[[0, 2, 3]], expected, rtol=1e-5)
    assert float(adv[5]) == 0.0
    # group 2: a single valid sample has no spread: zero advantage, counted.
    np.testing.assert_array_equal(adv[8:], 0.0)
    assert abs(float(zero_frac) - 1 / 3) < 1e-7
    assert np.all(np.isfinite(np.asarray(adv)))


@pytest.mark.parametrize("scaling", grpo.ADVANTAGE_SCALINGS)
def test_group_advantages_shift_invariant(scaling):
    rewards = jax.random.uniform(jax.random.key(0), (24,))
    base, _ = grpo.group_advantages(rewards, 8, scaling=scaling)
    shifted, _ = grpo.group_advantages(rewards + 3.5, 8, scaling=scaling)
    np.testing.assert_allclose(shifted, base, atol=1e-5)
    group_means = base.reshape(3, 8).mean(-1)
    np.testing.assert_allclose(group_means, 0.0, atol=1e-6)


def test_group_advantages_reject_bad_shapes():
    with pytest.raises(ValueError, match="multiple of group_size=4"):
        grpo.group_advantages(jnp.zeros(6), 4)
    with pytest.raises(ValueError, match="scaling='std'"):
        grpo.group_advantages(jnp.zeros(8), 4, scaling="std")


# --------------------------------------------------------------------------------- per-token terms


def test_clipped_surrogate_hand_computed():
    ratio = jnp.array([[1.5, 0.5, 1.0, 1.25]])
    old = jnp.zeros_like(ratio)
    mask = jnp.ones(ratio.shape, bool)
    loss, low, high = grpo.clipped_surrogate(jnp.log(ratio), old, jnp.array([1.0]), mask, 0.2, 0.2)
    np.testing.assert_allclose(loss, [[-1.2, -0.5, -1.0, -1.2]], rtol=1e-6)
    np.testing.assert_array_equal(high, [[1, 0, 0, 1]])
    np.testing.assert_array_equal(low, 0)

    loss, low, high = grpo.clipped_surrogate(jnp.log(ratio), old, jnp.array([-1.0]), mask, 0.2, 0.2)
    np.testing.assert_allclose(loss, [[1.5, 0.8, 1.0, 1.25]], rtol=1e-6)
    np.testing.assert_array_equal(low, [[0, 1, 0, 0]])
    np.testing.assert_array_equal(high, 0)

    # DAPO clip-higher: with eps_high 0.28 the ratio 1.25 is no longer clipped for A > 0.
    loss, _, high = grpo.clipped_surrogate(jnp.log(ratio), old, jnp.array([1.0]), mask, 0.2, 0.28)
    np.testing.assert_allclose(loss, [[-1.28, -0.5, -1.0, -1.25]], rtol=1e-6)
    np.testing.assert_array_equal(high, [[1, 0, 0, 0]])


def test_kl_estimators_hand_computed():
    logp = jnp.log(jnp.array([[0.5]]))
    ref = jnp.log(jnp.array([[0.25]]))
    mask = jnp.ones((1, 1), bool)
    log_r = math.log(0.5)
    expected = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": 0.5 - 1 - log_r}
    for name, value in expected.items():
        np.testing.assert_allclose(grpo.kl_estimate(logp, ref, mask, name), [[value]], rtol=1e-6)
    with pytest.raises(ValueError, match="'k9'"):
        grpo.kl_estimate(logp, ref, mask, "k9")


def test_a_huge_drift_is_clamped_before_exp():
    # log ratios ±200: exp overflows float32 (inf, and inf * A = NaN for A = 0) unless clamped to ±20 (verl).
    old = jnp.zeros((3, 2))
    logp = jnp.array([[200.0, 0.0], [200.0, 0.0], [-200.0, 0.0]])
    adv = jnp.array([0.0, 1.0, -1.0])
    mask = jnp.ones((3, 2), bool)
    loss_BxT, _, _ = grpo.clipped_surrogate(logp, old, adv, mask, 0.2, 0.28)
    # A = 0: exactly 0; A = 1 at ratio e^20: the clipped branch -1.28; A = -1 at ratio e^-20: the clipped 0.8.
    np.testing.assert_allclose(loss_BxT, [[0.0, 0.0], [-1.28, -1.0], [0.8, 1.0]], rtol=1e-6)
    cfg = _cfg(kl_coef=0.1, clip_high=0.28)
    ref = jnp.zeros((3, 2))

    def loss(lp):
        return grpo.grpo_loss(lp, old, ref, adv, mask, cfg)[0]

    value, grad = jax.jit(jax.value_and_grad(loss))(logp)
    assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))
    np.testing.assert_array_equal(np.asarray(grad)[:, 0], 0.0)  # beyond the clamp nothing flows back
    # k3 with log r = ref - logp = 200 is clamped too: e^20 - 1 - 20, not inf.
    k3 = grpo.kl_estimate(jnp.array([[-210.0]]), jnp.array([[-10.0]]), jnp.ones((1, 1), bool), "k3")
    np.testing.assert_allclose(k3, [[math.expm1(20.0) - 20.0]], rtol=1e-6)


def test_logprob_gap_hand_computed():
    a = jnp.array([[-1.0, -2.0, -3.0], [-0.5, 7.0, 7.0]])
    b = jnp.array([[-1.5, -2.0, -10.0], [-0.25, -9.0, 0.0]])
    mask = jnp.array([[True, True, False], [True, False, False]])
    assert float(grpo.logprob_gap(a, b, mask)) == pytest.approx((0.5 + 0.0 + 0.25) / 3)
    assert float(grpo.logprob_gap(a, b, jnp.zeros_like(mask))) == 0.0


@pytest.mark.parametrize("estimator", grpo.KL_ESTIMATORS)
def test_identical_policy_and_reference_give_zero_kl(estimator):
    logp = -jax.random.uniform(jax.random.key(1), (3, 5), minval=0.1, maxval=4.0)
    mask = jnp.ones((3, 5), bool)
    cfg = _cfg(kl_coef=0.04, kl_estimator=estimator)

    def kl_term(lp):
        return grpo.grpo_loss(lp, lp, logp, jnp.zeros(3), mask, cfg)[1]["kl"]

    assert float(kl_term(logp)) == 0.0
    if estimator != "k1":  # k2 and k3 are minimised at π = π_ref; k1's gradient is the constant 1
        np.testing.assert_allclose(jax.grad(kl_term)(logp), 0.0, atol=1e-7)


def test_aggregation_weights_hand_computed():
    per_token = jnp.array([[4.0, 9.0, 9.0], [1.0, 2.0, 3.0]])
    mask = jnp.array([[True, False, False], [True, True, True]])

    def agg(mode, length=None):
        return float(jnp.sum(grpo.loss_weights(mask, mode, length) * per_token))

    assert agg("seq_mean_token_mean") == pytest.approx((4.0 + 2.0) / 2)
    assert agg("token_mean") == pytest.approx(10.0 / 4)
    assert agg("seq_mean_token_sum_norm", 4) == pytest.approx((4.0 / 4 + 6.0 / 4) / 2)
    with pytest.raises(ValueError, match="'sum'"):
        grpo.loss_weights(mask, "sum")


def test_grpo_loss_hand_computed():
    # On-policy (ratio 1): pg = -A per token; with k3 KL 0.5 - 1 - log 0.5 on every token.
    logp = jnp.full((2, 3), math.log(0.5))
    ref = jnp.full((2, 3), math.log(0.25))
    mask = jnp.array([[False, True, True], [False, True, False]])
    cfg = _cfg(kl_coef=0.05)
    loss, metrics = grpo.grpo_loss(logp, logp, ref, jnp.array([1.0, -2.0]), mask, cfg)
    k3 = 0.5 - 1 - math.log(0.5)
    pg = (-1.0 + 2.0) / 2
    assert float(metrics["pg_loss"]) == pytest.approx(pg, rel=1e-6)
    assert float(metrics["kl"]) == pytest.approx(k3, rel=1e-6)
    assert float(loss) == pytest.approx(pg + 0.05 * k3, rel=1e-6)
    assert float(metrics["clip_frac"]) == 0.0 and float(metrics["ratio_mean"]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="iff kl_coef > 0"):
        grpo.grpo_loss(logp, logp, None, jnp.zeros(2), mask, cfg)


# --------------------------------------------------------------------------------- gradients


# Three rows, on-policy (ratio 1), π = 0.5 and π_ref = 0.25 on every token; row 1 is fully masked (e.g. a
# sample whose reward is missing). Per token: loss ℓ_b = −A_b + β·k3 with k3 = 0.5 − 1 − log 0.5, and
# d loss/d log π = −A_b + β·(1 − π_ref/π) = −A_b + β/2, each times the token's aggregation weight.
_MASKED_ROW_MASK = np.array([[False, True, True], [False, False, False], [False, True, False]])
_MASKED_ROW_ADV = np.array([1.0, 5.0, -2.0])
_BETA = 0.1
_K3 = 0.5 - 1 - math.log(0.5)


@pytest.mark.parametrize("mode, length, weight_row0, weight_row2, without_row_factor", [
    # GRPO: mean over each row's 2 and 1 tokens, then over the 2 rows that have tokens (row 1 does not count).
    ("seq_mean_token_mean", None, 1 / (2 * 2), 1 / (1 * 2), 1.0),
    # DAPO: one mean over the 3 response tokens of the batch (row 1 has none).
    ("token_mean", None, 1 / 3, 1 / 3, 1.0),
    # Dr. GRPO: token sums over the constant L·B = 4·3; without row 1, L·B = 4·2, so the loss is 2/3 of that.
    ("seq_mean_token_sum_norm", 4, 1 / 12, 1 / 12, 2 / 3),
])
def test_a_fully_masked_row_is_left_out_as_each_mode_defines(mode, length, weight_row0, weight_row2,
                                                              without_row_factor):
    cfg = _cfg(kl_coef=_BETA, loss_aggregation=mode, loss_norm_length=length)
    keep = np.array([0, 2])

    def loss_and_grad(mask, adv):
        logp = jnp.full(mask.shape, math.log(0.5))
        ref = jnp.full(mask.shape, math.log(0.25))

        def loss(lp):
            return grpo.grpo_loss(lp, logp, ref, jnp.asarray(adv), jnp.asarray(mask), cfg)[0]

        return jax.jit(jax.value_and_grad(loss))(logp)

    loss, grad = loss_and_grad(_MASKED_ROW_MASK, _MASKED_ROW_ADV)
    per_token = -_MASKED_ROW_ADV + _BETA * _K3
    expected_loss = 2 * weight_row0 * per_token[0] + weight_row2 * per_token[2]
    assert float(loss) == pytest.approx(expected_loss, rel=1e-6)
    expected_grad = np.zeros((3, 3))
    expected_grad[0, 1:] = weight_row0 * (-_MASKED_ROW_ADV[0] + _BETA / 2)
    expected_grad[2, 1] = weight_row2 * (-_MASKED_ROW_ADV[2] + _BETA / 2)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-6, atol=1e-8)

    loss_without, grad_without = loss_and_grad(_MASKED_ROW_MASK[keep], _MASKED_ROW_ADV[keep])
    assert float(loss) == pytest.approx(without_row_factor * float(loss_without), rel=1e-6)
    np.testing.assert_allclose(grad[keep], without_row_factor * np.asarray(grad_without), rtol=1e-6)


def _random_case(key, b=4, t=6, dtype=jnp.float32):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    old = -jax.random.uniform(k1, (b, t), dtype, 0.5, 3.0)
    log_ratio = jax.random.uniform(k2, (b, t), dtype, -0.6, 0.6)
    ref = old + jax.random.uniform(k3, (b, t), dtype, -0.5, 0.5)
    adv = jax.random.normal(k4, (b,), dtype)
    lengths = jnp.array([6, 3, 1, 4])[:b]
    mask = (jnp.arange(t)[None, :] >= 1) & (jnp.arange(t)[None, :] <= lengths[:, None])
    return old + log_ratio, old, ref, adv, mask


@pytest.mark.parametrize("mode, length", [("seq_mean_token_mean", None), ("token_mean", None),
                                          ("seq_mean_token_sum_norm", 8)])
@pytest.mark.parametrize("estimator", grpo.KL_ESTIMATORS)
def test_gradient_matches_finite_differences_float64(mode, length, estimator):
    with jax.enable_x64(True):
        logp, old, ref, adv, mask = _random_case(jax.random.key(3), dtype=jnp.float64)
        cfg = _cfg(kl_coef=0.03, kl_estimator=estimator, clip_low=0.2, clip_high=0.28,
                   loss_aggregation=mode, loss_norm_length=length)
        kinks = jnp.array([math.log(0.8), math.log(1.28)])
        assert float(jnp.min(jnp.abs((logp - old)[..., None] - kinks[None, None, :]))) > 1e-3

        @jax.jit
        def f(lp):
            return grpo.grpo_loss(lp, old, ref, adv, mask, cfg)[0]

        grad = np.asarray(jax.grad(f)(logp))
        h = 1e-6
        eye = np.eye(logp.size).reshape(logp.size, *logp.shape)
        numeric = np.array([(f(logp + h * e) - f(logp - h * e)) / (2 * h) for e in eye]).reshape(logp.shape)
        assert logp.dtype == jnp.float64
        np.testing.assert_allclose(grad, numeric, atol=1e-8, rtol=1e-6)
        assert np.all(grad[~np.asarray(mask)] == 0)
        assert np.any(grad != 0)


def test_equal_rewards_without_kl_give_zero_gradient():
    logp, old, _, _, mask = _random_case(jax.random.key(4))
    adv, zero_frac = grpo.group_advantages(jnp.full(4, 0.7), 2)
    assert float(zero_frac) == 1.0
    cfg = _cfg(kl_coef=0.0)
    grad = jax.jit(jax.grad(lambda lp: grpo.grpo_loss(lp, old, None, adv, mask, cfg)[0]))(logp)
    np.testing.assert_array_equal(grad, 0.0)


@pytest.mark.parametrize("mode, length", [("seq_mean_token_mean", None), ("token_mean", None),
                                          ("seq_mean_token_sum_norm", 8)])
def test_padding_changes_nothing(mode, length):
    logp, old, ref, adv, mask = _random_case(jax.random.key(5))
    cfg = _cfg(kl_coef=0.02, loss_aggregation=mode, loss_norm_length=length)

    def loss_and_grad(lp, o, r, m):
        return jax.jit(jax.value_and_grad(lambda x: grpo.grpo_loss(x, o, r, adv, m, cfg)[0]))(lp)

    def pad(x, value):
        return jnp.concatenate([x, jnp.full((x.shape[0], 5), value, x.dtype)], axis=1)

    loss, grad = loss_and_grad(logp, old, ref, mask)
    # Garbage on the padding (as a sampler might leave it) must not leak in.
    loss_p, grad_p = loss_and_grad(pad(logp, 30.0), pad(old, -1e4), pad(ref, 50.0), pad(mask, False))
    assert float(loss_p) == pytest.approx(float(loss), rel=1e-6)
    np.testing.assert_allclose(grad_p[:, :6], grad, rtol=1e-6)
    np.testing.assert_array_equal(grad_p[:, 6:], 0.0)


def test_microbatch_sums_equal_full_batch():
    logp, old, ref, adv, mask = _random_case(jax.random.key(6))
    cfg = _cfg(kl_coef=0.02, loss_aggregation="token_mean")
    full, full_metrics = grpo.grpo_loss(logp, old, ref, adv, mask, cfg)
    loss_w = grpo.loss_weights(mask, cfg.loss_aggregation)
    metric_w = grpo.token_mean_weights(mask)
    parts = [grpo.grpo_objective(logp[s], old[s], ref[s], adv[s], mask[s], loss_w[s], metric_w[s], cfg)
             for s in (slice(0, 2), slice(2, 4))]
    assert float(parts[0][0] + parts[1][0]) == pytest.approx(float(full), rel=1e-6)
    for name in ("kl", "clip_frac", "pg_loss"):
        total = float(parts[0][1][name] + parts[1][1][name])
        assert total == pytest.approx(float(full_metrics[name]), rel=1e-6, abs=1e-7)


# --------------------------------------------------------------------------------- chunked log-probs


@pytest.mark.parametrize("vocab, chunk, temperature, slices", [
    (11, 1, 1.0, 11), (11, 3, 0.7, 11), (11, 7, 1.0, 1), (11, 100, 1.3, 1), (12, 3, 1.0, 3), (12, 2, 0.7, 4)])
def test_chunked_logprobs_match_full_log_softmax(vocab, chunk, temperature, slices):
    """Log-probs, entropies and both their gradients over vocabulary slices (7 positions, at most `chunk` x V
    logits per row at a time: V = 11 has no divisor between 1 and 11) equal the full log-softmax's."""
    k1, k2, k3 = jax.random.split(jax.random.key(7), 3)
    h = jax.random.normal(k1, (2, 7, 5))
    w = jax.random.normal(k2, (5, vocab))
    targets = jax.random.randint(k3, (2, 7), 0, vocab)
    assert grpo.vocab_slices(vocab, 7, chunk) == slices

    def chunked(h, w):
        head = types.SimpleNamespace(  # the head contract as Transformer has it: slice i = ids i, i + n, ...
            cfg=types.SimpleNamespace(vocab_size=vocab), vocab_slice_for_dot=lambda w_DxS: w_DxS,
            vocab_projection=lambda n: w.reshape(5, vocab // n, n).transpose(2, 0, 1))
        return grpo.chunked_token_logprobs(h, targets, head, chunk, temperature)

    def full(h, w):
        logp_all = jax.nn.log_softmax(h @ w / temperature, axis=-1)
        logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
        return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)

    (lp_c, ent_c), (lp_f, ent_f) = jax.jit(chunked)(h, w), jax.jit(full)(h, w)
    np.testing.assert_allclose(lp_c, lp_f, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ent_c, ent_f, rtol=1e-5, atol=1e-5)  # H = lse - E[logits]: cancellation
    mix = jax.random.normal(jax.random.key(8), (2, 2, 7))  # a cotangent for each output

    def loss(fn):
        return lambda h, w: jnp.sum(mix[0] * fn(h, w)[0]) + jnp.sum(mix[1] * fn(h, w)[1])

    g_c = jax.jit(jax.grad(loss(chunked), argnums=(0, 1)))(h, w)
    g_f = jax.jit(jax.grad(loss(full), argnums=(0, 1)))(h, w)
    for a, b in zip(g_c, g_f):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _dot_operand_dtypes(jaxpr):
    """The operand dtypes of every dot_general in a jaxpr, sub-jaxprs (scan, checkpoint, custom_vjp) included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(tuple(str(v.aval.dtype) for v in eqn.invars))
        for sub in jax.core.jaxprs_in_params(eqn.params):
            found += _dot_operand_dtypes(sub)
    return found


def test_bf16_chunked_logprobs_backward_runs_bf16_dots():
    """In bf16 the log-probs' gradient runs only bf16 x bf16 dots (autodiff ran the logits' two backward dots on
    the float32 logit gradient: float32 GEMMs on a GPU), and stays within bf16 error of the float32 gradient."""
    k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
    h = jax.random.normal(k1, (2, 8, 16))
    w = jax.random.normal(k2, (16, 32)) * 0.3
    targets = jax.random.randint(k3, (2, 8), 0, 32)

    def loss(h, w):
        head = types.SimpleNamespace(cfg=types.SimpleNamespace(vocab_size=32), vocab_slice_for_dot=lambda w_DxS: w_DxS,
                                     vocab_projection=lambda n: w.reshape(16, 32 // n, n).transpose(2, 0, 1))
        return jnp.sum(grpo.chunked_token_logprobs(h, targets, head, 2, 1.0)[0])

    low = (h.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
    dtypes = _dot_operand_dtypes(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(*low).jaxpr)
    # The slice loop's bodies: the forward's logits dot, the backward's rematerialised one and its two.
    assert len(dtypes) == 4 and set(dtypes) == {("bfloat16", "bfloat16")}, dtypes
    for got, want in zip(jax.jit(jax.grad(loss, argnums=(0, 1)))(*low), jax.jit(jax.grad(loss, argnums=(0, 1)))(h, w)):
        assert got.dtype == jnp.bfloat16 and float(jnp.max(jnp.abs(got.astype(jnp.float32) - want))) <= 0.05 * float(
            jnp.max(jnp.abs(want)))


def test_low_precision_softmax_sums_backward_is_autodiffs():
    """The one-pass backward of a vocabulary slice's softmax sums (Σ e, Σ e·z, the target's logit; bf16 models'
    `chunked_token_logprobs`) gives autodiff's gradient of the same sums, for cotangents on all three."""
    k1, k2, k3 = jax.random.split(jax.random.key(4), 3)
    logits = 3 * jax.random.normal(k1, (2, 8, 32))
    max_ = jnp.max(logits, axis=-1) + 0.5
    local = jax.random.randint(k2, (2, 8), 0, 32)
    cotangents = tuple(jax.random.normal(k, (2, 8)) for k in jax.random.split(k3, 3))
    outs, fused = jax.vjp(lambda z: grpo._low_precision_softmax_sums(z, max_, local), logits)
    want_outs, plain = jax.vjp(lambda z: grpo._softmax_sums(z, max_, local), logits)
    for got, want in zip(outs, want_outs):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(fused(cotangents)[0], plain(cotangents)[0], rtol=1e-6, atol=1e-6)


def _jit_logprobs(model, chunk_size, temperature=1.0):
    """sequence_logprobs and the full forward of `model`, jitted over its state (eager is slow to dispatch)."""
    graphdef, state = nnx.split(model)
    logprobs = jax.jit(lambda s, t, m: grpo.sequence_logprobs(nnx.merge(graphdef, s), t, m, chunk_size=chunk_size,
                                                              temperature=temperature))
    forward = jax.jit(lambda s, t, m: nnx.merge(graphdef, s)(t, padding_to_positions(m), causal_padding_mask(m))[0])
    return (lambda t, m: logprobs(state, t, m)), (lambda t, m: forward(state, t, m))


def _tiny_model(tie=False, **changes):
    cfg = ModelConfig(architecture="qwen2", vocab_size=61, hidden_size=16, intermediate_size=32, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=tie, attention_bias=True, rope_scaling=None,
                      max_position_embeddings=64)
    return nnx.merge(*random_model(cfg.replace(**changes), std=0.3))


@pytest.mark.parametrize("tie, temperature", [(False, 1.0), (True, 0.7)])
def test_sequence_logprobs_match_model_logits(tie, temperature):
    model = _tiny_model(tie)
    tokens = jax.random.randint(jax.random.key(8), (3, 9), 0, 61)
    input_mask = jnp.arange(9)[None, :] >= jnp.array([[0], [2], [4]])  # left padding
    logprobs, forward = _jit_logprobs(model, 4, temperature)
    logp, ent = logprobs(tokens, input_mask)
    logits = forward(tokens, input_mask)
    logp_all = jax.nn.log_softmax(logits / temperature, axis=-1)
    expected = jnp.take_along_axis(logp_all[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
    expected_ent = -jnp.sum(jnp.exp(logp_all) * logp_all, -1)[:, :-1]
    defined = np.asarray(input_mask[:, 1:] & input_mask[:, :-1])  # a real token predicted from a real one
    np.testing.assert_allclose(np.asarray(logp[:, 1:])[defined], np.asarray(expected)[defined], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent[:, 1:])[defined], np.asarray(expected_ent)[defined], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(logp[:, 0], 0.0)
    np.testing.assert_array_equal(np.asarray(logp[:, 1:])[~defined], 0.0)  # padding: 0, like the sampler's


def test_sequence_logprobs_ignore_right_padding():
    model = _tiny_model()
    tokens = jax.random.randint(jax.random.key(9), (2, 6), 0, 61)
    mask = jnp.ones((2, 6), bool)
    padded = jnp.concatenate([tokens, jnp.zeros((2, 3), tokens.dtype)], axis=1)
    padded_mask = jnp.concatenate([mask, jnp.zeros((2, 3), bool)], axis=1)
    logprobs, _ = _jit_logprobs(model, 4)
    logp, _ = logprobs(tokens, mask)
    logp_p, _ = logprobs(padded, padded_mask)
    np.testing.assert_allclose(logp_p[:, :6], logp, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ shared-prompt log-probs (GRPO's forward)

PROMPT_LENGTHS, RESPONSE_LENGTHS, P_SLOTS, R_SLOTS = (5, 2, 7), (6, 3, 1, 0, 4, 6, 2, 6, 5), 7, 6


def _shared_prompt_case(padding):
    """3 prompts of 5, 2 and 7 real tokens in 7 slots (left- or right-padded), 3 right-padded responses each
    of 0-6 real tokens (one empty), and the same rows laid out per row: [left-padded prompt | response]."""
    rng = np.random.default_rng(10)
    slots = np.arange(P_SLOTS)
    left_mask = slots[None, :] >= P_SLOTS - np.array(PROMPT_LENGTHS)[:, None]
    left = np.where(left_mask, rng.integers(1, 61, (3, P_SLOTS)), 0)
    if padding == "left":
        prompt, prompt_mask = left, left_mask
    else:  # the same real tokens, moved to the front
        prompt = np.stack([np.roll(row, n - P_SLOTS) for row, n in zip(left, PROMPT_LENGTHS)])
        prompt_mask = slots[None, :] < np.array(PROMPT_LENGTHS)[:, None]
    response_mask = np.arange(R_SLOTS)[None, :] < np.array(RESPONSE_LENGTHS)[:, None]
    response = np.where(response_mask, rng.integers(1, 61, (9, R_SLOTS)), 0)
    per_row = (np.concatenate([np.repeat(left, 3, axis=0), response], axis=1),
               np.concatenate([np.repeat(left_mask, 3, axis=0), response_mask], axis=1))
    return (prompt, prompt_mask, response, response_mask), per_row


@functools.cache
def _both_logprobs(graphdef, temperature=0.8):
    """(shared-prompt log-probs [9, R], per-row log-probs at the response columns [9, R]) as functions of state; one
    pair per model graph, so tests of the same model and shapes run the same compiled programs."""
    def shared(state, case):
        return grpo.shared_prompt_logprobs(nnx.merge(graphdef, state), *case, chunk_size=4,
                                           temperature=temperature)[0]

    def per_row(state, tokens, mask):
        logp = grpo.sequence_logprobs(nnx.merge(graphdef, state), tokens, mask, chunk_size=4,
                                      temperature=temperature)[0]
        return logp[:, P_SLOTS:]

    return jax.jit(shared), jax.jit(per_row)


FUSED_CFG = grpo.GRPOConfig(group_size=3, kl_coef=0.05)


@functools.cache
def _shared_prompt_loss_grad(graphdef):
    """jit(grad) of the GRPO loss through the shared-prompt forward of `graphdef`: (gradients, log-probs) of
    `(state, case, old, advantages)`. The case and the loss's inputs are arguments, not constants, so both paddings
    run one program per attention."""
    shared = _both_logprobs(graphdef)[0]

    def loss(state, case, old, advantages):
        logp = shared(state, case)
        return grpo.grpo_loss(logp, old, old - 0.2, advantages, case[3], FUSED_CFG)[0], logp

    return jax.jit(jax.grad(loss, has_aux=True))


@pytest.mark.parametrize("padding, scan_layers", [("left", True), ("right", False)])
def test_shared_prompt_logprobs_equal_the_per_row_forward(padding, scan_layers):
    graphdef, state = nnx.split(_tiny_model(scan_layers=scan_layers))
    case, (tokens, mask) = _shared_prompt_case(padding)
    shared, per_row = _both_logprobs(graphdef)
    got, want = shared(state, case), per_row(state, tokens, mask)
    targets = grpo.response_targets(case[1], case[3])
    np.testing.assert_array_equal(targets, case[3])  # every real response token is predicted
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(got).min(where=targets, initial=jnp.inf)) > 1e-3  # real log-probs, not zeros
    np.testing.assert_array_equal(np.asarray(got)[~np.asarray(targets)], 0.0)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_fused_attention_log_probs_and_gradients_equal_the_einsum_attention(padding):
    """`jax.nn.dot_product_attention` (its XLA implementation, the CPU stand-in for cuDNN: same call, same
    mask) in both teacher-forced forwards (shared prompt: prompt self-attention + responses on [prompt ;
    own]; per row: one causal padded forward) gives the einsum attention's log-probs and GRPO gradients.
    Two KV heads of two queries each, so a query head reading the wrong KV head fails too."""
    einsum = _tiny_model(num_heads=4, num_kv_heads=2)
    graphdef, state = nnx.split(einsum)
    fused_graphdef = nnx.split(nnx.merge(*random_model(einsum.cfg.replace(attention="xla"), std=0.3)))[0]
    case, (tokens, mask) = _shared_prompt_case(padding)
    targets = np.asarray(grpo.response_targets(case[1], case[3]))
    advantages, _ = grpo.group_advantages(jnp.arange(9.0) % 4, 3)
    per_row = {name: _both_logprobs(g)[1] for name, g in (("einsum", graphdef), ("fused", fused_graphdef))}
    old = per_row["einsum"](state, tokens, mask) + 0.1
    results = {}
    for name, g in (("einsum", graphdef), ("fused", fused_graphdef)):
        grads, logp = _shared_prompt_loss_grad(g)(state, case, old, advantages)
        results[name] = (logp, per_row[name](state, tokens, mask), grads)
    for got, want in zip(results["fused"], results["einsum"]):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)
    # The padding matters: the same rows with every slot attended give other log-probs by far.
    unmasked = np.asarray(per_row["einsum"](state, tokens, np.ones_like(mask)))
    assert np.abs(unmasked - np.asarray(results["einsum"][1]))[targets].max() > 0.05


def test_shared_prompt_gradients_equal_the_per_row_forward():
    """The GRPO loss (clipping on both sides, k3 KL) through either forward: same value, same gradient
    w.r.t. every parameter (the prompt's share is the sum over its group's rows)."""
    model = _tiny_model()
    graphdef, state = nnx.split(model)
    case, (tokens, mask) = _shared_prompt_case("left")
    shared, per_row = _both_logprobs(graphdef)
    response_mask = case[3]
    shift = jnp.where(jnp.arange(R_SLOTS) % 2 == 0, 0.3, -0.3)[None, :]
    old = jax.lax.stop_gradient(per_row(state, tokens, mask)) + shift
    ref = old - 0.2
    advantages, _ = grpo.group_advantages(jnp.arange(9.0) % 4, 3)
    cfg = grpo.GRPOConfig(group_size=3, kl_coef=0.05, clip_high=0.28)

    def loss(logp):
        return grpo.grpo_loss(logp, old, ref, advantages, response_mask, cfg)

    (l_shared, _), g_shared = jax.jit(jax.value_and_grad(lambda s: loss(shared(s, case)), has_aux=True))(state)
    (l_row, m_row), g_row = jax.jit(jax.value_and_grad(lambda s: loss(per_row(s, tokens, mask)), has_aux=True))(state)
    assert float(m_row["clip_frac_low"]) > 0 and float(m_row["clip_frac_high"]) > 0 and float(m_row["kl"]) > 0
    assert float(l_shared) == pytest.approx(float(l_row), rel=1e-5)
    norms = jax.tree.map(lambda g: float(np.abs(np.asarray(g)).max()), g_row)
    assert min(jax.tree.leaves(norms)) > 0  # every parameter gets a gradient
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g_shared, g_row)


def _primitive_count(jaxpr, name):
    """How many `name` equations a jaxpr runs, sub-jaxprs (scan, checkpoint, custom_vjp) included."""
    return sum((eqn.primitive.name == name) + sum(_primitive_count(sub, name)
                                                  for sub in jax.core.jaxprs_in_params(eqn.params))
               for eqn in jaxpr.eqns)


def test_chunked_logprobs_backward_reuses_the_forwards_max_and_reads_a_given_projection():
    """A bf16 model's slice backward reads the running max its forward saved (float32 recomputes the reduction in
    the rematerialised slice: 5 GB of logits read per 1.5B update on a GPU), and a projection made outside
    (`projection`: the train step's once-per-update copy) gives the head's own log-probs and gradients; one of
    another shape is refused."""
    k1, k2, k3 = jax.random.split(jax.random.key(5), 3)
    h = jax.random.normal(k1, (2, 8, 16))
    w = jax.random.normal(k2, (16, 32)) * 0.3
    targets = jax.random.randint(k3, (2, 8), 0, 32)

    def head_of(w):
        return types.SimpleNamespace(cfg=types.SimpleNamespace(vocab_size=32), vocab_slice_for_dot=lambda w_DxS: w_DxS,
                                     vocab_projection=lambda n: w.reshape(16, 32 // n, n).transpose(2, 0, 1))

    def loss(h, w, projection=None):
        return jnp.sum(grpo.chunked_token_logprobs(h, targets, head_of(w), 2, 1.0, projection)[0])

    grad = jax.grad(loss, argnums=(0, 1))
    low = (h.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
    assert _primitive_count(jax.make_jaxpr(grad)(*low).jaxpr, "reduce_max") == 1
    assert _primitive_count(jax.make_jaxpr(grad)(h, w).jaxpr, "reduce_max") == 2
    projection = head_of(low[1]).vocab_projection(grpo.vocab_slices(32, 8, 2))
    for got, want in zip(jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(*low, projection),
                         jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(*low)):
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32)),
                     got, want)
    with pytest.raises(ValueError, match=r"projection \(2, 16, 16\): the head's vocab_projection\(4\) is \(4, 16, 8\)"):
        loss(*low, jnp.zeros((2, 16, 16), jnp.bfloat16))

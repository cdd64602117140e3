"""The policy losses besides PPO's clipped surrogate (issue 36): CISPO, SAPO, and the entropy bonus.

Each is checked on hand-computed cases and against the reference implementations transcribed here in numpy
(`xp` = numpy for the values in float64; the same code with `xp` = jax.numpy and `detach` = stop_gradient gives the
reference's gradient, which is what `loss.backward()` computes there):
  TRL  huggingface/trl, trl/trainer/grpo_trainer.py `_compute_loss` (loss_type "cispo": −sg(min(ρ, epsilon_high))·A·log π
       over the batch's tokens; "sapo": −σ(τ(ρ − 1))·4/τ·A, sequence mean of token means) with the defaults of
       trl/trainer/grpo_config.py at 006d32c (sapo_temperature_pos 1.0, sapo_temperature_neg 1.05; epsilon_high 5.0
       recommended for cispo);
  verl verl/trainer/ppo/core_algos.py `compute_policy_loss_cispo` (weight clip(ρ, 1 − clip_ratio_low,
       1 + clip_ratio_high), `loss_agg_mode`), `compute_policy_loss_sapo` (tau_pos / tau_neg, seq-mean-token-mean)
       and the actor's `policy_loss = pg_loss − entropy_coeff · agg_loss(entropy_from_logits(logits))`.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_jax import grpo


def _detach(xp):
    return (lambda x: x) if xp is np else jax.lax.stop_gradient


def _sigmoid(xp, x):
    return 1.0 / (1.0 + xp.exp(-x))


def _agg(xp, loss_BxT, mask_BxT, mode):
    """TRL's / verl's aggregations: "token-mean" (TRL cispo/dapo, verl token-mean) or "seq-mean-token-mean"."""
    if mode == "token-mean":
        return (loss_BxT * mask_BxT).sum() / mask_BxT.sum()
    return ((loss_BxT * mask_BxT).sum(-1) / xp.maximum(mask_BxT.sum(-1), 1.0)).mean()


def _trl(xp, logps, old, adv_B, mask, loss_type, level="token", epsilon_high=5.0, tau_pos=1.0, tau_neg=1.05):
    """TRL `_compute_loss`'s policy term for loss_type cispo / sapo (no KL: beta 0), one process."""
    advantages = adv_B[:, None]
    log_ratio = logps - old
    if level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = ((log_ratio * mask).sum(-1) / xp.maximum(mask.sum(-1), 1.0))[:, None]
    coef_1 = xp.exp(log_importance_weights)
    if loss_type == "cispo":
        clamped_ratios = _detach(xp)(xp.minimum(coef_1, epsilon_high))
        per_token_loss = -clamped_ratios * advantages * logps
        return _agg(xp, per_token_loss, mask, "token-mean")  # normalised by the tokens of the batch
    temperatures = xp.where(advantages > 0, tau_pos, tau_neg)
    soft_coef_1 = _sigmoid(xp, temperatures * (coef_1 - 1)) * 4 / temperatures
    return _agg(xp, -soft_coef_1 * advantages, mask, "seq-mean-token-mean")  # loss_type sapo aggregates as grpo


def _verl_cispo(xp, old, logp, adv_BxT, mask, low, high, mode):
    """compute_policy_loss_cispo: (pg_loss, pg_clipfrac)."""
    ratio = xp.exp(xp.clip(logp - old, -20.0, 20.0))
    clipped_ratio = xp.clip(ratio, 1 - low, 1 + high)
    pg_losses = -_detach(xp)(clipped_ratio) * adv_BxT * logp
    clipfrac = ((ratio != clipped_ratio) * mask).sum() / mask.sum()
    return _agg(xp, pg_losses, mask, mode), clipfrac


def _verl_sapo(xp, old, logp, adv_BxT, mask, tau_pos, tau_neg):
    """compute_policy_loss_sapo."""
    ratio = xp.exp(xp.clip(logp - old, -20.0, 20.0))
    taus = xp.where(adv_BxT > 0, tau_pos, tau_neg)
    gates = _sigmoid(xp, taus * (ratio - 1.0)) * (4.0 / taus)
    return _agg(xp, -gates * adv_BxT, mask, "seq-mean-token-mean")


def _case(seed=0, b=4, t=6):
    """Log ratios ~ N(0, 0.8) with two tokens far out (ρ = e^2 ≈ 7.4 > TRL's cap 5, ρ = e^−2), ragged masks."""
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.5, 0.5, (b, t))
    logp = old + rng.normal(0.0, 0.8, (b, t))
    logp[0, 1], logp[2, 0] = old[0, 1] + 2.0, old[2, 0] - 2.0
    mask = np.ones((b, t), bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    return old, logp, np.array([1.3, -0.7, -2.0, 0.4]), mask


def _ours(cfg, old, adv, mask):
    """Our loss as a function of the log-probs (float64 under enable_x64)."""
    args = [jnp.asarray(x) for x in (old, adv, mask)]
    return lambda lp: grpo.grpo_loss(lp, args[0], None, args[1], args[2], cfg)[0]


def _cfg(**kw):
    return grpo.GRPOConfig(**{"group_size": 2, "kl_coef": 0.0, **kw})


# ---------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("kw, field", [
    ({"loss": "ppo"}, "loss"),
    ({"loss": "cispo", "cispo_clip_low": 1.5}, "cispo_clip_low"),
    ({"loss": "cispo", "cispo_clip_low": -0.1}, "cispo_clip_low"),
    ({"loss": "cispo", "cispo_clip_high": 0.0}, "cispo_clip_high"),
    ({"loss": "cispo", "cispo_clip_high": float("inf")}, "cispo_clip_high"),
    ({"loss": "sapo", "sapo_tau_pos": 0.0}, "sapo_tau_pos"),
    ({"loss": "sapo", "sapo_tau_neg": float("nan")}, "sapo_tau_neg"),
    ({"entropy_coef": -0.01}, "entropy_coef"),
    ({"entropy_coef": float("nan")}, "entropy_coef"),
    ({"loss": "sapo", "clip_ratio_c": 3.0}, "clip_ratio_c"),  # dual clip belongs to PPO's loss
    ({"sapo_tau_neg": 2.0}, "sapo_tau_neg"),  # a parameter the chosen loss never reads
    ({"loss": "sapo", "cispo_clip_high": 0.28}, "cispo_clip_high"),
])
def test_config_refuses_bad_loss_options(kw, field):
    with pytest.raises(ValueError, match=f"GRPOConfig.{field}="):
        grpo.GRPOConfig(**kw)


def test_defaults_are_off():
    cfg = grpo.GRPOConfig()
    assert (cfg.loss, cfg.entropy_coef) == ("grpo", 0.0)
    assert (cfg.cispo_clip_low, cfg.cispo_clip_high, cfg.sapo_tau_pos, cfg.sapo_tau_neg) == (1.0, 4.0, 1.0, 1.05)


# ----------------------------------------------------------------------------------------- CISPO
def test_cispo_hand_computed():
    """ρ = 1.5, 0.5, 1, 6 with A = 2 and no floor, cap 5: weights 1.5, 0.5, 1, 5; d loss/d log π = −w·A/4 each (a
    token mean over 4 tokens): every token keeps a gradient, where PPO's clip (0.8, 1.28) zeroes the 1st and 4th."""
    ratio = jnp.array([[1.5, 0.5, 1.0, 6.0]])
    old, mask, adv = jnp.zeros((1, 4)), jnp.ones((1, 4), bool), jnp.array([2.0])
    logp = jnp.log(ratio)
    weight = np.array([1.5, 0.5, 1.0, 5.0])
    cfg = _cfg(loss="cispo", loss_aggregation="token_mean")
    (value, metrics), grad = jax.value_and_grad(lambda lp: grpo.grpo_loss(lp, old, None, adv, mask, cfg),
                                                has_aux=True)(logp)
    assert float(value) == pytest.approx(float(np.sum(-weight * 2.0 * np.log(ratio))) / 4, rel=1e-6)
    np.testing.assert_allclose(grad, [-weight * 2.0 / 4], rtol=1e-6)
    assert float(metrics["clip_frac_high"]) == 0.25 and float(metrics["clip_frac_low"]) == 0.0
    ppo = _cfg(clip_low=0.2, clip_high=0.28, loss_aggregation="token_mean")
    ppo_grad = jax.grad(lambda lp: grpo.grpo_loss(lp, old, None, adv, mask, ppo)[0])(logp)
    np.testing.assert_allclose(ppo_grad, [[0.0, -0.5 * 2 / 4, -2.0 / 4, 0.0]], rtol=1e-6)
    # verl's two-sided clip (0.2, 0.28): weights 1.28, 0.8, 1, 1.28; the 0.5 is truncated below, 1.5 and 6 above.
    two_sided = _cfg(loss="cispo", cispo_clip_low=0.2, cispo_clip_high=0.28, loss_aggregation="token_mean")
    (_, metrics), grad = jax.value_and_grad(lambda lp: grpo.grpo_loss(lp, old, None, adv, mask, two_sided),
                                            has_aux=True)(logp)
    np.testing.assert_allclose(grad, [[-1.28 * 0.5, -0.8 * 0.5, -0.5, -1.28 * 0.5]], rtol=1e-6)
    assert float(metrics["clip_frac_low"]) == 0.25 and float(metrics["clip_frac_high"]) == 0.5


@pytest.mark.parametrize("level", grpo.IMPORTANCE_LEVELS)
def test_cispo_equals_trl_with_gradients(level):
    old, logp, adv, mask = _case(1)
    cfg = _cfg(loss="cispo", cispo_clip_low=1.0, cispo_clip_high=4.0, loss_aggregation="token_mean",
               importance_level=level)
    assert np.exp(logp - old)[mask].max() > 5.0  # the cap acts
    with jax.enable_x64(True):
        ours = _ours(cfg, old, adv, mask)
        assert float(ours(jnp.asarray(logp))) == pytest.approx(_trl(np, logp, old, adv, mask, "cispo", level), rel=1e-6)
        trl = jax.grad(lambda lp: _trl(jnp, lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), "cispo", level))
        np.testing.assert_allclose(jax.grad(ours)(jnp.asarray(logp)), trl(jnp.asarray(logp)), rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("mode, verl_mode", [("token_mean", "token-mean"), ("seq_mean_token_mean", "seq-mean-token-mean")])
def test_cispo_equals_verl_with_gradients(mode, verl_mode):
    old, logp, adv, mask = _case(2)
    cfg = _cfg(loss="cispo", cispo_clip_low=0.2, cispo_clip_high=0.28, loss_aggregation=mode)
    adv_BxT = np.broadcast_to(adv[:, None], logp.shape)
    with jax.enable_x64(True):
        ours = _ours(cfg, old, adv, mask)
        value, metrics = grpo.grpo_loss(jnp.asarray(logp), jnp.asarray(old), None, jnp.asarray(adv), jnp.asarray(mask),
                                        cfg)
        expected, clipfrac = _verl_cispo(np, old, logp, adv_BxT, mask, 0.2, 0.28, verl_mode)
        assert float(value) == pytest.approx(expected, rel=1e-6)
        assert float(metrics["clip_frac"]) == pytest.approx(clipfrac, rel=1e-6) and 0 < clipfrac < 1
        verl = jax.grad(lambda lp: _verl_cispo(jnp, jnp.asarray(old), lp, jnp.asarray(adv_BxT), jnp.asarray(mask),
                                               0.2, 0.28, verl_mode)[0])
        np.testing.assert_allclose(jax.grad(ours)(jnp.asarray(logp)), verl(jnp.asarray(logp)), rtol=1e-6, atol=1e-10)


# ------------------------------------------------------------------------------------------ SAPO
def test_sapo_hand_computed():
    """Rows A = +1 (τ_pos = 1) and A = −1 (τ_neg = 1.05), ρ = 1 and 1.5 each. Value −σ(τ(ρ − 1))·4/τ·A (2/τ·A at
    ρ = 1); gradient −4σ(1 − σ)·ρ·A, τ-free: −A at ρ = 1, PPO's on-policy gradient. Seq mean of token means: ¼ each."""
    logp = jnp.log(jnp.array([[1.0, 1.5], [1.0, 1.5]]))
    old, mask, adv = jnp.zeros((2, 2)), jnp.ones((2, 2), bool), jnp.array([1.0, -1.0])
    cfg = _cfg(loss="sapo")
    value, grad = jax.value_and_grad(lambda lp: grpo.grpo_loss(lp, old, None, adv, mask, cfg)[0])(logp)

    def sigma(x):
        return 1 / (1 + math.exp(-x))

    per_token = [[-2.0, -sigma(0.5) * 4], [2 / 1.05, sigma(1.05 * 0.5) * 4 / 1.05]]
    assert float(value) == pytest.approx(sum(map(sum, per_token)) / 4, abs=1e-6)  # float32: terms of ~2 cancel
    slope = [[-1.0, -4 * sigma(0.5) * (1 - sigma(0.5)) * 1.5], [1.0, 4 * sigma(0.525) * (1 - sigma(0.525)) * 1.5]]
    np.testing.assert_allclose(grad, np.array(slope) / 4, rtol=1e-6)
    # Far off-policy the gate fades smoothly instead of cutting at a clip: at ρ = 5 the gradient is 4σ(4)(1−σ(4))·5.
    far = jax.grad(lambda lp: grpo.grpo_loss(lp, old, None, adv, mask, cfg)[0])(jnp.full((2, 2), math.log(5.0)))
    assert float(far[0, 0]) == pytest.approx(-4 * sigma(4) * (1 - sigma(4)) * 5 / 4, rel=1e-5)


@pytest.mark.parametrize("level", grpo.IMPORTANCE_LEVELS)
def test_sapo_equals_trl_with_gradients(level):
    old, logp, adv, mask = _case(3)
    cfg = _cfg(loss="sapo", importance_level=level)
    with jax.enable_x64(True):
        ours = _ours(cfg, old, adv, mask)
        assert float(ours(jnp.asarray(logp))) == pytest.approx(_trl(np, logp, old, adv, mask, "sapo", level), rel=1e-6)
        trl = jax.grad(lambda lp: _trl(jnp, lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), "sapo", level))
        np.testing.assert_allclose(jax.grad(ours)(jnp.asarray(logp)), trl(jnp.asarray(logp)), rtol=1e-6, atol=1e-10)


def test_sapo_equals_verl_with_gradients():
    old, logp, adv, mask = _case(4)
    cfg = _cfg(loss="sapo", sapo_tau_pos=2.0, sapo_tau_neg=3.0)  # verl's tau_pos / tau_neg, away from the defaults
    adv_BxT = np.broadcast_to(adv[:, None], logp.shape)
    with jax.enable_x64(True):
        ours = _ours(cfg, old, adv, mask)
        assert float(ours(jnp.asarray(logp))) == pytest.approx(_verl_sapo(np, old, logp, adv_BxT, mask, 2.0, 3.0),
                                                               rel=1e-6)
        verl = jax.grad(lambda lp: _verl_sapo(jnp, jnp.asarray(old), lp, jnp.asarray(adv_BxT), jnp.asarray(mask),
                                              2.0, 3.0))
        np.testing.assert_allclose(jax.grad(ours)(jnp.asarray(logp)), verl(jnp.asarray(logp)), rtol=1e-6, atol=1e-10)


# -------------------------------------------------------------------------------------- entropy bonus
def _entropy_from_logits(xp, logits):
    """verl_F.entropy_from_logits: logsumexp(z) − Σ softmax(z)·z."""
    m = logits.max(-1, keepdims=True)
    lse = m[..., 0] + xp.log(xp.exp(logits - m).sum(-1))
    p = xp.exp(logits - lse[..., None])
    return lse - (p * logits).sum(-1)


def test_entropy_bonus_hand_computed():
    """Two-token vocabulary, logits (z, 0): p = σ(z), H = −p log p − (1 − p) log(1 − p), dH/dz = −p(1 − p)·z. With
    A = 0 the loss is −α·mean H and its gradient α·p(1 − p)·z / n: the bonus pushes towards p = ½."""
    z = jnp.array([[0.0, 1.0, -2.0]])
    mask, alpha = jnp.ones((1, 3), bool), 0.5
    cfg = _cfg(entropy_coef=alpha, loss_aggregation="token_mean")

    def loss(z):
        logits = jnp.stack([z, jnp.zeros_like(z)], -1)
        logp = jax.nn.log_softmax(logits)[..., 0]
        return grpo.grpo_loss(logp, jax.lax.stop_gradient(logp), None, jnp.zeros(1), mask, cfg,
                              entropy_BxT=_entropy_from_logits(jnp, logits))

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(z)
    p = 1 / (1 + np.exp(-np.asarray(z)))
    entropy = -p * np.log(p) - (1 - p) * np.log(1 - p)
    assert float(metrics["entropy_bonus"]) == pytest.approx(entropy.mean(), rel=1e-6)
    assert float(value) == pytest.approx(-alpha * entropy.mean(), rel=1e-6)
    np.testing.assert_allclose(grad, alpha * p * (1 - p) * np.asarray(z) / 3, rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="iff entropy_coef > 0"):
        grpo.grpo_loss(z, z, None, jnp.zeros(1), mask, cfg)
    with pytest.raises(ValueError, match="iff entropy_coef > 0"):
        grpo.grpo_loss(z, z, None, jnp.zeros(1), mask, _cfg(), entropy_BxT=z)


@pytest.mark.parametrize("mode, verl_mode", [("token_mean", "token-mean"), ("seq_mean_token_mean", "seq-mean-token-mean")])
def test_entropy_bonus_equals_verl_with_gradients(mode, verl_mode):
    """verl's actor: policy_loss = pg_loss − entropy_coeff · agg_loss(entropy_from_logits(logits), mask, mode), here
    with CISPO's pg_loss; gradients with respect to the logits, through the log-probs and the entropy."""
    rng = np.random.default_rng(5)
    old, _, adv, mask = _case(5)
    logits = rng.normal(0.0, 1.5, (*old.shape, 7))
    targets = rng.integers(0, 7, old.shape)
    cfg = _cfg(loss="cispo", cispo_clip_low=0.2, cispo_clip_high=0.28, loss_aggregation=mode, entropy_coef=0.03)
    adv_BxT = np.broadcast_to(adv[:, None], old.shape)

    def logp_of(xp, z):
        return xp.take_along_axis(jax.nn.log_softmax(z) if xp is jnp else z - np.log(np.exp(z).sum(-1, keepdims=True)),
                                  targets[..., None], -1)[..., 0]

    def verl(xp, z):
        pg, _ = _verl_cispo(xp, old, logp_of(xp, z), adv_BxT, mask, 0.2, 0.28, verl_mode)
        return pg - 0.03 * _agg(xp, _entropy_from_logits(xp, z), mask, verl_mode)

    def ours(z):
        return grpo.grpo_loss(logp_of(jnp, z), jnp.asarray(old), None, jnp.asarray(adv), jnp.asarray(mask), cfg,
                              entropy_BxT=_entropy_from_logits(jnp, z))[0]

    with jax.enable_x64(True):
        z = jnp.asarray(logits)
        assert float(ours(z)) == pytest.approx(verl(np, logits), rel=1e-6)
        np.testing.assert_allclose(jax.grad(ours)(z), jax.grad(lambda z: verl(jnp, z))(z), rtol=1e-6, atol=1e-10)

"""The multi-dimension RL recipe options (issue 21): dual-clip, GSPO's sequence-level ratio, the KL cap, truncated
importance sampling (behaviour correction), GDPO's per-dimension advantages and DAPO's overlong shaping.

Each option is checked against its published formula on hand-computed cases and, where verl has it, against
verl's code transcribed here as numpy (volcengine/verl, commit 012be9d9dcb7c38499f23616142870d2682757fc,
verl/trainer/ppo/core_algos.py: compute_policy_loss_vanilla, compute_policy_loss_gspo, kl_penalty), including
gradients. The defaults must leave today's GRPO untouched, exactly.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_jax import grpo
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.rubrics.schema import Anchor, ChangelogEntry, Dimension, Rubric, Scale
from rubric_jax.train import rollout


# ------------------------------------------------------------------------------------- verl, as numpy
def _verl_agg(loss_BxT, mask_BxT, mode):
    """verl's agg_loss for the two modes used here."""
    if mode == "token-mean":
        return (loss_BxT * mask_BxT).sum() / mask_BxT.sum()
    seq_B = (loss_BxT * mask_BxT).sum(-1) / mask_BxT.sum(-1)
    return seq_B.mean()


def _verl_vanilla(old, logp, adv_BxT, mask, low, high, c, mode="token-mean"):
    """compute_policy_loss_vanilla: PPO with verl's dual clip (clip_ratio_c)."""
    ratio = np.exp(np.clip(logp - old, -20, 20))
    pg1, pg2 = -adv_BxT * ratio, -adv_BxT * np.clip(ratio, 1 - low, 1 + high)
    clip1 = np.maximum(pg1, pg2)
    clip2 = np.minimum(-adv_BxT * c, clip1)
    return _verl_agg(np.where(adv_BxT < 0, clip2, clip1), mask, mode)


def _verl_gspo_value(old, logp, adv_BxT, mask, low, high):
    """compute_policy_loss_gspo's value (its stop-gradients change only the gradient)."""
    seq = ((logp - old) * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
    ratio = np.exp(np.minimum(np.broadcast_to(seq[:, None], logp.shape), 10.0))
    pg = np.maximum(-adv_BxT * ratio, -adv_BxT * np.clip(ratio, 1 - low, 1 + high))
    return _verl_agg(pg, mask, "seq-mean-token-mean")


def _trl_gspo_loss(logp, old, adv_B, mask, low, high):
    """TRL's importance_sampling_level="sequence" with loss_type "grpo" (seq mean of token means), as jnp:
    s_i = exp(mean log ratio), gradient through the mean (trl/trainer/grpo_trainer.py, _compute_loss)."""
    seq = ((logp - old) * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1)
    ratio = jnp.exp(seq)[:, None]
    per_token = -jnp.minimum(ratio * adv_B[:, None], jnp.clip(ratio, 1 - low, 1 + high) * adv_B[:, None])
    return (((per_token * mask).sum(-1)) / mask.sum(-1)).mean()


def _case(seed=0, b=4, t=6):
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.5, 0.5, (b, t))
    logp = old + rng.normal(0.0, 0.6, (b, t))
    mask = np.ones((b, t), bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    adv = np.array([1.3, -0.7, -2.0, 0.4])
    return old, logp, adv, mask


# ---------------------------------------------------------------------------------------- defaults
def test_defaults_are_todays_grpo_exactly():
    """Default options: the objective is today's formula bit for bit, and so are the advantages."""
    old, logp, adv, mask = (jnp.asarray(x) for x in _case())
    cfg = grpo.GRPOConfig(group_size=2, kl_coef=0.05)
    ref = logp - 0.3
    loss, metrics = grpo.grpo_loss(logp, old, ref, adv, mask, cfg)
    ratio = jnp.exp(jnp.clip(jnp.where(mask, logp - old, 0.0), -20, 20))
    a = adv[:, None]
    pg = jnp.where(mask, -jnp.minimum(ratio * a, jnp.clip(ratio, 0.8, 1.2) * a), 0.0)
    log_r = jnp.where(mask, ref - logp, 0.0)
    kl = jnp.expm1(log_r) - log_r
    w = grpo.loss_weights(mask, "seq_mean_token_mean")
    assert float(loss) == float(jnp.sum(w * pg) + 0.05 * jnp.sum(w * kl))
    scored = RewardOutput(np.zeros((4, 1)), np.ones((4, 1), bool), np.array([0.1, 0.9, 0.3, 0.3], np.float32), ["d"],
                          {"reward_ok": np.ones(4, bool)})
    out = rollout.rollout_advantages(scored, cfg, "renormalize")
    expected, zero_std = grpo.group_advantages(scored.reward, 2, scaling="group", eps=cfg.advantage_eps)
    np.testing.assert_array_equal(out.advantages_N, np.asarray(expected))
    assert out.zero_std_frac == float(zero_std) and out.metrics == {}


@pytest.mark.parametrize("field,value", [("clip_ratio_c", 1.0), ("clip_ratio_c", -3.0), ("kl_cap", 0.0),
                                         ("behaviour_correction_cap", float("nan")), ("importance_level", "tokens")])
def test_config_refuses_bad_options(field, value):
    with pytest.raises(ValueError, match=f"GRPOConfig.{field}="):
        grpo.GRPOConfig(**{field: value})


# ---------------------------------------------------------------------------------------- dual clip
def test_dual_clip_hand_computed():
    """ρ = 5, A = −1: PPO's loss is −min(−5, −1.2) = 5; dual-clip with c = 3 caps it at 3 (zero gradient)."""
    mask = jnp.ones((1, 1), bool)
    old = jnp.zeros((1, 1))

    def loss(logp, c):
        return grpo.clipped_surrogate(logp, old, jnp.array([-1.0]), mask, 0.2, 0.2, clip_ratio_c=c)[0].sum()

    logp = jnp.log(jnp.full((1, 1), 5.0))
    assert float(loss(logp, None)) == pytest.approx(5.0)
    assert float(loss(logp, 3.0)) == pytest.approx(3.0)
    assert float(jax.grad(loss)(logp, 3.0)[0, 0]) == 0.0
    _, low, _ = grpo.clipped_surrogate(logp, old, jnp.array([-1.0]), mask, 0.2, 0.2, clip_ratio_c=3.0)
    assert float(low[0, 0]) == 1.0
    # ρ = 2 < c: dual clip is inactive, PPO's loss and gradient stand.
    logp = jnp.log(jnp.full((1, 1), 2.0))
    assert float(loss(logp, 3.0)) == pytest.approx(2.0)
    assert float(jax.grad(loss)(logp, 3.0)[0, 0]) == pytest.approx(2.0)
    # A positive advantage is never dual-clipped.
    pos = grpo.clipped_surrogate(jnp.log(jnp.full((1, 1), 5.0)), old, jnp.array([1.0]), mask, 0.2, 0.2,
                                 clip_ratio_c=3.0)[0]
    assert float(pos[0, 0]) == pytest.approx(-1.2)


def test_dual_clip_equals_verl():
    old, logp, adv, mask = _case(1)
    cfg = grpo.GRPOConfig(group_size=2, kl_coef=0.0, clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0,
                          loss_aggregation="token_mean")
    loss, _ = grpo.grpo_loss(jnp.asarray(logp), jnp.asarray(old), None, jnp.asarray(adv), jnp.asarray(mask), cfg)
    expected = _verl_vanilla(old, logp, np.broadcast_to(adv[:, None], logp.shape), mask, 0.2, 0.28, 3.0)
    assert float(loss) == pytest.approx(expected, rel=1e-6)


# ------------------------------------------------------------------------------------------- GSPO
def test_sequence_ratio_hand_computed():
    """Two tokens with log ratios 0.1 and 0.3: both carry s = e^0.2; d loss / d log π_t = −s·A / 2 each."""
    old = jnp.zeros((1, 2))
    mask = jnp.ones((1, 2), bool)
    cfg = grpo.GRPOConfig(group_size=2, kl_coef=0.0, importance_level="sequence", clip_high=0.28)

    def loss(logp):
        return grpo.grpo_loss(logp, old, None, jnp.array([1.0]), mask, cfg)[0]

    logp = jnp.array([[0.1, 0.3]])
    s = math.exp(0.2)
    assert float(loss(logp)) == pytest.approx(-s)
    np.testing.assert_allclose(jax.grad(loss)(logp), [[-s / 2, -s / 2]], rtol=1e-6)
    # Past the clip (s > 1.28 with A > 0): no gradient, counted as clipped high.
    logp = jnp.array([[0.5, 0.5]])
    assert float(loss(logp)) == pytest.approx(-1.28)
    np.testing.assert_allclose(jax.grad(loss)(logp), [[0.0, 0.0]])


def test_sequence_ratio_equals_verl_and_trl_with_gradients():
    old, logp, adv, mask = _case(2)
    cfg = grpo.GRPOConfig(group_size=2, kl_coef=0.0, importance_level="sequence", clip_low=0.2, clip_high=0.28)
    with jax.enable_x64(True):
        args = [jnp.asarray(x) for x in (old, adv, mask)]

        def ours(lp):
            return grpo.grpo_loss(lp, args[0], None, args[1], args[2], cfg)[0]

        lp = jnp.asarray(logp)
        # Loss weights are float32 (the batch's aggregation weights), hence 1e-6, not float64 round-off.
        assert float(ours(lp)) == pytest.approx(_verl_gspo_value(old, logp, adv[:, None], mask, 0.2, 0.28), rel=1e-6)
        trl = lambda x: _trl_gspo_loss(x, args[0], args[1], args[2], 0.2, 0.28)  # noqa: E731
        assert float(ours(lp)) == pytest.approx(float(trl(lp)), rel=1e-6)
        np.testing.assert_allclose(jax.grad(ours)(lp), jax.grad(trl)(lp), rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------------------------------ KL cap
def test_kl_cap_hand_computed_and_as_verl():
    """k3 of log r = 15 is e^15 − 16 ≈ 3.3e6; capped at 10 (verl's low_var_kl clamp)."""
    mask = jnp.ones((1, 1), bool)
    logp, ref = jnp.array([[-16.0]]), jnp.array([[-1.0]])
    assert float(grpo.kl_estimate(logp, ref, mask, "k3")[0, 0]) == pytest.approx(math.expm1(15.0) - 15.0)
    assert float(grpo.kl_estimate(logp, ref, mask, "k3", cap=10.0)[0, 0]) == 10.0
    rng = np.random.default_rng(3)
    lp, rf = rng.normal(-2, 3, (3, 5)), rng.normal(-2, 3, (3, 5))
    kl = rf - lp
    verl = np.clip(np.exp(np.clip(kl, -20, 20)) - np.clip(kl, -20, 20) - 1, -10, 10)
    ours = grpo.kl_estimate(jnp.asarray(lp), jnp.asarray(rf), jnp.ones((3, 5), bool), "k3", cap=10.0)
    np.testing.assert_allclose(ours, verl, rtol=1e-5)


# ------------------------------------------------------------------------ truncated importance sampling
def test_behaviour_weights_truncate_and_scale_the_policy_gradient():
    mask = jnp.array([[True, True, True, False]])
    old = jnp.log(jnp.array([[0.5, 0.2, 0.9, 0.3]]))
    sampler = jnp.log(jnp.array([[0.25, 0.4, 0.1, 0.3]]))
    w = grpo.behaviour_weights(old, sampler, mask, cap=2.0)
    np.testing.assert_allclose(w, [[2.0, 0.5, 2.0, 1.0]], rtol=1e-6)  # 2 (=cap), 0.5, 9 -> 2; masked: 1
    cfg = grpo.GRPOConfig(group_size=2, kl_coef=0.0, behaviour_correction_cap=2.0, loss_aggregation="token_mean")
    plain = grpo.GRPOConfig(group_size=2, kl_coef=0.0, loss_aggregation="token_mean")
    logp = old + 0.05

    def loss(lp, c, weights):
        return grpo.grpo_loss(lp, old, None, jnp.array([1.0]), mask, c, weights)[0]

    g_plain, g_tis = jax.grad(loss)(logp, plain, None), jax.grad(loss)(logp, cfg, w)
    np.testing.assert_allclose(g_tis, g_plain * jnp.where(mask, w, 0.0), rtol=1e-6)
    with pytest.raises(ValueError, match="behaviour weights must be given"):
        loss(logp, cfg, None)


# ----------------------------------------------------------------------------------------- GDPO
def _dim(dim_id, weight=1.0, gate=False):
    return Dimension(dim_id, dim_id, "rule", Scale.binary(), {0: Anchor("no"), 1: Anchor("yes")}, weight=weight,
                     gate=gate, rule="length", params={"unit": "chars", "max": 10})


_LOG = (ChangelogEntry("1.0.0", "first", "test"),)


def _scored(scores, valid=None):
    scores = np.asarray(scores, np.float64)
    valid = ~np.isnan(scores) if valid is None else valid
    ids = [f"d{j}" for j in range(scores.shape[1])]
    return RewardOutput(scores, valid, np.zeros(len(scores), np.float32), ids, {"reward_ok": np.ones(len(scores), bool)})


def _gdpo_by_hand(scores_NxD, weights_D, group, eps=1e-6):
    """The GDPO paper's three steps with plain loops (no masking: every score present)."""
    n, d = scores_NxD.shape
    adv = np.zeros((n, d))
    for g in range(n // group):
        rows = slice(g * group, (g + 1) * group)
        for k in range(d):
            x = scores_NxD[rows, k]
            adv[rows, k] = 0.0 if x.max() == x.min() else (x - x.mean()) / (x.std(ddof=1) + eps)
    total = adv @ (np.asarray(weights_D) / np.sum(weights_D))
    return (total - total.mean()) / (total.std(ddof=1) + eps)


def test_per_dimension_advantages_equal_the_gdpo_formula():
    scores = np.array([[1, 0.2], [0, 0.9], [1, 0.5], [0, 0.1], [1, 0.3], [1, 0.8], [0, 0.4], [1, 0.6]])
    rubric = Rubric("r", "1.0.0", _LOG, (_dim("d0", 3.0), _dim("d1", 1.0)))
    cfg = grpo.GRPOConfig(group_size=4)
    out = rollout.rollout_advantages(_scored(scores), cfg, "renormalize", rollout.Shaping("per_dimension"),
                                     rubrics=[rubric] * 8)
    np.testing.assert_allclose(out.advantages_N, _gdpo_by_hand(scores, [3.0, 1.0], 4), rtol=1e-5, atol=1e-6)
    assert set(out.metrics) == {"advantage/d0", "advantage/d1"} and out.metrics["advantage/d0"] > 0
    # GDPO differs from GRPO on the weighted sum: the wide-spread dimension d0 no longer drowns d1.
    summed = (scores @ np.array([0.75, 0.25])).astype(np.float32)
    grpo_adv, _ = grpo.group_advantages(summed, 4)
    assert not np.allclose(out.advantages_N, np.asarray(grpo_adv), atol=1e-3)


def test_per_dimension_gates_missing_scores_and_degenerate_groups():
    rubric = Rubric("r", "1.0.0", _LOG, (_dim("d0", gate=True), _dim("d1"), _dim("d2")))
    cfg = grpo.GRPOConfig(group_size=2)
    # Group 0: the second row fails its gate, so its d1/d2 count as 0 although they scored 1.
    # Group 1: d2 missing on one row; only d1 varies.
    scores = np.array([[1, 1, 0], [0, 1, 1], [1, 0, np.nan], [1, 1, 0]])
    out = rollout.rollout_advantages(_scored(scores), cfg, "renormalize", rollout.Shaping("per_dimension"),
                                     rubrics=[rubric] * 4)
    assert out.advantages_N[0] > 0 > out.advantages_N[1]  # the gated row is the worse of its group
    assert out.advantages_N[3] > out.advantages_N[2]
    assert out.zero_std_frac == 0.0
    # Every group constant in every dimension: no gradient anywhere, every group counted.
    flat = np.array([[1, 1, 0], [1, 1, 0], [1, 0, 1], [1, 0, 1]])
    out = rollout.rollout_advantages(_scored(flat), cfg, "renormalize", rollout.Shaping("per_dimension"),
                                     rubrics=[rubric] * 4)
    np.testing.assert_array_equal(out.advantages_N, 0.0)
    assert out.zero_std_frac == 1.0
    # A group with one scorable row (the other's reward not ok) carries no gradient.
    scored = _scored(scores)
    scored.details["reward_ok"][3] = False
    out = rollout.rollout_advantages(scored, cfg, "renormalize", rollout.Shaping("per_dimension"),
                                     rubrics=[rubric] * 4)
    assert out.advantages_N[2] == 0.0 and out.advantages_N[3] == 0.0 and not out.trainable_N[3]


# ------------------------------------------------------------------------------------------ DAPO
def test_overlong_penalty_hand_computed():
    """L_max 100, L_cache 20: 0 up to 80 tokens, then linear to −1 at 100 (DAPO eq. 13)."""
    np.testing.assert_allclose(rollout.overlong_penalty(np.array([10, 80, 90, 95, 100]), 100, 20, 1.0),
                               [0, 0, -0.5, -0.75, -1.0])
    np.testing.assert_allclose(rollout.overlong_penalty(np.array([90]), 100, 20, 0.5), [-0.25])


def test_overlong_shaping_and_truncation_masking():
    cfg = grpo.GRPOConfig(group_size=2)
    scored = _scored(np.zeros((4, 1)))
    scored = RewardOutput(scored.scores, scored.valid, np.array([0.5, 0.5, 0.2, 0.6], np.float32), ["d0"],
                          scored.details)
    lengths, truncated = np.array([50, 95, 100, 100]), np.array([False, False, True, True])
    shaped = rollout.rollout_advantages(scored, cfg, "renormalize", rollout.Shaping(overlong_buffer=20,
                                                                                   max_new_tokens=100),
                                        lengths_N=lengths, truncated_N=truncated)
    assert shaped.advantages_N[0] > 0 > shaped.advantages_N[1]  # equal rewards, the long one penalised
    assert shaped.metrics["overlong_penalty/mean"] == pytest.approx((0 - 0.75 - 1 - 1) / 4)
    masked = rollout.rollout_advantages(scored, cfg, "renormalize", rollout.Shaping(mask_truncated=True,
                                                                                   max_new_tokens=100),
                                        lengths_N=lengths, truncated_N=truncated)
    np.testing.assert_array_equal(masked.trainable_N, [True, True, False, False])
    np.testing.assert_array_equal(masked.advantages_N[2:], 0.0)
    assert masked.metrics["truncated_masked"] == 2.0
    # Every response truncated: nothing trains, nothing breaks.
    everything = rollout.rollout_advantages(scored, cfg, "renormalize", rollout.Shaping(mask_truncated=True,
                                                                                       max_new_tokens=100),
                                            lengths_N=lengths, truncated_N=np.ones(4, bool))
    assert not everything.trainable_N.any() and everything.zero_std_frac == 1.0


@pytest.mark.parametrize("kw,match", [({"advantage": "gdpo"}, "advantage="),
                                      ({"overlong_buffer": 100, "max_new_tokens": 100}, "overlong_buffer="),
                                      ({"overlong_penalty": 0.0}, "overlong_penalty=")])
def test_shaping_refuses_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        rollout.Shaping(**kw)


def test_the_recipe_sweep_validates_every_variant():
    """configs/tiny_recipe.py: the baseline and each option alone, 3 seeds each; every variant resolves and
    validates as experiments.run would (unknown keys and bad values fail here, not mid-sweep)."""
    from pathlib import Path

    from rubric_jax import sweeps

    sweep = sweeps.load_sweep(str(Path(__file__).resolve().parents[2] / "configs" / "tiny_recipe.py"))
    names = [v.name for v in sweep.variants]
    assert len(names) == 30 == len(set(names))
    assert {"seed=0", "advantage=per_dimension,seed=2", "behaviour_correction_cap=2.0,recompute_old_logprobs=True,"
            "seed=1", "rubric_hints=1.0,recompute_old_logprobs=True,seed=0"} <= set(names)

"""GRPO maths as pure functions: group advantages, the policy losses (PPO's clipped surrogate, CISPO, SAPO), KL
estimators, the entropy bonus, loss aggregation, and the teacher-forced log-probs (over vocabulary slices: never
[B, T, V] float32 logits at once), per row (`sequence_logprobs`, SFT) or with each group's shared prompt run once
(`shared_prompt_logprobs`, GRPO).

Shapes: B sequences (rows b*G + j is sample j of question b, the sampler's order), G group size,
T token positions, D hidden, V vocab, C the log-prob chunk size (B·C·V logits at a time), U prompts
(B = U·G), P prompt slots, R response slots.

Token alignment: every per-token array [B, T] is aligned with `tokens_BxT`; entry t refers to the
prediction of token t from tokens < t (so entry 0 is never a target). `mask_BxT` is True on the
response tokens that are trained on; prompt and padding positions are False and never contribute.

Loss aggregation is written as fixed per-token weights computed from the *whole* batch's mask
(`loss_weights`), so a loss is a weighted sum of per-token terms: micro-batches add up exactly to the
full-batch loss, and appending padding changes nothing.

Temperature: rollouts sampled at temperature T come from softmax(logits / T), so every log-prob of the
objective (current policy, behaviour, reference) is of that tempered distribution, on the sampler's
side and the trainer's (`GRPOConfig.temperature`; TRL and verl do the same). Otherwise the first
update's ratio is not 1 and the importance weights are wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from rubric_jax.models.accumulating_layers import AccumulatingLayers, use_copy
from rubric_jax.models.transformer import causal_padding_mask, padding_to_positions

KL_ESTIMATORS = ("k1", "k2", "k3")
ADVANTAGE_SCALINGS = ("group", "batch", "none")
IMPORTANCE_LEVELS = ("token", "sequence")
LOSSES = ("grpo", "cispo", "sapo")
# GRPOConfig fields that the config's rl block holds under the same names (train/settings.py passes them through).
LOSS_KEYS = ("loss", "cispo_clip_low", "cispo_clip_high", "sapo_tau_pos", "sapo_tau_neg", "entropy_coef")
# The fields only a non-default policy loss reads (one changed from its default is refused under another loss).
_LOSS_FIELDS = {"cispo": ("cispo_clip_low", "cispo_clip_high"), "sapo": ("sapo_tau_pos", "sapo_tau_neg")}
# |log ratio| bound before exp (verl's ±20): a large drift with a zero advantage stays 0, not inf * 0 = NaN.
LOG_RATIO_CLAMP = 20.0


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """GRPO objective settings, validated at construction (defaults follow RubricRL §4.3)."""

    group_size: int = 8
    """Responses sampled per question (RubricRL §4.3: 8 balances normalisation noise and cost; QuRL: 8); at least 2,
    bounded by config.rl.group_size (train/blocks.py RLBlock)."""
    kl_coef: float = 0.02
    """β of the KL-to-reference penalty (RubricRL §4.3: 0.01–0.05); 0 skips the reference forward."""
    kl_estimator: str = "k3"
    """Per-token KL estimator of KL(π‖π_ref): k1, k2 or k3 (Schulman 2020; k3 is GRPO's, DeepSeekMath)."""
    clip_low: float = 0.2
    """ε_low: ratio lower bound 1 − ε_low (RubricRL §4.3: 0.2, up to 0.3 for noisy rubric scores)."""
    clip_high: float = 0.2
    """ε_high: ratio upper bound 1 + ε_high; > ε_low is DAPO's clip-higher (DAPO uses 0.28)."""
    advantage_scaling: str = "group"
    """Divide centred rewards by the group std ("group", GRPO; RubricRL §4.2), the batch std ("batch"),
    or not at all ("none", Dr. GRPO: std scaling biases towards easy/hard questions)."""
    advantage_eps: float = 1e-6
    """Added to the std before dividing (RubricRL §5.3 pseudo-code adds a small constant)."""
    loss_aggregation: str = "seq_mean_token_mean"
    """How per-token terms become a scalar: see AGGREGATIONS (GRPO / DAPO token_mean / Dr. GRPO)."""
    loss_norm_length: int | None = None
    """Constant divisor of "seq_mean_token_sum_norm" (Dr. GRPO: the max response length); else None."""
    logprob_chunk_size: int = 256
    """C: bounds the chunked log-softmax's logits to B·C·V floats (it runs over vocabulary slices of at most
    V·C/T ids, `chunked_token_logprobs`)."""
    temperature: float = 1.0
    """Rollout sampling temperature T: log-probs are those of softmax(logits / T) (TRL, verl)."""
    importance_level: str = "token"
    """"token": PPO's per-token ratio π/π_old; "sequence": GSPO's length-normalised sequence ratio
    s_i = exp(mean_t log π/π_old), the same for every token of a response (Zheng et al. 2025, arXiv 2507.18071;
    TRL `importance_sampling_level`, verl `policy_loss.loss_mode=gspo`)."""
    clip_ratio_c: float | None = None
    """Dual-clip PPO (Ye et al. 2020, arXiv 1912.09729; verl `clip_ratio_c`, default 3 there): for A < 0 the loss
    is at most −c·A however large the ratio; None = off. Must be > 1."""
    kl_cap: float | None = None
    """Per-token KL estimate clipped to [−cap, cap] (verl clamps its k3 "low_var_kl" to ±10); None = off."""
    behaviour_correction_cap: float | None = None
    """Truncated importance sampling between trainer and sampler (Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training"; TRL `vllm_importance_sampling_cap`, verl `tis_imp_ratio_cap`):
    each token's policy-gradient term is weighted by min(π_old_trainer / π_sampler, C); None = off. The weights
    travel in the batch (`behaviour_weight`), computed once per rollout."""
    loss: str = "grpo"
    """Policy loss: "grpo" (PPO's clipped surrogate, `clipped_surrogate`), "cispo" (`cispo_surrogate`) or "sapo"
    (`sapo_surrogate`); TRL `loss_type`, verl `actor.policy_loss.loss_mode`."""
    cispo_clip_low: float = 1.0
    """CISPO's ε_low: the IS weight is clipped below at 1 − ε_low (MiniMax-M1, arXiv 2506.13585: no lower bound in
    practice, i.e. 1)."""
    cispo_clip_high: float = 4.0
    """CISPO's ε_high: the IS weight is clipped above at 1 + ε_high (TRL's recommended weight cap 5.0, from ScaleRL)."""
    sapo_tau_pos: float = 1.0
    """SAPO's gate temperature τ_pos for A > 0 (Qwen, arXiv 2511.20347; TRL `sapo_temperature_pos`, verl `tau_pos`)."""
    sapo_tau_neg: float = 1.05
    """SAPO's τ_neg for A ≤ 0 (TRL `sapo_temperature_neg`, verl `tau_neg`: 1.05; the paper keeps τ_neg > τ_pos)."""
    entropy_coef: float = 0.0
    """Entropy bonus: minus this times the full-distribution entropy of softmax(logits / T) at each response token,
    aggregated as the loss (verl `entropy_coeff`, TRL `entropy_coef`); 0 = off (no entropy in the gradient)."""

    def __post_init__(self) -> None:
        def fail(field: str, why: str) -> None:
            raise ValueError(f"GRPOConfig.{field}={getattr(self, field)!r}: {why}")

        if not math.isfinite(self.kl_coef) or self.kl_coef < 0:
            fail("kl_coef", "must be finite and >= 0")
        if self.kl_estimator not in KL_ESTIMATORS:
            fail("kl_estimator", f"must be one of {KL_ESTIMATORS}")
        if not 0 <= self.clip_low < 1:
            fail("clip_low", "must satisfy 0 <= clip_low < 1 (ratio lower bound 1 - clip_low > 0)")
        if not math.isfinite(self.clip_high) or self.clip_high < self.clip_low:
            fail("clip_high", f"must be finite and >= clip_low={self.clip_low} (clip-higher only widens)")
        if self.advantage_scaling not in ADVANTAGE_SCALINGS:
            fail("advantage_scaling", f"must be one of {ADVANTAGE_SCALINGS}")
        if not (math.isfinite(self.advantage_eps) and self.advantage_eps > 0):
            fail("advantage_eps", "must be > 0")
        if self.loss_aggregation not in AGGREGATIONS:
            fail("loss_aggregation", f"must be one of {sorted(AGGREGATIONS)}")
        needs_length = self.loss_aggregation == "seq_mean_token_sum_norm"
        if needs_length and not (isinstance(self.loss_norm_length, int) and self.loss_norm_length > 0):
            fail("loss_norm_length", "seq_mean_token_sum_norm needs a positive int (e.g. max response length)")
        if not needs_length and self.loss_norm_length is not None:
            fail("loss_norm_length", f"only used by seq_mean_token_sum_norm, not {self.loss_aggregation!r}")
        if not isinstance(self.logprob_chunk_size, int) or self.logprob_chunk_size < 1:
            fail("logprob_chunk_size", "must be a positive integer")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            fail("temperature", "must be finite and > 0 (the rollout sampler's temperature)")
        if self.importance_level not in IMPORTANCE_LEVELS:
            fail("importance_level", f"must be one of {IMPORTANCE_LEVELS}")
        for field, minimum in (("clip_ratio_c", 1.0), ("kl_cap", 0.0), ("behaviour_correction_cap", 0.0)):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > minimum):
                fail(field, f"must be None (off) or a finite number > {minimum:g}")
        self._check_loss(fail)

    def _check_loss(self, fail: Callable[[str, str], None]) -> None:
        """The policy loss and its parameters: each in range, and none changed that the chosen loss does not read."""
        if self.loss not in LOSSES:
            fail("loss", f"must be one of {LOSSES}")
        if not 0 <= self.cispo_clip_low <= 1:
            fail("cispo_clip_low", "must satisfy 0 <= cispo_clip_low <= 1 (weight floor 1 - cispo_clip_low; 1 = none)")
        for field in ("cispo_clip_high", "sapo_tau_pos", "sapo_tau_neg"):
            if not (math.isfinite(getattr(self, field)) and getattr(self, field) > 0):
                fail(field, "must be finite and > 0")
        if not (math.isfinite(self.entropy_coef) and self.entropy_coef >= 0):
            fail("entropy_coef", "must be finite and >= 0 (0 = no entropy bonus)")
        if self.clip_ratio_c is not None and self.loss != "grpo":
            fail("clip_ratio_c", f"dual-clip bounds PPO's clipped loss: only with loss='grpo', not {self.loss!r}")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for loss, fields in _LOSS_FIELDS.items():
            for field in fields:
                if self.loss != loss and getattr(self, field) != defaults[field]:
                    fail(field, f"only read by loss={loss!r}, not {self.loss!r}")


# ---------------------------------------------------------------------------------------------------
# Advantages


def group_advantages(
    rewards_N: jax.Array,
    group_size: int,
    *,
    scaling: str = "group",
    eps: float = 1e-6,
    valid_N: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Per-question normalised rewards and the fraction of groups with zero reward spread.

    Samples that are invalid (`valid_N` False, or a non-finite reward) are left out of their group's
    mean/std and get advantage 0. A group whose valid rewards are all equal (or that has fewer than
    two valid samples) gets advantage 0 everywhere and is counted in the returned fraction. The std
    is the sample std (ddof=1, as torch's `.std()` in the RubricRL §5.3 pseudo-code).
    """
    if scaling not in ADVANTAGE_SCALINGS:
        raise ValueError(f"scaling={scaling!r}: must be one of {ADVANTAGE_SCALINGS}")
    rewards_N = jnp.asarray(rewards_N)
    if rewards_N.ndim != 1 or rewards_N.shape[0] % group_size:
        raise ValueError(f"rewards shape {rewards_N.shape}: expected [N] with N a multiple of group_size={group_size}")
    n = rewards_N.shape[0]
    dtype = rewards_N.dtype if jnp.issubdtype(rewards_N.dtype, jnp.floating) else jnp.float32
    rewards_N = rewards_N.astype(dtype)
    valid_N = jnp.isfinite(rewards_N) if valid_N is None else jnp.asarray(valid_N, bool) & jnp.isfinite(rewards_N)
    r_BxG = jnp.where(valid_N, rewards_N, 0).reshape(-1, group_size)
    v_BxG = valid_N.reshape(-1, group_size)

    count_B = v_BxG.sum(-1)
    mean_B = r_BxG.sum(-1) / jnp.maximum(count_B, 1)
    centred_BxG = jnp.where(v_BxG, r_BxG - mean_B[:, None], 0)
    r_max = jnp.where(v_BxG, r_BxG, -jnp.inf).max(-1)
    r_min = jnp.where(v_BxG, r_BxG, jnp.inf).min(-1)
    degenerate_B = (count_B < 2) | (r_max == r_min)

    if scaling == "group":
        var_B = (centred_BxG**2).sum(-1) / jnp.maximum(count_B - 1, 1)
        adv_BxG = centred_BxG / (jnp.sqrt(var_B)[:, None] + eps)
    elif scaling == "batch":
        total = valid_N.sum()
        batch_mean = jnp.where(valid_N, rewards_N, 0).sum() / jnp.maximum(total, 1)
        batch_var = (jnp.where(valid_N, rewards_N - batch_mean, 0) ** 2).sum() / jnp.maximum(total - 1, 1)
        adv_BxG = centred_BxG / (jnp.sqrt(batch_var) + eps)
    else:
        adv_BxG = centred_BxG
    adv_BxG = jnp.where(v_BxG & ~degenerate_B[:, None], adv_BxG, 0)
    return adv_BxG.reshape(n), degenerate_B.mean(dtype=jnp.float32)


# ---------------------------------------------------------------------------------------------------
# Per-token terms


def _log_ratio(logp_BxT: jax.Array, other_logp_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    """log π − log π_other on masked positions, exactly 0 elsewhere (padding may hold anything)."""
    return jnp.where(mask_BxT, logp_BxT - other_logp_BxT, 0.0)


def _clamped_log_ratio(logp_BxT: jax.Array, other_logp_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    """`_log_ratio` clamped to ±LOG_RATIO_CLAMP, for exp (verl)."""
    return jnp.clip(_log_ratio(logp_BxT, other_logp_BxT, mask_BxT), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def importance_log_ratio(logp_BxT: jax.Array, old_logp_BxT: jax.Array, mask_BxT: jax.Array,
                         level: str = "token") -> jax.Array:
    """log ρ per token, clamped to ±LOG_RATIO_CLAMP, 0 on masked positions.

    "token": log π_t − log π_old,t (PPO). "sequence" (GSPO): log s_i + log π_t − sg(log π_t), with
    log s_i = sg(mean over the response's tokens of log π/π_old): every token carries its sequence's ratio in
    value, and its gradient is s_i ∇log π_t (verl's straight-through form; with a seq-mean-token-mean
    aggregation equal to TRL's gradient of exp(mean log ratio)).
    """
    if level == "token":
        return _clamped_log_ratio(logp_BxT, old_logp_BxT, mask_BxT)
    if level != "sequence":
        raise ValueError(f"importance level {level!r}: must be one of {IMPORTANCE_LEVELS}")
    log_ratio_BxT = _log_ratio(logp_BxT, old_logp_BxT, mask_BxT)
    count_B = jnp.maximum(mask_BxT.sum(-1), 1)
    seq_B = jax.lax.stop_gradient(log_ratio_BxT.sum(-1) / count_B)
    token_BxT = logp_BxT - jax.lax.stop_gradient(logp_BxT) + seq_B[:, None]
    return jnp.where(mask_BxT, jnp.clip(token_BxT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)


def clipped_surrogate(
    logp_BxT: jax.Array,
    old_logp_BxT: jax.Array,
    advantages_B: jax.Array,
    mask_BxT: jax.Array,
    clip_low: float,
    clip_high: float,
    *,
    level: str = "token",
    clip_ratio_c: float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """PPO clipped policy loss per token, −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A), ρ = π/π_behaviour at `level`
    (`importance_log_ratio`); with `clip_ratio_c` (dual-clip), a negative advantage's loss is at most −c·A.

    Returns (loss_BxT, clipped_low_BxT, clipped_high_BxT); the clip indicators are 1.0 where a clipped
    branch (ratio or dual clip) is active (its gradient is zero). Masked positions are exactly 0. log ρ is
    clamped to ±LOG_RATIO_CLAMP before exp, so a huge drift gives a finite ρ (and 0 loss where A = 0).
    """
    ratio_BxT = jnp.exp(importance_log_ratio(logp_BxT, old_logp_BxT, mask_BxT, level))
    adv_BxT = advantages_B[:, None].astype(ratio_BxT.dtype)
    unclipped_BxT = ratio_BxT * adv_BxT
    clipped_BxT = jnp.clip(ratio_BxT, 1.0 - clip_low, 1.0 + clip_high) * adv_BxT
    per_token_BxT = -jnp.minimum(unclipped_BxT, clipped_BxT)
    is_low = mask_BxT & (ratio_BxT < 1.0 - clip_low) & (adv_BxT < 0)
    if clip_ratio_c is not None:
        dual_BxT = -clip_ratio_c * adv_BxT
        is_low = is_low | (mask_BxT & (adv_BxT < 0) & (per_token_BxT > dual_BxT))
        per_token_BxT = jnp.where(adv_BxT < 0, jnp.minimum(per_token_BxT, dual_BxT), per_token_BxT)
    loss_BxT = jnp.where(mask_BxT, per_token_BxT, 0.0)
    is_high = mask_BxT & (ratio_BxT > 1.0 + clip_high) & (adv_BxT > 0)
    return loss_BxT, is_low.astype(loss_BxT.dtype), is_high.astype(loss_BxT.dtype)


def _ratio_and_advantage(logp_BxT: jax.Array, old_logp_BxT: jax.Array, advantages_B: jax.Array, mask_BxT: jax.Array,
                         level: str) -> tuple[jax.Array, jax.Array]:
    """ρ per token at `level` (`importance_log_ratio`, clamped before exp) and the advantage broadcast to [B, T]."""
    ratio_BxT = jnp.exp(importance_log_ratio(logp_BxT, old_logp_BxT, mask_BxT, level))
    return ratio_BxT, advantages_B[:, None].astype(ratio_BxT.dtype)


def cispo_surrogate(logp_BxT: jax.Array, old_logp_BxT: jax.Array, advantages_B: jax.Array, mask_BxT: jax.Array,
                    clip_low: float, clip_high: float, *, level: str = "token"
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """CISPO per token, −sg(clip(ρ, 1 − ε_low, 1 + ε_high))·A·log π (MiniMax-M1, arXiv 2506.13585; verl
    `compute_policy_loss_cispo`, TRL loss_type="cispo"): the IS weight is clipped, not the update, so every token
    keeps its gradient −w·A (PPO's clipped tokens get none). ρ at `level` as `clipped_surrogate`'s.

    Returns (loss_BxT, clipped_low_BxT, clipped_high_BxT): the indicators are 1.0 where the weight was truncated
    (below 1 − ε_low, above 1 + ε_high), whatever the advantage's sign (verl's clip fraction, split by side)."""
    ratio_BxT, adv_BxT = _ratio_and_advantage(logp_BxT, old_logp_BxT, advantages_B, mask_BxT, level)
    weight_BxT = jax.lax.stop_gradient(jnp.clip(ratio_BxT, 1.0 - clip_low, 1.0 + clip_high))
    loss_BxT = jnp.where(mask_BxT, -weight_BxT * adv_BxT * jnp.where(mask_BxT, logp_BxT, 0.0), 0.0)
    is_low = mask_BxT & (ratio_BxT < 1.0 - clip_low)
    is_high = mask_BxT & (ratio_BxT > 1.0 + clip_high)
    return loss_BxT, is_low.astype(loss_BxT.dtype), is_high.astype(loss_BxT.dtype)


def sapo_surrogate(logp_BxT: jax.Array, old_logp_BxT: jax.Array, advantages_B: jax.Array, mask_BxT: jax.Array,
                   tau_pos: float, tau_neg: float, *, level: str = "token") -> tuple[jax.Array, jax.Array, jax.Array]:
    """SAPO per token, −f(ρ)·A with the soft gate f(ρ) = σ(τ(ρ − 1))·4/τ, τ = τ_pos where A > 0 else τ_neg (Qwen,
    arXiv 2511.20347; verl `compute_policy_loss_sapo`, TRL loss_type="sapo"). Its gradient −4σ(1 − σ)·ρ·A·∇log π is
    PPO's −A·∇log π at ρ = 1 and fades smoothly as ρ leaves 1, instead of a hard clip.

    Returns (loss_BxT, zeros, zeros): nothing is clipped (verl reports clip fractions 0)."""
    ratio_BxT, adv_BxT = _ratio_and_advantage(logp_BxT, old_logp_BxT, advantages_B, mask_BxT, level)
    tau_BxT = jnp.where(adv_BxT > 0, tau_pos, tau_neg).astype(ratio_BxT.dtype)
    gate_BxT = jax.nn.sigmoid(tau_BxT * (ratio_BxT - 1.0)) * (4.0 / tau_BxT)
    loss_BxT = jnp.where(mask_BxT, -gate_BxT * adv_BxT, 0.0)
    zeros_BxT = jnp.zeros_like(loss_BxT)
    return loss_BxT, zeros_BxT, zeros_BxT


def policy_loss(logp_BxT: jax.Array, old_logp_BxT: jax.Array, advantages_B: jax.Array, mask_BxT: jax.Array,
                cfg: GRPOConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
    """cfg.loss's per-token policy loss and clip indicators (`clipped_surrogate`, `cispo_surrogate`,
    `sapo_surrogate`)."""
    args = (logp_BxT, old_logp_BxT, advantages_B, mask_BxT)
    if cfg.loss == "cispo":
        return cispo_surrogate(*args, cfg.cispo_clip_low, cfg.cispo_clip_high, level=cfg.importance_level)
    if cfg.loss == "sapo":
        return sapo_surrogate(*args, cfg.sapo_tau_pos, cfg.sapo_tau_neg, level=cfg.importance_level)
    return clipped_surrogate(*args, cfg.clip_low, cfg.clip_high, level=cfg.importance_level,
                             clip_ratio_c=cfg.clip_ratio_c)


def kl_estimate(logp_BxT: jax.Array, ref_logp_BxT: jax.Array, mask_BxT: jax.Array, estimator: str,
                cap: float | None = None) -> jax.Array:
    """Per-token estimate of KL(π‖π_ref) from samples of π (Schulman 2020), 0 on masked positions.

    With log r = log π_ref − log π: k1 = −log r, k2 = (log r)²/2, k3 = r − 1 − log r (≥ 0, unbiased).
    k3's log r is clamped to ±LOG_RATIO_CLAMP (as verl's), so r never overflows; with `cap`, the estimate
    is clipped to [−cap, cap] (verl clips its k3 to ±10).
    """
    log_r_BxT = _log_ratio(ref_logp_BxT, logp_BxT, mask_BxT)
    if estimator == "k1":
        kl_BxT = -log_r_BxT
    elif estimator == "k2":
        kl_BxT = 0.5 * log_r_BxT**2
    elif estimator == "k3":
        clamped_BxT = jnp.clip(log_r_BxT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl_BxT = jnp.expm1(clamped_BxT) - clamped_BxT
    else:
        raise ValueError(f"kl estimator {estimator!r}: must be one of {KL_ESTIMATORS}")
    return kl_BxT if cap is None else jnp.clip(kl_BxT, -cap, cap)


def behaviour_weights(old_logp_BxT: jax.Array, sampler_logp_BxT: jax.Array, mask_BxT: jax.Array,
                      cap: float) -> jax.Array:
    """Truncated importance weights min(π_old / π_sampler, C) per token (1 on masked positions): the
    correction for a sampler whose numerics differ from the trainer's (bf16 decode, other kernels)."""
    return jnp.where(mask_BxT, jnp.minimum(jnp.exp(_clamped_log_ratio(old_logp_BxT, sampler_logp_BxT, mask_BxT)),
                                           cap), 1.0)


# ---------------------------------------------------------------------------------------------------
# Aggregation: per-token weights from the full batch's mask


def _seq_mean_token_mean(mask_BxT: jax.Array, norm_length: int | None) -> jax.Array:
    """GRPO: mean over tokens within each sequence, then over sequences that have any token."""
    m = mask_BxT.astype(jnp.float32)
    count_B = m.sum(-1, keepdims=True)
    num_seqs = jnp.maximum((count_B > 0).sum(), 1)
    return m / jnp.maximum(count_B, 1) / num_seqs


def _token_mean(mask_BxT: jax.Array, norm_length: int | None) -> jax.Array:
    """DAPO: one mean over every response token of the batch (long answers weigh more)."""
    m = mask_BxT.astype(jnp.float32)
    return m / jnp.maximum(m.sum(), 1)


def _seq_mean_token_sum_norm(mask_BxT: jax.Array, norm_length: int | None) -> jax.Array:
    """Dr. GRPO: token sums divided by a constant length, averaged over all B sequences (no length bias)."""
    m = mask_BxT.astype(jnp.float32)
    return m / (norm_length * m.shape[0])


AGGREGATIONS: dict[str, Callable[[jax.Array, int | None], jax.Array]] = {
    "seq_mean_token_mean": _seq_mean_token_mean,
    "token_mean": _token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}


def loss_weights(mask_BxT: jax.Array, mode: str, norm_length: int | None = None) -> jax.Array:
    """Per-token weights [B, T] of aggregation `mode`; the loss is sum(weights * per_token_loss)."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"loss aggregation {mode!r}: must be one of {sorted(AGGREGATIONS)}")
    return AGGREGATIONS[mode](mask_BxT, norm_length)


def token_mean_weights(mask_BxT: jax.Array) -> jax.Array:
    """Weights of a plain token mean (used for metrics such as kl and clip fraction)."""
    return _token_mean(mask_BxT, None)


def logprob_gap(logp_BxT: jax.Array, other_logp_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    """Mean |log π − log π_other| over the masked tokens, e.g. teacher-forced vs sampler log-probs of
    the same params: 0 up to float error, larger where the decode numerics (bf16, kernels) drift."""
    return jnp.sum(token_mean_weights(mask_BxT) * jnp.abs(_log_ratio(logp_BxT, other_logp_BxT, mask_BxT)))


# ---------------------------------------------------------------------------------------------------
# The objective


def grpo_objective(
    logp_BxT: jax.Array,
    old_logp_BxT: jax.Array,
    ref_logp_BxT: jax.Array | None,
    advantages_B: jax.Array,
    mask_BxT: jax.Array,
    loss_w_BxT: jax.Array,
    metric_w_BxT: jax.Array,
    cfg: GRPOConfig,
    behaviour_w_BxT: jax.Array | None = None,
    entropy_BxT: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted-sum GRPO loss: Σ w·(c·policy loss + β·KL − α·H), and weighted-sum metrics.

    `loss_w_BxT` / `metric_w_BxT` come from `loss_weights` / `token_mean_weights` on the full batch;
    every returned value is a sum over this (micro-)batch's tokens, so micro-batches add exactly.
    `ref_logp_BxT` must be None exactly when cfg.kl_coef == 0; `behaviour_w_BxT` (c, `behaviour_weights`)
    exactly when cfg.behaviour_correction_cap is set; `entropy_BxT` (H, the policy's full-distribution entropy per
    token, with its gradient) exactly when cfg.entropy_coef (α) > 0.
    """
    if (ref_logp_BxT is None) != (cfg.kl_coef == 0):
        raise ValueError(f"ref_logp must be given iff kl_coef > 0 (kl_coef={cfg.kl_coef})")
    if (behaviour_w_BxT is None) != (cfg.behaviour_correction_cap is None):
        raise ValueError("behaviour weights must be given iff behaviour_correction_cap is set "
                         f"(behaviour_correction_cap={cfg.behaviour_correction_cap})")
    if (entropy_BxT is None) != (cfg.entropy_coef == 0):
        raise ValueError(f"entropy must be given iff entropy_coef > 0 (entropy_coef={cfg.entropy_coef})")
    pg_BxT, low_BxT, high_BxT = policy_loss(logp_BxT, old_logp_BxT, advantages_B, mask_BxT, cfg)
    if behaviour_w_BxT is not None:
        pg_BxT = pg_BxT * jax.lax.stop_gradient(behaviour_w_BxT)
    pg_loss = jnp.sum(loss_w_BxT * pg_BxT)
    metrics = {
        "pg_loss": pg_loss,
        "clip_frac_low": jnp.sum(metric_w_BxT * low_BxT),
        "clip_frac_high": jnp.sum(metric_w_BxT * high_BxT),
        "ratio_mean": jnp.sum(metric_w_BxT * jnp.exp(_clamped_log_ratio(logp_BxT, old_logp_BxT, mask_BxT))),
        "abs_log_ratio": jnp.sum(metric_w_BxT * jnp.abs(_log_ratio(logp_BxT, old_logp_BxT, mask_BxT))),
    }
    metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
    loss = pg_loss
    if ref_logp_BxT is not None:
        kl_BxT = kl_estimate(logp_BxT, ref_logp_BxT, mask_BxT, cfg.kl_estimator, cfg.kl_cap)
        loss = loss + cfg.kl_coef * jnp.sum(loss_w_BxT * kl_BxT)
        metrics["kl"] = jnp.sum(metric_w_BxT * kl_BxT)
    if entropy_BxT is not None:  # aggregated as the loss (verl's agg_loss of the entropy with loss_agg_mode)
        metrics["entropy_bonus"] = jnp.sum(loss_w_BxT * jnp.where(mask_BxT, entropy_BxT, 0.0))
        loss = loss - cfg.entropy_coef * metrics["entropy_bonus"]
    metrics["loss"] = loss
    return loss, metrics


def grpo_loss(
    logp_BxT: jax.Array,
    old_logp_BxT: jax.Array,
    ref_logp_BxT: jax.Array | None,
    advantages_B: jax.Array,
    mask_BxT: jax.Array,
    cfg: GRPOConfig,
    behaviour_w_BxT: jax.Array | None = None,
    entropy_BxT: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO loss of one whole batch (weights from its own mask); see `grpo_objective`."""
    return grpo_objective(
        logp_BxT, old_logp_BxT, ref_logp_BxT, advantages_B, mask_BxT,
        loss_weights(mask_BxT, cfg.loss_aggregation, cfg.loss_norm_length), token_mean_weights(mask_BxT), cfg,
        behaviour_w_BxT, entropy_BxT)


# ---------------------------------------------------------------------------------------------------
# Teacher-forced log-probs (the one function: train step, reference and behaviour log-probs, tests)


def vocab_slices(vocab_size: int, length: int, chunk_size: int) -> int:
    """How many vocabulary slices `chunked_token_logprobs` runs: the fewest that divide V and keep a slice's
    logits [B, T, V / n] within B·C·V floats (n >= T / C; V itself when no smaller divisor does)."""
    least = -(-length // chunk_size)
    return next(n for n in range(min(least, vocab_size), vocab_size + 1) if vocab_size % n == 0)


@jax.custom_vjp
def _low_precision_logits(h_BxTxD: jax.Array, w_DxS: jax.Array) -> jax.Array:
    """Float32 logits h·w of low-precision (bf16) operands whose backward runs bf16 dots too: the logits'
    float32 gradient is rounded to the operands' dtype before its two dots (accumulated in float32). Autodiff
    would run both as float32 dots (7.65 TFLOP per 1.5B update at TF32 speed at best; benchmarks/AOT_RESULTS.md)."""
    return jnp.einsum("BTD,DS->BTS", h_BxTxD, w_DxS, preferred_element_type=jnp.float32)


def _low_precision_logits_fwd(h_BxTxD: jax.Array, w_DxS: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _low_precision_logits(h_BxTxD, w_DxS), (h_BxTxD, w_DxS)


def _low_precision_logits_bwd(res: tuple[jax.Array, jax.Array], g_BxTxS: jax.Array) -> tuple[jax.Array, jax.Array]:
    h_BxTxD, w_DxS = res
    g_BxTxS = g_BxTxS.astype(h_BxTxD.dtype)
    dh = jnp.einsum("BTS,DS->BTD", g_BxTxS, w_DxS, preferred_element_type=jnp.float32).astype(h_BxTxD.dtype)
    dw = jnp.einsum("BTD,BTS->DS", h_BxTxD, g_BxTxS, preferred_element_type=jnp.float32).astype(w_DxS.dtype)
    return dh, dw


_low_precision_logits.defvjp(_low_precision_logits_fwd, _low_precision_logits_bwd)


def _softmax_sums(logits_BxTxS: jax.Array, max_BxT: jax.Array, local_BxT: jax.Array
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Σ e, Σ e·z and z[local] over a vocabulary slice of float32 logits z (e = exp(z − max), `max` held fixed)."""
    exp_BxTxS = jnp.exp(logits_BxTxS - max_BxT[..., None])
    picked_BxT = jnp.take_along_axis(logits_BxTxS, local_BxT[..., None], axis=-1)[..., 0]
    return jnp.sum(exp_BxTxS, axis=-1), jnp.sum(exp_BxTxS * logits_BxTxS, axis=-1), picked_BxT


# `_softmax_sums` of a low-precision model, whose backward is one pass over the logits: dz = e·(g_sum +
# g_weighted·(1 + z)) plus g_picked where the id is `local`, fused with its rounding to the GEMMs' dtype. Autodiff
# wrote the float32 gradient, a float32 scatter of the picked logit's and a rounded copy: 3.4 GB per slice of a
# 1.5B micro-batch where this reads 0.62 and writes 0.31 (benchmarks/AOT_RESULTS.md).
_low_precision_softmax_sums = jax.custom_vjp(_softmax_sums)


def _low_precision_softmax_sums_fwd(logits_BxTxS: jax.Array, max_BxT: jax.Array, local_BxT: jax.Array
                                    ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], tuple[jax.Array, ...]]:
    return _low_precision_softmax_sums(logits_BxTxS, max_BxT, local_BxT), (logits_BxTxS, max_BxT, local_BxT)


def _low_precision_softmax_sums_bwd(res: tuple[jax.Array, ...], g: tuple[jax.Array, jax.Array, jax.Array]
                                    ) -> tuple[jax.Array, None, None]:
    logits_BxTxS, max_BxT, local_BxT = res
    g_sum_BxT, g_weighted_BxT, g_picked_BxT = g
    exp_BxTxS = jnp.exp(logits_BxTxS - max_BxT[..., None])
    picked_BxTxS = jnp.arange(logits_BxTxS.shape[-1])[None, None, :] == local_BxT[..., None]
    d_BxTxS = exp_BxTxS * (g_sum_BxT[..., None] + g_weighted_BxT[..., None] * (1 + logits_BxTxS))
    return jnp.where(picked_BxTxS, d_BxTxS + g_picked_BxT[..., None], d_BxTxS), None, None


_low_precision_softmax_sums.defvjp(_low_precision_softmax_sums_fwd, _low_precision_softmax_sums_bwd)


def _logits(h_BxTxD: jax.Array, w_DxS: jax.Array) -> jax.Array:
    """Float32 logits [B, T, S]; in float32 plain autodiff, below it `_low_precision_logits`."""
    if h_BxTxD.dtype == jnp.float32:
        return jnp.einsum("BTD,DS->BTS", h_BxTxD, w_DxS, preferred_element_type=jnp.float32)
    return _low_precision_logits(h_BxTxD, w_DxS)


_SLICE_MAX = "vocab_slice_max"  # the running max of `chunked_token_logprobs`, saved for a low-precision backward


def chunked_token_logprobs(
    h_BxTxD: jax.Array,
    targets_BxT: jax.Array,
    head: Any,
    chunk_size: int,
    temperature: float,
    projection: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """log p_T(targets[b, t] | h[b, t]) and the entropy of p_T = softmax(logits / T), float32 [B, T].

    The log-softmax runs over n vocabulary slices (`vocab_slices`: [B, T, V / n] logits at a time, at most
    B·C·V floats for C = `chunk_size`) under `lax.scan` with a running max, sum, Σ e·z and target logit
    (online softmax), each slice rematerialised in the backward pass. `head` follows the model contract:
    `cfg.vocab_size`, `vocab_projection(n)` -> [n, D, V / n] (slice i: the projection of vocabulary ids
    i, i + n, i + 2n, ...) and `vocab_slice_for_dot(w_DxS)` (one slice as a dot reads it), as
    `Transformer` has them.

    Why slices of the vocabulary, not of the tokens: each slice of the projection weight is used, and its
    gradient completed, in one iteration over all the tokens. Under FSDP the weight is then all-gathered once
    per pass over the rows and its gradient reduce-scattered once, where token chunks all-gathered the whole
    [D, V] weight in every chunk, forward and backward (195 GiB per 7B update, benchmarks/AOT_RESULTS.md).
    The slices are the scan's input, so each slice's gradient is written once into its own slot of the
    stacked gradient (indexing the weight inside the loop added each slice's gradient into the whole table).
    The hidden states enter in float32 so that their gradient sums over the slices in float32. `projection`: the
    head's `vocab_projection(n)` made once per update (`AccumulatingLayers.head`), read in place of the head's
    own cast (the gradient still goes to the head's weight): one cast per update, not one per micro-batch.
    """
    b, t, _ = h_BxTxD.shape
    n = vocab_slices(head.cfg.vocab_size, t, chunk_size)
    dtype = h_BxTxD.dtype
    h32_BxTxD = h_BxTxD.astype(jnp.float32)

    # A low-precision model's backward reads the slice's running max as the forward made it (saved: [B, T] per
    # slice) rather than a reduction of the recomputed logits again (5 GB per 1.5B update; AOT_RESULTS.md).
    policy = None if dtype == jnp.float32 else jax.checkpoint_policies.save_only_these_names(_SLICE_MAX)

    @functools.partial(jax.checkpoint, policy=policy)
    def one_slice(carry: tuple[jax.Array, ...], xs: tuple[jax.Array, jax.Array]
                  ) -> tuple[tuple[jax.Array, ...], None]:
        max_BxT, sum_BxT, weighted_BxT, target_BxT = carry
        i, w_DxS = xs
        logits_BxTxS = _logits(h32_BxTxD.astype(dtype), head.vocab_slice_for_dot(w_DxS)) / temperature
        # softmax(z) = exp(z - m) / sum exp(z - m) for any m: the gradient does not flow through the max.
        new_max_BxT = checkpoint_name(jax.lax.stop_gradient(jnp.maximum(max_BxT, jnp.max(logits_BxTxS, axis=-1))),
                                      _SLICE_MAX)
        rescale_BxT = jnp.exp(max_BxT - new_max_BxT)
        sums = _softmax_sums if dtype == jnp.float32 else _low_precision_softmax_sums
        exp_sum_BxT, exp_weighted_BxT, picked_BxT = sums(logits_BxTxS, new_max_BxT, targets_BxT // n)
        sum_BxT = sum_BxT * rescale_BxT + exp_sum_BxT
        weighted_BxT = weighted_BxT * rescale_BxT + exp_weighted_BxT
        target_BxT = jnp.where(targets_BxT % n == i, picked_BxT, target_BxT)
        return (new_max_BxT, sum_BxT, weighted_BxT, target_BxT), None

    zeros_BxT = jnp.zeros((b, t), jnp.float32)
    start = (jnp.full((b, t), -jnp.inf, jnp.float32), zeros_BxT, zeros_BxT, zeros_BxT)
    w_NxDxS = head.vocab_projection(n)
    if projection is not None:
        if projection.shape != w_NxDxS.shape:
            raise ValueError(f"projection {projection.shape}: the head's vocab_projection({n}) is {w_NxDxS.shape}")
        w_NxDxS = use_copy(w_NxDxS, projection)
    (max_BxT, sum_BxT, weighted_BxT, target_BxT), _ = jax.lax.scan(one_slice, start, (jnp.arange(n), w_NxDxS))
    lse_BxT = max_BxT + jnp.log(sum_BxT)
    return target_BxT - lse_BxT, lse_BxT - weighted_BxT / sum_BxT  # entropy = lse - E_p[logits]


def sequence_logprobs(
    model: Any, tokens_BxT: jax.Array, input_mask_BxT: jax.Array, *, chunk_size: int, temperature: float,
    into: AccumulatingLayers | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced log p_T(tokens[t] | tokens[<t]) and entropy of p_T = softmax(logits / T), float32
    [B, T]; entry 0 and padding positions are 0.

    `model` follows the model contract (`hidden_states`, `cfg.vocab_size` and the head of `chunked_token_logprobs`); padding may be left
    or right (positions come from the mask). T = 1 for SFT; GRPO passes its rollout temperature. `into`: a training
    forward's accumulating layers, passed to the model.
    """
    positions_BxT = padding_to_positions(input_mask_BxT)
    h_BxTxD, _ = model.hidden_states(tokens_BxT, positions_BxT, causal_padding_mask(input_mask_BxT), into=into)
    next_BxT = jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, 1)))
    logp_next_BxT, ent_next_BxT = chunked_token_logprobs(h_BxTxD, next_BxT, model, chunk_size, temperature,
                                                        None if into is None else into.head)
    # Entry t predicts token t from tokens < t: defined where both t and t - 1 are real tokens.
    valid_BxT = input_mask_BxT & jnp.pad(input_mask_BxT[:, :-1], ((0, 0), (1, 0)))

    def shift_right(x_BxT: jax.Array) -> jax.Array:
        return jnp.where(valid_BxT, jnp.pad(x_BxT[:, :-1], ((0, 0), (1, 0))), 0.0)

    return shift_right(logp_next_BxT), shift_right(ent_next_BxT)


def response_targets(prompt_mask_UxP: jax.Array, response_mask_BxR: jax.Array) -> jax.Array:
    """Response tokens that have a real predecessor [B, R] (the last prompt token for entry 0) of B = U·G
    responses, rows u·G .. u·G + G − 1 continuing prompt u: the entries `shared_prompt_logprobs` defines.
    Responses are right-padded; prompts may be padded either way."""
    group = response_mask_BxR.shape[0] // prompt_mask_UxP.shape[0]
    first_B1 = jnp.repeat(jnp.any(prompt_mask_UxP, axis=-1), group)[:, None]
    return response_mask_BxR & jnp.concatenate([first_B1, response_mask_BxR[:, :-1]], axis=1)


def shared_prompt_logprobs(
    model: Any, prompt_UxP: jax.Array, prompt_mask_UxP: jax.Array, response_BxR: jax.Array,
    response_mask_BxR: jax.Array, *, chunk_size: int, temperature: float, into: AccumulatingLayers | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced log p_T(response[r] | prompt, response[<r]) and entropy of p_T, float32 [B, R], of
    B = U·G responses where rows u·G .. u·G + G − 1 continue prompt u; 0 outside `response_targets`.

    Each prompt runs once (`model.prefix_continuation_states`); its G responses attend its keys/values at
    positions that continue its real length, and entry 0 is read from its last real token's hidden
    state; `into` as in `sequence_logprobs`. Equal to `sequence_logprobs` on the concatenated rows (left-padded
    prompts) at the response positions, with G times fewer prompt tokens in the forward and the backward.
    """
    u, p = prompt_UxP.shape
    group = response_BxR.shape[0] // u
    length_B = jnp.repeat(jnp.sum(prompt_mask_UxP, axis=-1, dtype=jnp.int32), group)
    h_UxPxD, h_BxRxD = model.prefix_continuation_states(
        prompt_UxP, padding_to_positions(prompt_mask_UxP), causal_padding_mask(prompt_mask_UxP), response_BxR,
        length_B[:, None] + padding_to_positions(response_mask_BxR), causal_padding_mask(response_mask_BxR),
        prompt_mask_UxP, into=into)
    last_U = (p - 1) - jnp.argmax(prompt_mask_UxP[:, ::-1], axis=-1)
    h_last_UxD = jnp.take_along_axis(h_UxPxD, last_U[:, None, None], axis=1)[:, 0]
    # Entry r is predicted from the state before response token r: the prompt's last token for r = 0.
    h_pred_BxRxD = jnp.concatenate([jnp.repeat(h_last_UxD, group, axis=0)[:, None], h_BxRxD[:, :-1]], axis=1)
    logp_BxR, ent_BxR = chunked_token_logprobs(h_pred_BxRxD, response_BxR, model, chunk_size, temperature,
                                              None if into is None else into.head)
    valid_BxR = response_targets(prompt_mask_UxP, response_mask_BxR)
    return jnp.where(valid_BxR, logp_BxR, 0.0), jnp.where(valid_BxR, ent_BxR, 0.0)

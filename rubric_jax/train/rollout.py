"""From sampled responses to a GRPO batch: the rollout sampler's temperature, score, normalise per group,
lay out the arrays on the device (responses are decoded by `data.decode_responses` for the judges only).

Shape legend: B questions, G samples per question, N = B·G rollouts (row b·G + j is sample j of
question b, the sampler's order), U = B prompts (one per group), P prompt bucket, R response bucket,
D rubric dimensions. The batch layout is the one `rubric_jax.train.step` documents: each group's
left-padded prompt once, its G right-padded responses.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rubric_jax import distributed, grpo, sampling, sharding
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.train.step import PROMPT_KEYS

MISSING_SCORES = ("renormalize", "drop")  # a sample with a missing dimension score: reward over the rest, or no loss
ADVANTAGES = ("sum_then_normalise", "per_dimension")  # rl.advantage: GRPO on the aggregated reward, or GDPO


def rollout_temperature(sampler: str) -> float:
    """The temperature T of a GRPO rollout sampler, which must be "temperature(T)".

    The trainer's log-probs are those of the whole softmax(logits / T) (as TRL's and verl's). Top-k and
    nucleus sample from a truncated, renormalised distribution instead, so the first-update ratio would
    not be 1 and every update would carry an uncorrected truncation bias: they are refused rather than
    documented as biased. Greedy gives the G samples of a group the same response: zero advantage.
    """
    parsed = sampling.parse_sampler(sampler)
    if parsed.kind != "temperature":
        raise ValueError(
            f"config.rl.sampler={sampler!r}: GRPO rollouts need 'temperature(t)' (t > 0). The trainer scores "
            "samples under the full softmax(logits / t); top-k / nucleus truncate it (a biased ratio) and greedy "
            "makes every group's samples identical (zero advantage). Top-k / nucleus remain for eval.sampler.")
    return parsed.temperature


@dataclasses.dataclass(frozen=True)
class Shaping:
    """How a scored rollout becomes advantages beyond GRPO's group normalisation (the rl block; the defaults
    change nothing): `advantage` (ADVANTAGES), DAPO's soft overlong punishment over the last `overlong_buffer`
    tokens before `max_new_tokens` (0 = off) down to −`overlong_penalty`, and DAPO's overlong filtering
    (`mask_truncated`: responses cut at max_new_tokens get no loss)."""

    advantage: str = "sum_then_normalise"
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    mask_truncated: bool = False
    max_new_tokens: int = 1

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"advantage={self.advantage!r}: must be one of {ADVANTAGES}")
        if not isinstance(self.overlong_buffer, int) or not 0 <= self.overlong_buffer < self.max_new_tokens:
            raise ValueError(f"overlong_buffer={self.overlong_buffer!r}: must be an integer in [0, max_new_tokens="
                             f"{self.max_new_tokens}) (0 = off)")
        if not (np.isfinite(self.overlong_penalty) and self.overlong_penalty > 0):
            raise ValueError(f"overlong_penalty={self.overlong_penalty!r}: must be a finite number > 0")
        if not isinstance(self.mask_truncated, bool):
            raise ValueError(f"mask_truncated={self.mask_truncated!r}: must be True or False")


@dataclasses.dataclass(frozen=True)
class Advantages:
    """One rollout's training signal: advantages [N], trainable samples [N], the zero-std group fraction, and
    the shaping's metrics (per-dimension advantage shares, overlong penalty, masked truncations)."""

    advantages_N: np.ndarray
    trainable_N: np.ndarray
    zero_std_frac: float
    metrics: dict[str, float]


@dataclasses.dataclass(frozen=True)
class AdvantageInputs:
    """What a rollout's advantages normalise (legend: N rows, C columns): the trainable rows, per row and column the
    value, whether it is present and its weight, the columns' names, and the shaping's metrics. One column (the
    aggregated reward plus the overlong penalty, weight 1) for "sum_then_normalise"; for "per_dimension" the
    dimensions' scores with the gates applied, and the overlong penalty as one more column when it is on."""

    trainable_N: np.ndarray
    values_NxC: np.ndarray
    present_NxC: np.ndarray
    weights_NxC: np.ndarray
    names: list[str]
    metrics: dict[str, float]

    def counted_NxC(self) -> np.ndarray:
        """The cells in their group's statistics (`counted_cells`)."""
        return counted_cells(self.weights_NxC, self.present_NxC, self.trainable_N)


def counted_cells(weights_NxD: np.ndarray, present_NxD: np.ndarray, trainable_N: np.ndarray) -> np.ndarray:
    """The cells [N, D] in their group's statistics: the trainable rows' present, weighted values."""
    return (weights_NxD > 0) & np.asarray(present_NxD, bool) & np.asarray(trainable_N, bool)[:, None]


def advantage_inputs(scored: RewardOutput, missing_scores: str, shaping: Shaping = Shaping(), *,
                     rubrics: Sequence[Rubric] = (), weights: Mapping[str, float] | None = None,
                     lengths_N: np.ndarray | None = None, truncated_N: np.ndarray | None = None) -> AdvantageInputs:
    """What `rollout_advantages` normalises, for it and for group selection (train/dynamic.py).

    A sample is trainable when its reward is ok, with missing_scores "drop" every dimension score is present,
    and with `shaping.mask_truncated` it was not cut at max_new_tokens. For "per_dimension" the rows' `rubrics`
    give weights and gates; `weights` override them.
    """
    if missing_scores not in MISSING_SCORES:
        raise ValueError(f"missing_scores={missing_scores!r}: must be one of {MISSING_SCORES}")
    n = len(scored.reward)
    valid_N = np.asarray(scored.details["reward_ok"], bool)
    if missing_scores == "drop":
        valid_N = valid_N & scored.valid.all(axis=1)
    metrics: dict[str, float] = {}
    if shaping.mask_truncated:
        truncated = np.asarray(truncated_N, bool)
        metrics["truncated_masked"] = float((valid_N & truncated).sum())
        valid_N = valid_N & ~truncated
    penalty_N = np.zeros(n)
    if shaping.overlong_buffer:
        penalty_N = overlong_penalty(lengths_N, shaping.max_new_tokens, shaping.overlong_buffer,
                                     shaping.overlong_penalty)
        metrics["overlong_penalty/mean"] = float(penalty_N.mean())
    if shaping.advantage == "sum_then_normalise":
        rewards_N = np.asarray(scored.reward, np.float64) + penalty_N
        return AdvantageInputs(valid_N, rewards_N[:, None], np.ones((n, 1), bool), np.ones((n, 1)), ["reward"],
                               metrics)
    if len(rubrics) != n:
        raise ValueError(f"per-dimension advantages need each row's rubric: {len(rubrics)} rubrics for {n} rows")
    weights_NxD, gate_NxD = dimension_layout(rubrics, scored.dimension_ids, weights)
    scores_NxD, present_NxD = gate_vetoes(scored.scores, scored.valid, weights_NxD, gate_NxD)
    names = list(scored.dimension_ids)
    if shaping.overlong_buffer:  # the penalty is one more dimension, weighted like the row's heaviest
        scores_NxD = np.concatenate([scores_NxD, penalty_N[:, None]], axis=1)
        present_NxD = np.concatenate([present_NxD, np.ones((n, 1), bool)], axis=1)
        weights_NxD = np.concatenate([weights_NxD, weights_NxD.max(axis=1, keepdims=True)], axis=1)
        names.append("overlong")
    return AdvantageInputs(valid_N, scores_NxD, present_NxD, weights_NxD, names, metrics)


def rollout_advantages(scored: RewardOutput, cfg: grpo.GRPOConfig, missing_scores: str, shaping: Shaping = Shaping(),
                       *, rubrics: Sequence[Rubric] = (), weights: Mapping[str, float] | None = None,
                       lengths_N: np.ndarray | None = None, truncated_N: np.ndarray | None = None) -> Advantages:
    """The advantages of one scored rollout (`advantage_inputs` says which rows train and what is normalised).

    "sum_then_normalise" normalises the aggregated reward (plus the overlong penalty) per group with cfg's
    scaling and eps; "per_dimension" is GDPO (`per_dimension_advantages`).
    """
    inputs = advantage_inputs(scored, missing_scores, shaping, rubrics=rubrics, weights=weights, lengths_N=lengths_N,
                              truncated_N=truncated_N)
    if shaping.advantage == "sum_then_normalise":
        advantages_N, zero_std = grpo.group_advantages(inputs.values_NxC[:, 0].astype(np.float32), cfg.group_size,
                                                       scaling=cfg.advantage_scaling, eps=cfg.advantage_eps,
                                                       valid_N=inputs.trainable_N)
        return Advantages(np.asarray(advantages_N), inputs.trainable_N, float(zero_std), inputs.metrics)
    advantages_N, share_D, zero_std = per_dimension_advantages(
        inputs.values_NxC, inputs.present_NxC, inputs.weights_NxC, inputs.trainable_N, cfg.group_size,
        cfg.advantage_scaling, cfg.advantage_eps)
    metrics = {**inputs.metrics, **{f"advantage/{name}": float(share) for name, share in zip(inputs.names, share_D)}}
    return Advantages(advantages_N, inputs.trainable_N, zero_std, metrics)


def dimension_layout(rubrics: Sequence[Rubric], dimension_ids: Sequence[str],
                     weights: Mapping[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per row, each column's weight (0 where the row's rubric has no such dimension, and for gates) and
    whether it is one of the row's gates: ([N, D] float64, [N, D] bool). `weights` (dynamic weights)
    override the rubrics' own, as in the reward."""
    column = {dim_id: c for c, dim_id in enumerate(dimension_ids)}
    weights_NxD = np.zeros((len(rubrics), len(dimension_ids)))
    gate_NxD = np.zeros((len(rubrics), len(dimension_ids)), bool)
    for i, rubric in enumerate(rubrics):
        for dim in rubric.dimensions:
            if dim.gate:
                gate_NxD[i, column[dim.id]] = True
            else:
                weights_NxD[i, column[dim.id]] = (weights or {}).get(dim.id, dim.weight)
    return weights_NxD, gate_NxD


def gate_vetoes(scores_NxD: np.ndarray, valid_NxD: np.ndarray, weights_NxD: np.ndarray, gate_NxD: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Scores and presence [N, D] with the rubric's gates applied per dimension: a row whose gate scored 0 has
    reward 0 whatever the rest scores, so each of its weighted dimensions counts as 0 (present)."""
    present_NxD = np.asarray(valid_NxD, bool) & ~np.isnan(scores_NxD)
    failed_N = (gate_NxD & present_NxD & (np.nan_to_num(scores_NxD) <= 0)).any(axis=1)
    vetoed_NxD = failed_N[:, None] & (weights_NxD > 0)
    return np.where(vetoed_NxD, 0.0, scores_NxD), present_NxD | vetoed_NxD


def per_dimension_advantages(scores_NxD: np.ndarray, present_NxD: np.ndarray, weights_NxD: np.ndarray,
                             trainable_N: np.ndarray, group_size: int, scaling: str, eps: float
                             ) -> tuple[np.ndarray, np.ndarray, float]:
    """GDPO (Liu et al. 2026, arXiv 2601.05242): each dimension normalised within its group (`scaling`, as
    `grpo.group_advantages`), combined with the rows' weights, then whitened over the batch's rows.
    Returns (advantages [N], mean |weighted advantage| per column [D], zero-std group fraction).

    A missing score is left out of its dimension's group statistics and the row's weights are renormalised
    over its present dimensions. A group whose every dimension is constant over its trainable rows carries
    no gradient and is counted in the fraction, as in `grpo.group_advantages`.
    """
    n, num_dims = scores_NxD.shape
    scored_NxD = counted_cells(weights_NxD, present_NxD, trainable_N)
    values_NxD = np.where(scored_NxD, scores_NxD, 0.0).astype(np.float32)
    adv_NxD = np.zeros((n, num_dims))
    varies_BxD = np.zeros((n // group_size, num_dims), bool)
    for d in range(num_dims):
        adv_N, _ = grpo.group_advantages(values_NxD[:, d], group_size, scaling=scaling, eps=eps,
                                         valid_N=scored_NxD[:, d])
        adv_NxD[:, d] = np.asarray(adv_N, np.float64)
        v_BxG, r_BxG = scored_NxD[:, d].reshape(-1, group_size), values_NxD[:, d].reshape(-1, group_size)
        spread_B = np.where(v_BxG, r_BxG, -np.inf).max(1) - np.where(v_BxG, r_BxG, np.inf).min(1)
        varies_BxD[:, d] = (v_BxG.sum(1) >= 2) & (spread_B > 0)
    w_NxD = np.where(scored_NxD, weights_NxD, 0.0)
    w_NxD = w_NxD / np.where(w_NxD.sum(axis=1, keepdims=True) > 0, w_NxD.sum(axis=1, keepdims=True), 1.0)
    degenerate_B = ~varies_BxD.any(axis=1)
    rows_N = np.asarray(trainable_N, bool) & ~np.repeat(degenerate_B, group_size)
    combined_N = np.zeros(n)
    if rows_N.sum() >= 2:
        raw_N = (w_NxD * adv_NxD).sum(axis=1)
        mean, std = raw_N[rows_N].mean(), raw_N[rows_N].std(ddof=1)
        combined_N = np.where(rows_N, (raw_N - mean) / (std + eps), 0.0)
    share_D = np.abs(w_NxD * adv_NxD)[rows_N].mean(axis=0) if rows_N.any() else np.zeros(num_dims)
    return combined_N.astype(np.float32), share_D, float(degenerate_B.mean())


def overlong_penalty(lengths_N: np.ndarray, max_new_tokens: int, buffer: int, factor: float) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13; verl's overlong buffer):
    0 up to max_new_tokens − buffer tokens, then falling linearly to −factor at max_new_tokens."""
    expected = max_new_tokens - buffer
    return np.minimum(-(np.asarray(lengths_N, np.float64) - expected) / buffer * factor, 0.0)


def training_batch(rounds: Sequence[sampling.Samples], groups: Sequence[tuple[int, int]], group_size: int,
                   width: int, advantages_N: np.ndarray, valid_N: np.ndarray, mesh: jax.sharding.Mesh
                   ) -> dict[str, jax.Array]:
    """The GRPO batch, built on the device from the sampler's own arrays (nothing of them crosses to the host and
    back): this process's `groups` ((round, prompt) pairs into `rounds`, one sampler call each; n = group_size)
    give each group's prompt (prompt_tokens/prompt_mask [U, P]) and its G responses (response_tokens /
    response_mask [N, R]), loss_mask [N, R], the sampler's log-probs as behaviour log-probs `old_logp` [N, R]
    and advantages [N] (reference log-probs are added on device: `programs.rollout_logprobs`); only per-row
    vectors are uploaded: `advantages_N`, `valid_N` (this process's rows) and the rows' indices.

    Samples whose reward is missing (`valid_N` False) get no loss tokens at all: no policy-gradient
    or KL term, and no share of the token or sequence counts that normalise the loss (Dr. GRPO's
    constant B·L still counts every row, as its definition says).

    `width` (R) is the response bucket of the longest response (the same on every process), a column prefix of
    the sampler's response slots: short rollouts need not pay for max_new_tokens while the number of compiled
    shapes stays bounded. Rounds whose prompt buckets differ (dynamic sampling) are aligned on the right.
    """
    rows = sharding.batch_sharding(mesh)
    prompts = len(groups) * jax.process_count()
    width_p = max(r.prompt_UxP.shape[1] for r in rounds)
    uploaded = distributed.global_batch(
        {"rows": _global_rows(rounds, groups, group_size), "advantages": advantages_N.astype(np.float32),
         "valid": np.asarray(valid_N, bool)}, rows)
    return _layout(tuple((r.prompt_UxP, r.prompt_mask_UxP, r.tokens_BxR, r.logprobs_BxR, r.lengths_B) for r in rounds),
                   uploaded, group_size=group_size, width=width, prompt_width=width_p,
                   prompt_sharding=sharding.batch_sharding(mesh, (prompts, width_p)), rows=rows)


def _global_rows(rounds: Sequence[sampling.Samples], groups: Sequence[tuple[int, int]], n: int) -> np.ndarray:
    """The global indices [U·n] of this process's chosen groups' rows in the rounds' arrays laid end to end
    (process p's prompts of a round are its block p of that round's prompts; prompt u's rows u·n .. u·n + n − 1)."""
    process, processes = jax.process_index(), jax.process_count()
    blocks = [r.prompt_UxP.shape[0] // processes for r in rounds]
    starts = np.cumsum([0] + [b * processes for b in blocks])
    prompt_U = np.asarray([starts[r] + process * blocks[r] + g for r, g in groups], np.int64)
    return (prompt_U[:, None] * n + np.arange(n)[None, :]).reshape(-1).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("group_size", "width", "prompt_width", "prompt_sharding", "rows"))
def _layout(rounds: tuple[tuple[jax.Array, ...], ...], uploaded: dict[str, jax.Array], *, group_size: int,
            width: int, prompt_width: int, prompt_sharding: jax.sharding.Sharding, rows: jax.sharding.Sharding
            ) -> dict[str, jax.Array]:
    """`training_batch`'s device half: the chosen prompts and rows gathered from the rounds (a narrower round's
    prompts left-padded with masked 0s), responses cut to `width` columns and masked."""

    def joined(i: int, pad: Any = None) -> jax.Array:
        parts = [r[i] if pad is None else jnp.pad(r[i], ((0, 0), (prompt_width - r[i].shape[1], 0)),
                                                   constant_values=pad) for r in rounds]
        return jnp.concatenate(parts) if len(parts) > 1 else parts[0]

    row_N = uploaded["rows"]
    prompt_U = row_N.reshape(-1, group_size)[:, 0] // group_size  # a group's rows follow its prompt's
    prompt_UxP = jnp.take(joined(0, 0), prompt_U, axis=0)
    prompt_mask_UxP = jnp.take(joined(1, False), prompt_U, axis=0)
    tokens_NxR = jnp.take(joined(2), row_N, axis=0)[:, :width]
    logp_NxR = jnp.take(joined(3), row_N, axis=0)[:, :width]
    response_mask_NxR = jnp.arange(width)[None, :] < jnp.take(joined(4), row_N, axis=0)[:, None]
    batch = {
        "prompt_tokens": prompt_UxP,
        "prompt_mask": prompt_mask_UxP,
        "response_tokens": jnp.where(response_mask_NxR, tokens_NxR, 0),
        "response_mask": response_mask_NxR,
        "loss_mask": response_mask_NxR & uploaded["valid"][:, None],
        "old_logp": jnp.where(response_mask_NxR, logp_NxR, 0.0),
        "advantages": uploaded["advantages"],
    }
    return {k: jax.lax.with_sharding_constraint(v, prompt_sharding if k in PROMPT_KEYS else rows)
            for k, v in batch.items()}


@dataclasses.dataclass(frozen=True)
class RewardSummary:
    """Per-dimension means over valid scores and the scalar reward mean over rows whose reward is ok."""

    reward_mean: float
    dimension_means: dict[str, float]
    failed_scores: int
    not_ok: int
    judge: dict[str, float]  # the LLM judge's counters (prompts, calls, invalid, retried, failed scores); {} without one


def summarize_rewards(out: RewardOutput) -> RewardSummary:
    """Means for logging: a missing score never counts as 0 (it is left out and counted instead)."""
    ok_N = np.asarray(out.details["reward_ok"], bool)
    reward_mean = float(out.reward[ok_N].mean()) if ok_N.any() else float("nan")
    dims = {}
    for d, dim_id in enumerate(out.dimension_ids):
        valid = out.valid[:, d]
        dims[dim_id] = float(out.scores[valid, d].mean()) if valid.any() else float("nan")
    judge = {k: float(v) for k, v in out.details.items() if k.startswith("judge_") and isinstance(v, (int, float))}
    return RewardSummary(reward_mean, dims, int(out.details["num_failed_scores"]), int(out.details["num_not_ok"]),
                         judge)


def reward_metrics(summary: RewardSummary, prefix: str) -> dict[str, float]:
    """`{prefix}reward/<dimension>` per dimension, the failure counts and the judge's counters."""
    metrics = {f"{prefix}reward/{dim_id}": value for dim_id, value in summary.dimension_means.items()}
    metrics[f"{prefix}reward_failed_scores"] = summary.failed_scores
    metrics[f"{prefix}reward_not_ok"] = summary.not_ok
    metrics.update({f"{prefix}{k}": v for k, v in summary.judge.items()})
    return metrics

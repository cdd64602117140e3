"""From sampled responses to a GRPO batch: the rollout sampler's temperature, score, normalise per group,
lay out the arrays (responses are decoded by `data.decode_responses`).

Shape legend: B questions, G samples per question, N = B·G rollouts (row b·G + j is sample j of
question b, the sampler's order), P prompt bucket, R response bucket, T = P + R, D rubric dimensions.
The batch layout is the one `rubric_jax.train.step` documents: [left-padded prompt | response + pad].
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rubric_jax import data, distributed, grpo, sampling
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.sampling import GenerationResult

MISSING_SCORES = ("renormalize", "drop")  # a sample with a missing dimension score: reward over the rest, or no loss


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


def rollout_advantages(scored: RewardOutput, cfg: grpo.GRPOConfig, missing_scores: str
                       ) -> tuple[np.ndarray, np.ndarray, float]:
    """(advantages [N], trainable samples [N], zero-std group fraction) of one scored rollout.

    A sample is trainable when its reward is ok and, with missing_scores "drop", every dimension
    score is present; advantages use cfg's scaling and eps over the trainable samples of each group.
    """
    if missing_scores not in MISSING_SCORES:
        raise ValueError(f"missing_scores={missing_scores!r}: must be one of {MISSING_SCORES}")
    valid_N = np.asarray(scored.details["reward_ok"], bool)
    if missing_scores == "drop":
        valid_N = valid_N & scored.valid.all(axis=1)
    advantages_N, zero_std = grpo.group_advantages(np.asarray(scored.reward, np.float32), cfg.group_size,
                                                   scaling=cfg.advantage_scaling, eps=cfg.advantage_eps,
                                                   valid_N=valid_N)
    return np.asarray(advantages_N), valid_N, float(zero_std)


def training_batch(prompt_ids_BxP: np.ndarray, prompt_mask_BxP: np.ndarray, result: GenerationResult,
                   group_size: int, advantages_N: np.ndarray, valid_N: np.ndarray, buckets: tuple[int, ...], *,
                   across_processes: bool = False) -> dict[str, np.ndarray]:
    """The GRPO batch: each row's prompt (prompt_tokens/prompt_mask [N, P]), its response
    (response_tokens/response_mask [N, R]), loss_mask [N, R], the sampler's log-probs as behaviour
    log-probs `old_logp` [N, R], advantages [N] (reference log-probs are added on device:
    `loop.grpo_iteration`).

    Samples whose reward is missing (`valid_N` False) get no loss tokens at all: no policy-gradient
    or KL term, and no share of the token or sequence counts that normalise the loss (Dr. GRPO's
    constant B·L still counts every row, as its definition says).

    The response width is the smallest of `buckets` holding the longest response, so short rollouts
    need not pay for max_new_tokens while the number of compiled shapes stays bounded. With
    `across_processes` (each process batching its own rollouts) it is the same on every process.
    """
    n = result.tokens.shape[0]
    longest = int(max(result.lengths.max(), 1))
    if across_processes:
        (longest,) = distributed.max_over_processes(longest)
    width = data.bucket_length(longest, buckets)
    response_mask_NxR = np.arange(width)[None, :] < result.lengths[:, None]
    tokens_NxR = np.zeros((n, width), np.int32)
    logp_NxR = np.zeros((n, width), np.float32)
    cols = min(width, result.tokens.shape[1])
    tokens_NxR[:, :cols] = result.tokens[:, :cols]
    logp_NxR[:, :cols] = result.logprobs[:, :cols]
    return {
        "prompt_tokens": np.repeat(prompt_ids_BxP, group_size, axis=0).astype(np.int32),
        "prompt_mask": np.repeat(prompt_mask_BxP, group_size, axis=0).astype(bool),
        "response_tokens": np.where(response_mask_NxR, tokens_NxR, 0),
        "response_mask": response_mask_NxR,
        "loss_mask": response_mask_NxR & valid_N[:, None],
        "old_logp": np.where(response_mask_NxR, logp_NxR, 0.0).astype(np.float32),
        "advantages": advantages_N.astype(np.float32),
    }


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

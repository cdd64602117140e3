"""Rubric-scaffolded rollouts (RuscaRL: Zhou et al. 2025, arXiv 2508.16949; its code, github.com/IANNXANG/RuscaRL,
verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py): with `rl.rubric_hints` > 0 some samples of each group see
their rubric's criteria in the system prompt while they are sampled, and the update reads the plain prompt.

What RuscaRL does, and this module with it:
- intra-group differentiation: sample j of a group of G gets the share (G-1-j)/(G-1) of its criteria (its "linear"
  in-group rule: all of them for the first sample, none for the last), here times `rl.rubric_hints`;
- inter-step decay: that share is multiplied by the step factor 1/(1 + exp(steepness (x - midpoint))) at training
  progress x = (step-1)/(steps-1) ("step_sigmoid"; its HealthBench script: midpoint 0.2, steepness 125), or 1 - x;
- round(share x criteria) criteria are shown, drawn at random (rubric order kept), as one list in the system turn
  after the format instruction, with the instruction not to mention them (its include_evaluation_warning);
- the policy update conditions on the ORIGINAL prompt: RuscaRL restores each sample's prompt to the plain one after
  sampling (graded_system_prompt_participate_training False, its default), and verl recomputes the old log-probs on
  that batch, so the PPO ratio is pi_theta(y | plain) / pi_old(y | plain), 1 at the first update. The hinted
  sampling distribution enters nowhere (no importance correction): hinted samples are trained on as if the plain
  policy had written them. Here the same: the batch holds each group's plain prompt, `rl.recompute_old_logprobs`
  must be on, and the sampler's (hinted) log-probs are only logged, in `logprob_gap/mean`.

Hints are the rows' rubrics (per-row rubrics come from the data files): each criterion is cut at
`rl.rubric_hints_max_chars` characters and the list is cut, last criterion first, until the hinted prompt fits
`data.max_prompt_len` (the rollout prompt budget); `hints/trimmed` counts the criteria cut away. Off by default:
then no function here runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rubric_jax import data, distributed, padding, sampling, sharding
from rubric_jax.rubrics.schema import Rubric

HINT_DECAYS = ("sigmoid", "linear", "none")  # rl.rubric_hints_decay: RuscaRL's step_sigmoid, step_linear, none
HINT_HEADER = "Consider these evaluation criteria:"
HINT_FOOTER = "Do not mention these criteria in your reply."


@dataclasses.dataclass(frozen=True)
class HintSchedule:
    """rl.rubric_hints and its decay over `steps` GRPO steps (module docstring)."""

    share: float
    decay: str
    midpoint: float
    steepness: float
    steps: int
    max_chars: int

    def step_factor(self, step: int) -> float:
        """The inter-step decay at GRPO step `step` (1-based): 1 at the first step, falling to about 0 at the last."""
        x = min(1.0, max(0.0, (step - 1) / (self.steps - 1))) if self.steps > 1 else 0.0
        if self.decay == "none":
            return 1.0
        if self.decay == "linear":
            return 1.0 - x
        return 1.0 / (1.0 + math.exp(min(700.0, self.steepness * (x - self.midpoint))))

    def row_shares(self, step: int, group_size: int) -> np.ndarray:
        """The share of its criteria each sample j of a group sees at `step` [G]: share x (G-1-j)/(G-1) x decay."""
        in_group = (group_size - 1 - np.arange(group_size)) / (group_size - 1)
        return self.share * in_group * self.step_factor(step)


def schedule(rl: Any) -> HintSchedule | None:
    """The hint schedule of an rl block (blocks.RLBlock), None when rl.rubric_hints is 0 (off)."""
    if not rl.rubric_hints:
        return None
    return HintSchedule(rl.rubric_hints, rl.rubric_hints_decay, rl.rubric_hints_midpoint, rl.rubric_hints_steepness,
                        rl.steps, rl.rubric_hints_max_chars)


@dataclasses.dataclass(frozen=True)
class StepHints:
    """One step's plan: each group row's criteria share [G] and the schedule's decay factor at that step."""

    shares_G: np.ndarray
    step_factor: float
    max_chars: int

    @classmethod
    def at(cls, hints: HintSchedule, step: int, group_size: int) -> StepHints:
        """The plan of GRPO step `step`."""
        return cls(hints.row_shares(step, group_size), hints.step_factor(step), hints.max_chars)


@dataclasses.dataclass(frozen=True)
class HintedPrompts:
    """Each sample's prompt token ids (B·G, question-major) and per sample the criteria shown, its rubric's
    criteria count, the criteria cut to fit the prompt budget, and the ids of the criteria shown."""

    ids: list[list[int]]
    shown_N: np.ndarray
    criteria_N: np.ndarray
    trimmed_N: np.ndarray
    shown_ids: list[tuple[str, ...]]


def hint_text(descriptions: Sequence[str], max_chars: int) -> str:
    """The scaffold appended to the system turn: the criteria as a list, each cut at `max_chars` characters."""
    lines = [f"- {' '.join(d.split())[:max_chars]}" for d in descriptions]
    return "\n".join([HINT_HEADER, *lines, HINT_FOOTER])


def hinted_prompts(tokenizer: Any, questions: Sequence[str], rubrics: Sequence[Rubric], plan: StepHints, budget: int,
                   rng: np.random.Generator) -> HintedPrompts:
    """Every sample's prompt under `plan` (B questions x G samples): sample j of a question shows round(share_j x D)
    of its rubric's D criteria, drawn by `rng` (rubric order kept), dropping the last until it fits `budget` tokens."""
    ids, shown, total, trimmed, shown_ids = [], [], [], [], []
    for question, rubric in zip(questions, rubrics):
        plain = data.encode_prompts(tokenizer, [question])[0]
        descriptions = [d.description for d in rubric.dimensions]
        for share in plan.shares_G:
            k = int(round(len(descriptions) * float(share)))
            chosen = sorted(rng.choice(len(descriptions), size=k, replace=False).tolist()) if k else []
            row = _fitted(tokenizer, question, [descriptions[i] for i in chosen], plan.max_chars, budget)
            ids.append(row[0] if row[1] else plain)
            shown.append(row[1])
            total.append(len(descriptions))
            trimmed.append(k - row[1])
            shown_ids.append(tuple(rubric.dimensions[i].id for i in chosen[:row[1]]))
    return HintedPrompts(ids, np.asarray(shown, np.int32), np.asarray(total, np.int32), np.asarray(trimmed, np.int32),
                         shown_ids)


def _fitted(tokenizer: Any, question: str, descriptions: list[str], max_chars: int, budget: int
            ) -> tuple[list[int], int]:
    """The hinted prompt of the longest prefix of `descriptions` that fits `budget` tokens, and how many it shows."""
    while descriptions:
        system = f"{data.SYSTEM_PROMPT}\n\n{hint_text(descriptions, max_chars)}"
        ids = data.encode_prompts(tokenizer, [question], system)[0]
        if len(ids) <= budget:
            return ids, len(descriptions)
        descriptions = descriptions[:-1]
    return [], 0


def sample_hinted(weights: Any, prompts: HintedPrompts, rows: slice, plain_ids: np.ndarray, plain_mask: np.ndarray, *,
                  n: int, buckets: Sequence[int], pad_id: int, layout: sharding.Layout, **kwargs: Any
                  ) -> sampling.Samples:
    """The samples of this process's questions `rows` (`n` each), each from its own prompt of `prompts` (one sampler
    row per sample), returned as if `sampling.sample` had drawn `n` per plain prompt: its prompt arrays are the
    plain prompts (what the update reads), its rows regrouped to that call's layout."""
    ids, mask = padding.pad_left(prompts.ids[rows.start * n:rows.stop * n], pad_id, buckets, across_processes=True)
    hinted = sampling.sample(weights, ids, prompt_mask=mask, n=1, pad_id=pad_id, layout=layout, **kwargs)
    (width,) = distributed.max_over_processes(plain_ids.shape[1])
    tokens_UxP, mask_UxP = sampling.placed_prompts(plain_ids, plain_mask, width, pad_id, layout)
    processes = jax.process_count()
    place = lambda shape: layout.sharding(("batch",), shape)  # noqa: E731
    prompt_UxP, prompt_mask_UxP = distributed.global_batch(
        (tokens_UxP, mask_UxP), place((tokens_UxP.shape[0] * processes, tokens_UxP.shape[1])))
    real, padded = plain_ids.shape[0] * n, tokens_UxP.shape[0] * n
    regroup = lambda x: _regrouped(x, processes=processes, real=real, padded=padded,  # noqa: E731
                                   sharding=place((padded * processes,) + x.shape[1:]))
    return sampling.Samples(prompt_UxP, prompt_mask_UxP, regroup(hinted.tokens_BxR), regroup(hinted.logprobs_BxR),
                            regroup(hinted.lengths_B), regroup(hinted.stopped_B), hinted.num_steps, real,
                            hinted.max_new_tokens)


@functools.partial(jax.jit, static_argnames=("processes", "real", "padded", "sharding"))
def _regrouped(x: jax.Array, *, processes: int, real: int, padded: int, sharding: jax.sharding.Sharding) -> jax.Array:
    """Rows of a global array (each process's block its `real` rows, then padding) with each block's padding
    re-cut to `padded` rows (zeros): the one-row-per-sample call's rows in the n-per-prompt call's layout."""
    blocks = x.reshape(processes, -1, *x.shape[1:])[:, :real]
    blocks = jnp.pad(blocks, [(0, 0), (0, padded - real)] + [(0, 0)] * (x.ndim - 1))
    return jax.lax.with_sharding_constraint(blocks.reshape(processes * padded, *x.shape[1:]), sharding)


def sample_fields(shown_ids: Sequence[str]) -> dict[str, Any]:
    """A samples.jsonl row's hint fields (only with rl.rubric_hints on): whether its prompt showed any criterion, and
    the ids of those it showed (rubric order), so a reader can filter or compare the responses that saw them."""
    return {"hinted": bool(shown_ids), "hint_criteria": list(shown_ids)}


def hint_metrics(plan: StepHints, shown_N: np.ndarray, criteria_N: np.ndarray, trimmed_N: np.ndarray
                 ) -> dict[str, float]:
    """A step's `hints/*` metrics: the schedule's decay factor and mean planned criteria share, the hinted rows
    (at least one criterion shown) and their share, the share of criteria shown, and the criteria cut for the budget."""
    return {"hints/step_factor": plan.step_factor, "hints/planned_share": float(np.mean(plan.shares_G)),
            "hints/rows": float((shown_N > 0).sum()), "hints/row_share": float((shown_N > 0).mean()),
            "hints/criteria_share": float(shown_N.sum() / max(int(criteria_N.sum()), 1)),
            "hints/trimmed": float(trimmed_N.sum())}

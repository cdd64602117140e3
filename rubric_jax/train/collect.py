"""A rollout's rows, sampled by the policy, scored by the reward and gathered from every process.

Multi-host (several processes, `distributed.py`): each process samples its questions through the global sharded
`generate` and scores its own rows, and the scored rows of every process are then gathered to each (`Rollout`),
so advantages, metrics, monitors, dynamic weights and samples are computed from all rows, identically
everywhere. With DAPO's dynamic sampling or a group selection (train/dynamic.py), rounds of questions are sampled
until enough groups are kept.

With `chunks` > 1 (rl.rollout_chunks, one process; train/overlap.py), a rollout (each round of one) is sampled in
that many sampler calls of whole groups, call j + 1 dispatched before call j is fetched and judged, so the host
judges while the devices sample. Every call samples with the same parameters and draws the noise the one call
would (`sampling.sample`'s row_offset), and each chunk is judged with the whole rollout's key: the tokens, and so
the rule judges' and a greedy or served judge's rewards, are the one call's (llm_judge.py: a verdict depends on
its own prompt only). Only the sampler's log-probs come from differently shaped programs (float rounding).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from rubric_jax import data, distributed, sampling
from rubric_jax.judges.reward import RewardOutput, concat_outputs, select_rows
from rubric_jax.train import dynamic, overlap, scaffold
from rubric_jax.train.experiment import Experiment
from rubric_jax.train.settings import RolloutSpec


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One scored rollout. The sampler's device arrays (`sampled`, one per sampler call) and this process's
    chosen `groups` ((call, prompt) pairs) build its block of the training batch on the device; the scores,
    samples and lengths are every process's rows (process order, as one process would have them), so whatever
    is computed from them is the same on every process. Legend: B this process's questions, N all rollouts."""

    sampled: tuple[sampling.Samples, ...]
    groups: tuple[tuple[int, int], ...]  # this process's B groups
    result: sampling.GenerationResult  # this process's rows (B·n) on the host: tokens, lengths (no log-probs)
    scored: RewardOutput  # all N rows
    samples: list[dict[str, Any]]  # all N rows: question, response, reward, scores (and hints: scaffold.sample_fields)
    lengths_N: np.ndarray
    truncated_N: np.ndarray  # stopped at max_new_tokens
    rows: slice  # this process's rows among the N
    timing: overlap.Timing | None = None  # chunked sampling's judge time and its hidden part (None: one call)
    hint_counts_Nx3: np.ndarray | None = None  # rl.rubric_hints: per row criteria shown, of, cut (train/scaffold.py)


@dataclasses.dataclass(frozen=True)
class LocalRollout:
    """This process's sampled and scored rows of a rollout, before they are gathered (legend: B this
    process's questions, n samples each): the sampler's device arrays (one per sampler call), each question's
    (call, prompt) pair, the host tokens its judges read."""

    questions: list[data.Question]
    sampled: tuple[sampling.Samples, ...]
    groups: tuple[tuple[int, int], ...]
    result: sampling.GenerationResult
    scored: RewardOutput
    responses: list[str]
    timing: overlap.Timing | None = None
    hint_counts_Nx3: np.ndarray | None = None  # rl.rubric_hints: per row criteria shown, of, cut (these B·n rows)
    hint_ids_N: tuple[tuple[str, ...], ...] | None = None  # rl.rubric_hints: per row the ids of the criteria shown


def sample_and_score(exp: Experiment, params: Any, questions: list[data.Question], spec: RolloutSpec, key: jax.Array,
                     chunks: int = 1, hints: scaffold.StepHints | None = None) -> LocalRollout:
    """Samples `spec.n` responses per question (this process's questions) with the policy and scores them with
    their rubrics (the sampler and the LLM judge are global computations: every process must call it); with
    `chunks` > 1 in that many sampler calls, each judged while the next samples (one process; the module docstring);
    with `hints` (rl.rubric_hints) each sample from its own, scaffolded prompt (train/scaffold.py)."""
    return start_sampling(exp, params, questions, spec, key, chunks, hints)()


def start_sampling(exp: Experiment, params: Any, questions: list[data.Question], spec: RolloutSpec, key: jax.Array,
                   chunks: int = 1, hints: scaffold.StepHints | None = None) -> Callable[[], LocalRollout]:
    """`sample_and_score` in two halves: dispatches the first sampler call now and returns what fetches and judges
    it (one-step off-policy dispatches the update in between, so the host judges while the devices update)."""
    sample_key, judge_key = jax.random.split(key)
    prompt_ids, prompt_mask = data.prompt_batch(exp.tokenizer, [q.question for q in questions], spec.prompt_buckets,
                                                across_processes=True)
    weights, size = exp.layouts.rollout_weights(params), len(questions) // chunks
    judging = exp.base_judging(params)  # judge.share_policy_base: the base's decode copy, made before any update
    timeline = overlap.Timeline() if chunks > 1 else None
    hinted = None if hints is None else scaffold.hinted_prompts(
        exp.tokenizer, [q.question for q in questions], [exp.rubric_of[q.id] for q in questions], hints,
        max(spec.prompt_buckets), np.random.default_rng(np.asarray(jax.random.key_data(sample_key)).ravel().tolist()))
    hinted_any = hinted is not None and bool(distributed.max_over_processes(int(hinted.shown_N.any()))[0])

    def dispatch(c: int) -> sampling.Samples:
        rows = slice(c * size, (c + 1) * size)
        common = dict(key=sample_key, max_new_tokens=spec.max_new_tokens, sampler=spec.sampler,
                      stop_tokens=exp.stop_tokens, pad_id=exp.tokenizer.pad_token_id, layout=exp.layouts.decode,
                      response_buckets=spec.response_buckets,
                      row_offset=None if timeline is None else c * size * spec.n)
        if hinted_any:
            samples = scaffold.sample_hinted(weights, hinted, rows, prompt_ids[rows], prompt_mask[rows], n=spec.n,
                                             buckets=spec.prompt_buckets, **common)
        else:
            samples = sampling.sample(weights, prompt_ids[rows], prompt_mask=prompt_mask[rows], n=spec.n, **common)
        if timeline is not None:
            timeline.dispatched(samples)
        return samples

    sampled = [dispatch(0)]
    return lambda: _fetch_and_score(exp, questions, spec, judge_key, size, sampled, dispatch, timeline, judging,
                                    hinted)


def _fetch_and_score(exp: Experiment, questions: list[data.Question], spec: RolloutSpec, judge_key: jax.Array,
                     size: int, sampled: list[sampling.Samples], dispatch: Callable[[int], sampling.Samples],
                     timeline: overlap.Timeline | None, judging: Callable[[], contextlib.AbstractContextManager],
                     hinted: scaffold.HintedPrompts | None = None) -> LocalRollout:
    """Fetches and judges each of the rollout's sampler calls (the first already dispatched in `sampled`), each
    next call dispatched before the current one is fetched; the judges run inside `judging()`
    (Experiment.base_judging); the rows carry `hinted`'s per-sample counts and criteria ids (rl.rubric_hints)."""
    chunks, parts = len(questions) // size, []
    for c in range(chunks):
        if c + 1 < chunks:
            sampled.append(dispatch(c + 1))  # queued behind chunk c on the devices: it samples while c is judged
        result = sampling.host_result(sampled[c], logprobs=False)  # the judges' text; log-probs stay on the device
        with timeline.judging() if timeline is not None else contextlib.nullcontext(), judging():
            parts.append((result, *_score(exp, questions[c * size:(c + 1) * size], result, spec.n, judge_key)))
    rows = [(c, i) for c, (result, _, _) in enumerate(parts) for i in range(len(result.lengths))]
    return LocalRollout(list(questions), tuple(sampled), tuple((g // size, g % size) for g in range(len(questions))),
                        _result_rows([result for result, _, _ in parts], rows),
                        _joined_calls([scored for _, _, scored in parts]),
                        [x for _, responses, _ in parts for x in responses],
                        None if timeline is None else timeline.timing(),
                        None if hinted is None else np.stack([hinted.shown_N, hinted.criteria_N, hinted.trimmed_N], 1),
                        None if hinted is None else tuple(hinted.shown_ids))


def _score(exp: Experiment, questions: list[data.Question], result: sampling.GenerationResult, n: int,
           key: jax.Array) -> tuple[list[str], RewardOutput]:
    """The responses of `result` (`n` per question) and their rubric scores, judged with `key`."""
    responses = data.decode_responses(exp.tokenizer, result, exp.stop_tokens)
    expanded = [q.question for q in questions for _ in range(n)]
    return responses, exp.reward(expanded, responses, [exp.rubric_of[q.id] for q in questions for _ in range(n)],
                                 key=key, weights=exp.weights, **exp.rollout_store())


def _result_rows(results: list[sampling.GenerationResult], rows: list[tuple[int, int]]) -> sampling.GenerationResult:
    """The host rows `rows` ((result, row) pairs) of several sampler calls' results as one (no log-probs)."""
    if len(results) == 1 and [i for _, i in rows] == list(range(len(results[0].lengths))):
        return results[0]
    return sampling.GenerationResult(
        np.stack([results[r].tokens[i] for r, i in rows]), None,
        np.asarray([results[r].lengths[i] for r, i in rows], np.int32),
        np.asarray([results[r].finish_reason[i] for r, i in rows]), max(res.num_steps for res in results))


def _joined_calls(parts: list[RewardOutput], every: list[RewardOutput] | None = None) -> RewardOutput:
    """`concat_outputs(parts)` with the judge's call counts of all scoring calls in `every` (default: the parts)
    added up: each chunk or dynamic round made its own calls (concat_outputs counts a call that processes share
    once)."""
    joined, every = concat_outputs(parts), every or parts
    for k in ("judge_generate_calls", "judge_cascade_generate_calls"):
        if k in joined.details and len(every) > 1:
            joined.details[k] = sum(p.details.get(k, 0) for p in every)
    return joined


def gather_rollout(local: LocalRollout, n: int, extra: Any = None) -> tuple[Rollout, list[Any]]:
    """Every process's rows of `local` (process order) as one Rollout, and every process's `extra`."""
    expanded = [q.question for q in local.questions for _ in range(n)]
    finished = local.result.finish_reason == sampling.FINISH_LENGTH
    parts = distributed.all_gather_objects((local.scored, expanded, local.responses, local.result.lengths, finished,
                                            extra, local.hint_counts_Nx3, local.hint_ids_N))
    scored = concat_outputs([part[0] for part in parts])
    expanded, responses = [x for part in parts for x in part[1]], [x for part in parts for x in part[2]]
    hint_ids = None if local.hint_ids_N is None else [x for part in parts for x in part[7]]
    samples = [{"question": expanded[i], "response": responses[i], "reward": float(scored.reward[i]),
                "scores": {d: _json_float(scored.scores[i, c]) for c, d in enumerate(scored.dimension_ids)},
                **({} if hint_ids is None else scaffold.sample_fields(hint_ids[i]))}
               for i in range(len(responses))]
    rows = slice(*distributed.block_bounds(len(responses)))
    return Rollout(local.sampled, local.groups, local.result, scored, samples,
                   np.concatenate([part[3] for part in parts]), np.concatenate([part[4] for part in parts]),
                   rows, local.timing, None if local.hint_counts_Nx3 is None else
                   np.concatenate([part[6] for part in parts])), [part[5] for part in parts]


def rollout_and_score(exp: Experiment, params: Any, questions: list[data.Question], spec: RolloutSpec,
                      key: jax.Array, chunks: int = 1, hints: scaffold.StepHints | None = None) -> Rollout:
    """Samples `spec.n` responses per question (this process's questions) with the policy (in `chunks` calls; with
    `hints`, scaffolded), scores them with their rubrics and gathers every process's scored rows."""
    return gather_rollout(sample_and_score(exp, params, questions, spec, key, chunks, hints), spec.n)[0]


def dynamic_rollout(exp: Experiment, params: Any, questions: list[data.Question], spec: RolloutSpec, key: jax.Array,
                    draw: Callable[[], list[data.Question]], rule: dynamic.DynamicSampling,
                    statistic: Callable[[LocalRollout], np.ndarray], chunks: int = 1,
                    hints: scaffold.StepHints | None = None) -> tuple[Rollout, dict[str, float]]:
    """A rollout of len(questions) groups selected by `rule` (train/dynamic.py) on each group's `statistic`: rounds
    of as many questions (`draw` gives the next batch; each round sampled in `chunks` calls) until this process's
    block holds that many kept groups, at most `rule.max_rounds` extra rounds; logs the groups seen, kept and
    dropped, the rounds, and the smallest statistic of a group in the batch (every process's)."""
    rounds: list[LocalRollout] = []
    stats: list[np.ndarray] = []
    for r in range(rule.max_rounds + 1):
        round_questions = questions if r == 0 else draw()
        local = sample_and_score(exp, params, round_questions, spec, jax.random.fold_in(key, r), chunks, hints)
        rounds.append(local)
        stats.append(statistic(local))
        if not distributed.max_over_processes(int(len(rule.kept(stats, len(questions))) < len(questions)))[0]:
            break
    chosen = sorted(dynamic.select_groups(stats, len(questions), rule))  # grouped by round
    rows = [(r, g * spec.n + j) for r, g in chosen for j in range(spec.n)]
    result = _result_rows([local.result for local in rounds], rows)
    chosen_questions = [rounds[r].questions[g] for r, g in chosen]
    scored = _joined_calls([select_rows(local.scored, [i for rr, i in rows if rr == r])
                            for r, local in enumerate(rounds) if any(rr == r for rr, _ in rows)],
                           [local.scored for local in rounds])
    first_call = np.cumsum([0] + [len(local.sampled) for local in rounds])  # round r's calls among all rounds'
    groups = tuple((int(first_call[r]) + rounds[r].groups[g][0], rounds[r].groups[g][1]) for r, g in chosen)
    timings = [local.timing for local in rounds if local.timing is not None]
    selected = LocalRollout(chosen_questions, tuple(s for local in rounds for s in local.sampled), groups, result,
                            scored, [rounds[r].responses[i] for r, i in rows],
                            sum(timings[1:], timings[0]) if timings else None,
                            None if hints is None else np.stack([rounds[r].hint_counts_Nx3[i] for r, i in rows]),
                            None if hints is None else tuple(rounds[r].hint_ids_N[i] for r, i in rows))
    seen, kept = sum(len(s) for s in stats), len(rule.kept(stats, len(questions)))
    counts = (kept, seen - kept, len(rounds), min(float(stats[r][g]) for r, g in chosen))
    gathered, every = gather_rollout(selected, spec.n, counts)
    return gathered, {"dynamic/seen_groups": float(sum(c[0] + c[1] for c in every)),
                      "dynamic/kept_groups": float(sum(c[0] for c in every)),
                      "dynamic/dropped_groups": float(sum(c[1] for c in every)),
                      "dynamic/rounds": float(max(c[2] for c in every)),
                      "dynamic/threshold_reached": min(c[3] for c in every)}


def _json_float(x: float) -> float | None:
    """A score for JSON: None for NaN (a missing score)."""
    return None if np.isnan(x) else float(x)

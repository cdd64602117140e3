"""The golden set (`config.data.golden`): held-out questions with reference answers, and optionally people's
labels of those answers, that never enter training.

`load_golden` refuses a golden set that overlaps the training questions, exactly (the same normalised
text) or as a near duplicate (character n-gram Jaccard >= `max_jaccard`, found by prepare/dedup's exact
search), naming every pair; an id shared with a training or eval question is refused too (ids key the
rubrics). Labels are checked against each question's rubric (calibration/labels). Each eval (before
GRPO, every `eval.every_steps`, at the end) adds to its row:
  golden/reward_mean, golden/reward/<dimension>   one response per golden question, eval sampler
  golden/reference/reward_mean, .../reward/<d>    the rubric reward of the reference answers (rows with one)
  golden/reference/missing/<d>                   the share of them whose score on d is missing (its judge failed:
                                                  the mean above leaves it out; alerted past monitor.max_missing_share),
                                                  with .../reward_failed_scores and the judge's counters
  golden/spearman/<d>, golden/kendall/<d>         the judge's raw scores of the reference answers vs their
                                                  labels (calibration/stats; NaN where undefined;
                                                  '<d>@<lo>-<hi>' per scale where rubrics give d several)
Scored through the same RubricReward as training. The reference answers are judged with one key at every
eval (fixed answers, fixed judge: their scores do not wander from eval to eval); with config.judge.store
the verdict store answers them after the first eval, and keeps them across resumed and repeated runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax

from rubric_jax import data
from rubric_jax.calibration.labels import LabelsError, check_label
from rubric_jax.calibration.stats import kendall_tau_b, scale_groups, spearman
from rubric_jax.judges.reward import Reward, RewardOutput
from rubric_jax.judges.store import VerdictStore
from rubric_jax.prepare.dedup import cross_duplicates, normalize_text
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.train.monitors import missing_shares
from rubric_jax.train.rollout import reward_metrics, summarize_rewards

MAX_PAIRS_SHOWN = 10  # overlapping pairs named in the error (the count says how many more)
_STATISTICS = (("spearman", spearman), ("kendall", kendall_tau_b))


class GoldenError(ValueError):
    """A golden set the trainer cannot use (overlap with training, a clashing id, a bad label)."""


@dataclasses.dataclass(frozen=True)
class GoldenSet:
    """Golden questions with the rubric that scores each (parallel lists)."""

    questions: list[data.Question]
    rubrics: list[Rubric]

    def metrics(self, policy: RewardOutput, reward: Reward, *, key: jax.Array,
                weights: Mapping[str, float] | None = None, store: VerdictStore | None = None) -> dict[str, float]:
        """The golden keys of an eval row from the policy's scored golden responses (one per question, in
        order); the reference answers are scored here with `reward` (judge key `key`, verdicts read from and
        written to `store` when given)."""
        summary = summarize_rewards(policy)
        out = {"golden/reward_mean": summary.reward_mean, **reward_metrics(summary, "golden/")}
        rows = [i for i, q in enumerate(self.questions) if q.reference is not None]
        if not rows:
            return out
        store_kwargs = {} if store is None else {"store": store}  # a reward model takes no store
        scored = reward([self.questions[i].question for i in rows], [self.questions[i].reference for i in rows],
                        [self.rubrics[i] for i in rows], key=key, weights=weights, **store_kwargs)
        summary = summarize_rewards(scored)
        out["golden/reference/reward_mean"] = summary.reward_mean
        out.update(reward_metrics(summary, "golden/reference/"))  # with its failed scores and judge counters
        out.update({f"golden/reference/missing/{d}": v for d, v in missing_shares(scored).items()})
        out.update(label_agreement([self.questions[i].labels for i in rows], scored, [self.rubrics[i] for i in rows]))
        return out


def label_agreement(labels: Sequence[Mapping[str, float]], scored: RewardOutput,
                    rubrics: Sequence[Rubric]) -> dict[str, float]:
    """golden/spearman/<d> and golden/kendall/<d> for every labelled dimension d: the judge's raw scores
    (`scored`, row i = the answer labelled by labels[i], scored on rubrics[i]) vs the labels, over rows with both.
    Rows whose rubrics give d different scales are not pooled (raw scores of a 1-5 and a 0-2 scale do not rank
    together): each scale gets its own '<d>@<lo>-<hi>' (stats.scale_groups), as the audit does."""
    out = {}
    for c, dim_id in enumerate(scored.dimension_ids):
        labelled = [i for i, row_labels in enumerate(labels) if dim_id in row_labels]
        groups = scale_groups((dim_id, rubrics[i].dimension(dim_id).scale.levels, i) for i in labelled)
        for name, (_, _, positions) in groups.items():
            rows = [i for i in positions if scored.valid[i, c]]
            judge_n = scored.details["raw_scores"][rows, c]
            label_n = [labels[i][dim_id] for i in rows]
            for stat_name, statistic in _STATISTICS:
                value = statistic(judge_n, label_n).value
                out[f"golden/{stat_name}/{name}"] = math.nan if value is None else value
    return out


def overlaps(golden: Sequence[data.Question], train: Sequence[data.Question], max_jaccard: float,
             n: int = 3) -> list[str]:
    """Each golden question that duplicates a training one, as "golden 'ID' = train 'ID' (exact)" or
    "golden 'ID' ~ train 'ID' (Jaccard 0.83)" (character n-gram Jaccard >= max_jaccard), sorted."""
    pairs = cross_duplicates([q.question for q in golden], [q.question for q in train], max_jaccard, n)
    named = []
    for g, t, jaccard in sorted(pairs):
        pair = f"golden {golden[g].id!r} {{}} train {train[t].id!r}"
        exact = normalize_text(golden[g].question) == normalize_text(train[t].question)
        named.append(pair.format("=") + " (exact)" if exact else pair.format("~") + f" (Jaccard {jaccard:.2f})")
    return named


def load_golden(spec: str, tfds_dir: str, shared: Rubric, train: Sequence[data.Question],
                held_out: Sequence[data.Question], max_jaccard: float) -> GoldenSet:
    """The golden set named by `config.data.golden` (a jsonl path or `tfds:NAME[:SPLIT]`, split "golden"),
    checked against the training questions and `held_out` (eval) ids; GoldenError names every problem."""
    where = f"config.data.golden={spec}"
    if not 0.0 < max_jaccard <= 1.0:
        raise GoldenError(f"config.data.golden_max_jaccard={max_jaccard!r}: expected a number in (0, 1]")
    questions = data.load_question_set(spec, tfds_dir, "golden")
    clash = sorted({q.id for q in questions} & {q.id for q in (*train, *held_out)})
    if clash:
        raise GoldenError(f"{where}: ids {clash[:MAX_PAIRS_SHOWN]} are also training or eval question ids")
    pairs = overlaps(questions, train, max_jaccard)
    if pairs:
        more = f"; and {len(pairs) - MAX_PAIRS_SHOWN} more" if len(pairs) > MAX_PAIRS_SHOWN else ""
        raise GoldenError(f"{where}: {len(pairs)} golden questions overlap the training questions (exact, or "
                          f"character 3-gram Jaccard >= {max_jaccard:g}); a golden question must never be trained "
                          f"on: {'; '.join(pairs[:MAX_PAIRS_SHOWN])}{more}")
    rubrics = [data.question_rubric(shared, q) for q in questions]
    for q, rubric in zip(questions, rubrics):
        for dim_id, value in q.labels.items():
            try:
                check_label(rubric, dim_id, value, f"{where}: question {q.id!r}: labels")
            except LabelsError as e:
                raise GoldenError(str(e)) from None
    return GoldenSet(questions, rubrics)

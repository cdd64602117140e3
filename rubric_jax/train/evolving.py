"""Rubrics that evolve with the policy (`rl.rubric_refresh_every` = N; issue 37 §2), after open-instruct's evolving
rubrics (PRs #1460, #1581): the seed article's §6 names what a static rubric suffers, saturation and hacking.

Every N GRPO steps, once the step's groups are scored:
  pairs    the `rl.rubric_refresh_pairs` groups with the widest spread of ok rewards (ties: batch order; a flat group
           has no pair) give their best- and worst-rewarded answers; the step's other groups are held out;
  propose  the judge's LLM (its backend: in process, served or an API; qurl/textgen.judge_generator) reads the
           rubric's criteria and the fenced pairs (qurl/prompts/rubric_refresh.txt) and writes qurl.num_candidates
           replies, each parsed strictly as a QuRL candidate (construction.parse_candidate: the rubric schema validates
           it as it validates a user's rubric, with QuRL's bounds on points and criteria); an invalid reply is
           re-prompted up to qurl.max_retries times, then counted (rubric/refresh/invalid) and dropped;
  merge    the valid replies' criteria are merged as QuRL merges them (filtering.merge_criteria, support 1); one that
           repeats a criterion of the rubric (filtering.same_criterion) or reuses an id of a training question's
           rubric is dropped (rubric/refresh/duplicate);
  filter   each criterion alone scores every answer of the pair groups and of the held-out groups with the run's
           reward (its judges); QuRL's filter (filtering.filter_reason with qurl.min_valid_answers, min_std and
           min_spread) must pass on both sets, else rubric/refresh/not_discriminating; of those kept, the
           `rl.rubric_refresh_max_new` with the largest smaller std join the rubric (weight = points, QuRL's);
  retire   a criterion a refresh added whose monitor/saturation on the step (train/monitors.py) is at or above
           `rl.rubric_retire_saturation` retires: it gives GRPO no signal any more. The rubric the run started with
           never changes (open-instruct keeps its base rubric too): its gates and penalties stay, whatever an LLM writes.
A change is a new version of the shared rubric (minor + 1, with a changelog entry) with a new content hash; the training
questions' rubrics (shared + their own criteria) follow it, while eval and golden questions keep the starting rubric, so
eval/reward_mean stays comparable across versions (rubrics are found by question id: a run whose eval questions share an
id with a training question is refused at start-up, as golden ones always are). Each GRPO row carries rubric/version and
rubric/hash, and a refresh's row rubric/added, rubric/retired and the counts. The state (current rubric, evolved ids,
versions) is saved in each GRPO checkpoint's metadata, so a resumed run continues the same version sequence; every
version is also written, atomically, to <workdir>/rubric_versions/<version>.json. The refresh runs on one process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rubric_jax import data, distributed, text
from rubric_jax.files import write_atomic
from rubric_jax.judges.prompts import fence
from rubric_jax.judges.reward import Reward
from rubric_jax.qurl import construction, filtering
from rubric_jax.qurl.config import BuildConfig
from rubric_jax.qurl.templates import ChatPrompt, PromptTemplate, load_template
from rubric_jax.qurl.textgen import TextGenerator
from rubric_jax.rubrics.schema import (ChangelogEntry, Dimension, Rubric, RubricError, parse_version, rubric_from_dict,
                                       rubric_to_dict, with_version)
from rubric_jax.train.blocks import RLBlock

TEMPLATE = "rubric_refresh"
VERSIONS_DIR = "rubric_versions"
REFRESH_KEY = 2**31 - 3  # fold_in data (into the run key) of the refreshes' keys; then fold_in the step
EXTENDABLE = ("weighted_sum", "weighted_geometric_mean", "min")  # aggregations a plain criterion can join


def check_start(rubric: Rubric, where: str, processes: int) -> None:
    """At start-up: one process (the refresh runs on one), and a rubric whose aggregation a proposed (ungrouped,
    integer-scale) criterion can join."""
    if processes > 1:
        raise ValueError(f"config.rl.rubric_refresh_every: the rubric refresh runs on one process, this job has "
                         f"{processes}; set config.rl.rubric_refresh_every=0")
    if rubric.aggregation.method not in EXTENDABLE:
        raise ValueError(f"{where}: rl.rubric_refresh_every adds ungrouped integer-scale criteria; rubric "
                         f"{rubric.name!r} aggregates with {rubric.aggregation.method!r} (use one of {EXTENDABLE})")


def check_held_out(train: Sequence[data.Question], evaluation: Sequence[data.Question]) -> None:
    """At start-up: no eval question shares an id with a training question. A question's rubric is found by its id
    (Experiment.rubric_of), so such an eval question would be scored with the evolved criteria, which are for the
    training questions only (eval/reward_mean must stay comparable across versions)."""
    train_source = {q.id: q.source for q in train}
    shared = [q for q in evaluation if q.id in train_source]
    if shared:
        more = f" (and {len(shared) - 1} more)" if len(shared) > 1 else ""
        raise ValueError(f"config.rl.rubric_refresh_every: question id {shared[0].id!r} is an eval question "
                         f"({shared[0].source}) and a training question ({train_source[shared[0].id]}){more}; a "
                         f"question's rubric is found by its id, so the evolved criteria would reach the eval "
                         f"question: give the eval questions ids of their own (a held-out set), or set "
                         f"config.rl.rubric_refresh_every=0")


@dataclasses.dataclass(frozen=True)
class Split:
    """A step's groups for a refresh: the (best, worst) row of each shown group, and the rows of the shown groups and
    of the held-out ones."""

    pairs: tuple[tuple[int, int], ...]
    shown_rows: tuple[int, ...]
    held_rows: tuple[int, ...]


def split_groups(reward_N: np.ndarray, ok_N: np.ndarray, n: int, pairs: int) -> Split:
    """The `pairs` groups of `n` rows with the widest spread of ok rewards (> 0; ties in batch order) and their best
    and worst ok rows (the first on ties); every other group is held out."""
    groups = len(reward_N) // n
    spread, extremes = [], []
    for g in range(groups):
        rows = [g * n + i for i in range(n) if ok_N[g * n + i]]
        values = [float(reward_N[r]) for r in rows]
        spread.append(max(values) - min(values) if len(rows) > 1 else 0.0)
        extremes.append((rows[int(np.argmax(values))], rows[int(np.argmin(values))]) if rows else (0, 0))
    shown = sorted(sorted((g for g in range(groups) if spread[g] > 0), key=lambda g: (-spread[g], g))[:pairs])
    held = [g for g in range(groups) if g not in shown]
    return Split(tuple(extremes[g] for g in shown), _rows(shown, n), _rows(held, n))


def _rows(groups: Sequence[int], n: int) -> tuple[int, ...]:
    """The rows of `groups` of `n` rows each."""
    return tuple(g * n + i for g in groups for i in range(n))


def refresh_prompt(template: PromptTemplate, rubric: Rubric, pairs: Sequence[tuple[str, str, str]], cfg: BuildConfig,
                   most: int, nonce: str, reserved: Sequence[str]) -> ChatPrompt:
    """The proposer's prompt: the rubric's criteria and each (question, better, worse) answer pair, every text fenced."""
    criteria = "\n".join(f"- {d.id}: {d.description}" for d in rubric.dimensions)
    blocks = [f"Pair {i}:\n" + "\n".join(fence(body, tag, nonce, reserved) for tag, body in
                                          (("question", q), ("better", better), ("worse", worse)))
              for i, (q, better, worse) in enumerate(pairs, start=1)]
    return template.render(criteria=criteria, pairs="\n\n".join(blocks), min_criteria="1",
                           max_criteria=str(min(most, cfg.max_criteria)), max_points=str(cfg.max_points))


@dataclasses.dataclass
class EvolvingRubric:
    """The run's evolving shared rubric: the current version, the ids its refreshes added (the ones that may retire)
    and every version so far ({"version", "hash", "step", "added", "retired"})."""

    rubric: Rubric
    evolved: list[str]
    versions: list[dict[str, Any]]

    @classmethod
    def start(cls, base: Rubric) -> EvolvingRubric:
        """The state of a run that has not refreshed yet: `base`, version 1 of its sequence."""
        return cls(base, [], [{"version": base.version, "hash": base.content_hash, "step": 0, "added": [],
                                     "retired": []}])

    def to_json(self) -> dict[str, Any]:
        """What a GRPO checkpoint saves (the rubric as data: a resumed run parses it again, strictly)."""
        return {"rubric": rubric_to_dict(self.rubric), "evolved": list(self.evolved), "versions": self.versions}

    def load_json(self, saved: Mapping[str, Any]) -> None:
        """Restores `to_json`'s output."""
        self.rubric = rubric_from_dict(saved["rubric"], source="the GRPO checkpoint's rubric_evolution")
        self.evolved, self.versions = list(saved["evolved"]), [dict(v) for v in saved["versions"]]

    def row(self) -> dict[str, Any]:
        """rubric/version and rubric/hash of the version in use."""
        return {"rubric/version": self.rubric.version, "rubric/hash": self.rubric.content_hash}

    def next_version(self, step: int, added: Sequence[Dimension], retired: Sequence[str], reason: str) -> Rubric:
        """The rubric with `retired` removed and `added` appended, one minor version up, validated as a user's rubric
        is (rubric_from_dict); records the version."""
        major, minor, _ = parse_version(self.rubric.version)
        dims = tuple(d for d in self.rubric.dimensions if d.id not in retired) + tuple(added)
        change = f"rubric refresh at GRPO step {step}: added {[d.id for d in added]}, retired {list(retired)}"
        proposed = with_version(self.rubric, f"{major}.{minor + 1}.0", change, reason, dimensions=dims)
        rubric = rubric_from_dict(rubric_to_dict(proposed), source=f"rubric refresh at step {step}")
        self.rubric = rubric
        self.evolved = [i for i in self.evolved if i not in retired] + [d.id for d in added]
        self.versions.append({"version": rubric.version, "hash": rubric.content_hash, "step": step,
                              "added": [d.id for d in added], "retired": list(retired)})
        return rubric


@dataclasses.dataclass
class Refresher:
    """What a refresh needs from the run: its settings, the proposer, the reward, the training questions and their
    rubrics (updated in place), and where versions are written."""

    rl: RLBlock
    qurl: BuildConfig
    generator: TextGenerator
    reward: Reward
    template: PromptTemplate
    train_questions: Sequence[data.Question]
    rubric_of: dict[str, Rubric]  # the experiment's: the training questions' entries follow each version
    workdir: Path
    key: jax.Array
    state: EvolvingRubric

    def due(self, step: int) -> bool:
        """Whether GRPO step `step` refreshes the rubric."""
        return step % self.rl.rubric_refresh_every == 0

    def restore(self, saved: Mapping[str, Any] | None) -> None:
        """A resumed run's state (None: a fresh one), and the training questions' rubrics that follow it."""
        if saved is not None:
            self.state.load_json(saved)
        self._apply(self.state.rubric)

    def _apply(self, rubric: Rubric) -> None:
        """Every training question's rubric from `rubric` (shared + its own criteria, or its replacement)."""
        self.rubric_of.update({q.id: data.question_rubric(rubric, q) for q in self.train_questions})

    def refresh(self, step: int, questions_N: Sequence[str], responses_N: Sequence[str], reward_N: np.ndarray,
                ok_N: np.ndarray, n: int, monitors: Mapping[str, Any]) -> dict[str, Any]:
        """One refresh from the step's scored rows (`n` per group) and monitor values; returns its metrics."""
        key = jax.random.fold_in(self.key, step)
        split = split_groups(reward_N, ok_N, n, self.rl.rubric_refresh_pairs)
        retired = [i for i in self.state.evolved if _at_least(monitors.get(f"monitor/saturation/{i}"),
                                                              self.rl.rubric_retire_saturation)]
        counts = {"proposals": 0, "invalid": 0, "duplicate": 0, "not_discriminating": 0, "kept": 0}
        added: list[Dimension] = []
        if split.pairs and split.held_rows:
            added = self._propose(split, questions_N, responses_N, counts, key)
        metrics = {f"rubric/refresh/{name}": value for name, value in counts.items()}
        if added or retired:
            reason = (f"prompt {self.template.tag}; {len(split.pairs)} pair(s), qurl.min_std={self.qurl.min_std}, "
                      f"min_spread={self.qurl.min_spread}, retire at saturation >= {self.rl.rubric_retire_saturation}")
            try:
                rubric = self.state.next_version(step, added, retired, reason)
            except RubricError as e:  # the whole rubric refused (e.g. past its limits): counted, the old one stays
                metrics["rubric/refresh/rejected"] = 1
                print(f"rubric refresh at step {step}: the new version is not a valid rubric ({e}); kept "
                      f"{self.state.rubric.version}", file=sys.stderr)
                added, retired = [], []
            else:
                self._apply(rubric)
                if distributed.is_writer():
                    write_atomic(self.workdir / VERSIONS_DIR / f"{rubric.version}.json",
                                 json.dumps(rubric_to_dict(rubric), indent=2, ensure_ascii=False) + "\n")
        return {**metrics, "rubric/added": [d.id for d in added], "rubric/retired": retired, **self.state.row()}

    def _propose(self, split: Split, questions_N: Sequence[str], responses_N: Sequence[str], counts: dict[str, int],
                 key: jax.Array) -> list[Dimension]:
        """The proposer's criteria that survive parsing, merging and the filter (module docstring), best first."""
        cfg, rubric = self.qurl, self.state.rubric
        most = self.rl.rubric_refresh_max_new
        pairs = [(questions_N[b], text.read(responses_N[b], "answer"), text.read(responses_N[w], "answer"))
                 for b, w in split.pairs]
        changelog = ChangelogEntry("1.0.0", "proposed criteria", f"prompt {self.template.tag}")
        generate_key, judge_key = jax.random.split(key)
        outcomes, _ = construction.generate_validated(
            self.generator, lambda r, nonce: refresh_prompt(self.template, rubric, pairs, cfg, most, nonce,
                                                            self.generator.reserved),
            1, lambda r, reply: construction.parse_candidate(
                reply, name=f"{rubric.name}/proposal", changelog=changelog, num_references=0, min_criteria=1,
                max_criteria=min(most, cfg.max_criteria), max_points=cfg.max_points),
            generate_key, samples=cfg.num_candidates, max_retries=cfg.max_retries,
            max_new_tokens=cfg.rubric_max_new_tokens)
        candidates = [o.value for o in outcomes[0] if o.value is not None]
        counts["proposals"], counts["invalid"] = len(outcomes[0]), len(outcomes[0]) - len(candidates)
        if not candidates:
            return []
        merged = filtering.merge_criteria(candidates, [0.0] * len(candidates), threshold=cfg.merge_threshold,
                                          min_support=1, max_criteria=len(candidates) * cfg.max_criteria)
        taken = {i.casefold() for q in self.train_questions for i in self.rubric_of[q.id].dimension_ids}
        fresh = [m.dimension for m in merged.criteria if m.dimension.id.casefold() not in taken
                 and not any(filtering.same_criterion(m.dimension, d, cfg.merge_threshold) for d in rubric.dimensions)]
        counts["duplicate"] = len(merged.criteria) - len(fresh)
        kept = self._discriminating(fresh, split, questions_N, responses_N, judge_key)
        counts["not_discriminating"] = len(fresh) - len(kept)
        counts["kept"] = min(len(kept), most)
        return [d for d, _ in sorted(kept, key=lambda kept_std: -kept_std[1])[:most]]

    def _discriminating(self, criteria: Sequence[Dimension], split: Split, questions_N: Sequence[str],
                        responses_N: Sequence[str], key: jax.Array) -> list[tuple[Dimension, float]]:
        """The criteria that pass QuRL's filter on the shown and on the held-out rows, each scored alone (one reward
        call), with the smaller of the two stds."""
        if not criteria:
            return []
        alone = [Rubric(f"{self.state.rubric.name}/proposal", "1.0.0",
                        (ChangelogEntry("1.0.0", "one proposed criterion", "rubric refresh filter"),), (d,))
                 for d in criteria]
        rows = split.shown_rows + split.held_rows
        cells = [(c, r) for c in range(len(criteria)) for r in rows]
        scored = self.reward([questions_N[r] for _, r in cells], [responses_N[r] for _, r in cells],
                             [alone[c] for c, _ in cells], key=key)
        rewards = np.where(scored.details["reward_ok"], scored.reward, np.nan).astype(np.float64)
        rewards = rewards.reshape(len(criteria), len(rows))
        kept = []
        for c, dim in enumerate(criteria):
            parts = (rewards[c, :len(split.shown_rows)], rewards[c, len(split.shown_rows):])
            stats = [filtering.discrimination(part) for part in parts]
            if all(filtering.filter_reason(s, min_valid_answers=self.qurl.min_valid_answers, min_std=self.qurl.min_std,
                                           min_spread=self.qurl.min_spread) is None for s in stats):
                kept.append((dim, min(s.std for s in stats)))
        return kept


def _at_least(value: Any, threshold: float) -> bool:
    """A finite monitor value at or above `threshold` (NaN, a missing value or a string never is)."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= threshold


def build_refresher(rl: RLBlock, qurl: BuildConfig, generator: TextGenerator, reward: Reward,
                    train_questions: Sequence[data.Question], rubric_of: dict[str, Rubric], shared: Rubric,
                    workdir: Path, run_key: jax.Array) -> Refresher:
    """The refresher of a run (rl.rubric_refresh_every > 0) starting from `shared`."""
    return Refresher(rl, qurl, generator, reward, load_template(TEMPLATE), train_questions, rubric_of, workdir,
                     jax.random.fold_in(run_key, REFRESH_KEY), EvolvingRubric.start(shared))


"""Reward-hacking monitors of every GRPO step, and the alerts their thresholds raise (RubricRL §3.3, §6).

Every GRPO metrics row gets these keys, whatever the rubric's dimensions (shape legend: N rollouts):
  monitor/template_share          share of responses whose answer follows a template, 首先…其次…最后 or
                                  first…second…finally (the rule library's TemplatePhrases detector, on the
                                  answer as the template dimension reads it: rubric_jax/text.py)
  monitor/length_drift            mean response tokens / the first GRPO step's mean − 1 (0 at step 1)
  monitor/var/<dimension>         variance of the dimension's valid normalised scores (the mean is reward/<dimension>)
  monitor/saturation/<dimension>  share of the dimension's valid scores at its top level (normalised 1)
  monitor/missing/<dimension>     share of the rows with the dimension whose score is missing (its judge failed:
                                  the reward leaves it out, so a dimension that always fails trains nothing)
  monitor/reward_length_corr      Spearman of reward vs response tokens over the step's ok rollouts
  monitor/judge_parse_failure     share of LLM-judge prompts without a parseable verdict: rejected by the parser,
                                  cut at max_new_tokens, or too long to send ((judge_invalid + judge_prompt_too_long)
                                  / (judge_prompts + judge_prompt_too_long); 1 when every one failed)
  monitor/<m>/window_mean          for the windowed monitors (WINDOWED): the mean of <m> over the last
                                  `config.monitor.window_steps` GRPO steps (NaN until that many exist)
  monitor/saturation/<d>/rise     the saturation's mean over the last window minus its mean over the run's first
                                  window (steps 1-W; NaN before step W): penalty and gate dimensions sit at their top
                                  level from step 1 by design, so the alert reads how far a dimension climbed there
  monitor/redundancy/<a>__<b>     Spearman of dimensions a and b over the rollouts of the last window (RubricRL §2.1
                                  MECE: near 1 = one thing measured twice; Watch.redundancy, calibration/redundancy.py);
                                  a pair constant in the window, or sharing too few rows, is not written
A value that does not exist (no judge answers, a constant column, no valid score) is NaN ("nan" in
metrics.jsonl), never 0. A value past its `config.monitor` threshold (CHECKS) is an alert: one line in
<workdir>/alerts.jsonl {"step", "stage", "metric", "value", "threshold", "op", "message", "time"} and
one log line such as `alert step 120: template share, mean of steps 111-120 0.61 > 0.40`. Eval rows are checked
too (the golden set's Spearman per dimension, and golden/reference/missing/<d>: the share of the golden reference
answers whose score on d is missing, under max_missing_share; train/golden.py).

Why windows: the template share and the reward-length Spearman of one step describe that step's 8 or so questions
as much as the policy (a cold-start policy that memorised a scaffolded answer for 13% of the questions reads 0.42
on a batch that happens to draw several of them), so their alerts compare a rolling mean, which a sustained rise
crosses and a one-batch spike does not.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tqdm

from rubric_jax import distributed, metrics, text
from rubric_jax.calibration.redundancy import PAIR_SEPARATOR, pairwise_spearman
from rubric_jax.calibration.stats import spearman
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.judges.rules import TemplatePhrases
from rubric_jax.train.blocks import MonitorBlock

_TOP = 1.0 - 1e-6  # a normalised score at or above this is at the dimension's top level


@dataclasses.dataclass(frozen=True)
class Check:
    """An alert on the metrics matching `pattern` (group 1, if any, is a dimension id): "max" fires when a
    value is above the threshold `config.monitor.<field>`, "min" when below (its bounds: train/blocks.py)."""

    field: str
    pattern: str
    words: str  # the metric in the log line; "{}" is replaced by a dimension id, "{window}" by window_words,
    # "{first}" by the run's first window ("steps 1-10")
    kind: str  # "max" (fires above), "min" (below) or "at_least" (at or above)


WINDOWED = ("monitor/template_share", "monitor/reward_length_corr", "zero_std_frac")  # alerts on their rolling means
_SATURATION = re.compile(r"^monitor/saturation/[^/]+$")  # a dimension's per-step saturation (its rise is alerted)
REDUNDANCY_PREFIX = "monitor/redundancy/"
MIN_REDUNDANCY_ROWS = 16  # fewer rollouts scoring both dimensions in the window: no Spearman is written
_OPS = {"max": ">", "min": "<", "at_least": ">="}
CHECKS = (
    Check("max_template_share", r"^monitor/template_share/window_mean$", "template share{window}", "max"),
    Check("max_length_drift", r"^monitor/length_drift$", "length drift", "max"),
    Check("max_saturation_rise", r"^monitor/saturation/(.+)/rise$", "saturation rise of {}{window} over {first}",
          "max"),
    Check("max_missing_share", r"^monitor/missing/(.+)$", "missing scores of {}", "max"),
    Check("max_missing_share", r"^golden/reference/missing/(.+)$", "missing scores of {} on the golden references",
          "max"),
    Check("max_zero_std_frac", r"^zero_std_frac/window_mean$", "zero-std group share{window}", "max"),
    Check("max_redundancy", rf"^{REDUNDANCY_PREFIX}(.+?){PAIR_SEPARATOR}(.+)$",
          "redundancy: Spearman of {} and {}{window}", "at_least"),
    Check("max_reward_length_corr", r"^monitor/reward_length_corr/window_mean$",
          "reward-length correlation{window}", "max"),
    Check("max_judge_parse_failure", r"^monitor/judge_parse_failure$", "judge parse failures", "max"),
    Check("min_golden_spearman", r"^golden/spearman/(.+)$", "golden Spearman of {}", "min"),
    Check("min_audit_agreement", r"^audit/(spearman|kappa)/(.+)$", "audit {} of {} (training vs audit judge)", "min"),
    Check("max_audit_gap_rise", r"^audit/gap/(.+)/rise$", "audit gap rise of {} (training minus audit judge)", "max"),
)


def thresholds(monitor: MonitorBlock) -> dict[str, float]:
    """The `config.monitor` thresholds by field (their bounds are the block's: train/blocks.py MonitorBlock)."""
    return {check.field: float(getattr(monitor, check.field)) for check in CHECKS}


def _nan_or(value: float | None) -> float:
    return math.nan if value is None else float(value)


def step_monitors(responses: Sequence[str], lengths_N: np.ndarray, scored: RewardOutput) -> dict[str, float]:
    """The monitors one scored rollout batch determines (all but the length drift, which needs the first step)."""
    answers = [text.read(r, "answer") for r in responses]
    out = {"monitor/template_share": float(TemplatePhrases().matches(answers).mean())}
    for c, dim_id in enumerate(scored.dimension_ids):
        valid_scores = scored.scores[scored.valid[:, c], c]
        out[f"monitor/var/{dim_id}"] = float(valid_scores.var()) if valid_scores.size else math.nan
        out[f"monitor/saturation/{dim_id}"] = float((valid_scores >= _TOP).mean()) if valid_scores.size else math.nan
    out.update({f"monitor/missing/{dim_id}": share for dim_id, share in missing_shares(scored).items()})
    ok_N = np.asarray(scored.details["reward_ok"], bool)
    out["monitor/reward_length_corr"] = _nan_or(spearman(scored.reward[ok_N], np.asarray(lengths_N)[ok_N]).value)
    too_long = scored.details.get("judge_prompt_too_long", 0)
    tried = scored.details.get("judge_prompts", 0) + too_long
    out["monitor/judge_parse_failure"] = (scored.details["judge_invalid"] + too_long) / tried if tried else math.nan
    return out


def missing_shares(scored: RewardOutput) -> dict[str, float]:
    """Per dimension, the share of the rows with it whose score is missing (its judge failed; 0 when none has it)."""
    out = {}
    for c, dim_id in enumerate(scored.dimension_ids):
        missing = scored.details.get("failures", {}).get(dim_id, 0)  # with the scores too long to judge (valid at 0)
        present = int(scored.valid[:, c].sum()) - scored.details.get("scored_minimum", {}).get(dim_id, 0)
        out[dim_id] = missing / (present + missing) if present + missing else 0.0
    return out


@dataclasses.dataclass(frozen=True)
class Alert:
    """A metric past its threshold at one step."""

    step: int
    stage: str
    metric: str
    value: float
    threshold: float
    op: str  # ">" or "<"
    message: str  # the log line


def window_words(step: int, window: int) -> str:
    """The steps a window mean covers, as its alert line names them: ", mean of steps 19-28" (nothing for a window
    of 1: the step's own value)."""
    return "" if window == 1 else f", mean of steps {step - window + 1}-{step}"


def _fires(kind: str, value: float, limit: float) -> bool:
    return {"max": value > limit, "min": value < limit, "at_least": value >= limit}[kind]


def find_alerts(step: int, stage: str, row: Mapping[str, Any], limits: Mapping[str, float],
                window: int = 1) -> list[Alert]:
    """Every metric of `row` past its threshold, in CHECKS order then by metric name (NaN never fires); `window` is
    the steps behind the row's window means (named in their alert lines)."""
    alerts = []
    first = "step 1" if window == 1 else f"steps 1-{window}"
    for check in CHECKS:
        limit = limits[check.field]
        for key in sorted(row):
            match = re.match(check.pattern, key)
            value = metrics.scalar_value(row[key]) if match else None
            if value is None or math.isnan(value) or not _fires(check.kind, value, limit):
                continue
            op = _OPS[check.kind]
            words = check.words.format(*match.groups(), window=window_words(step, window), first=first)
            digits = next((d for d in range(2, 7) if f"{value:.{d}f}" != f"{limit:.{d}f}"),
                          6 if value != limit else 2)  # never "0.40 > 0.40"
            message = f"alert step {step}: {words} {value:.{digits}f} {op} {limit:.{digits}f}"
            alerts.append(Alert(step, stage, key, value, limit, op, message))
    return alerts


def _finite_mean(values: Sequence[float]) -> float:
    """The mean of the finite values (NaN when there is none)."""
    finite = [v for v in values if math.isfinite(v)]
    return math.fsum(finite) / len(finite) if finite else math.nan


class Watch:
    """The run's monitors over steps: the first GRPO step's length, the last `window` steps' values of the
    WINDOWED monitors and of each dimension's saturation, the saturation over the run's first window (all read back
    from metrics.jsonl on resume, which the trainer trims to its checkpoint first), the last `window` steps' scores
    (redundancy), the alert checks, alerts.jsonl and the log lines."""

    def __init__(self, limits: Mapping[str, float], workdir: str | Path, window: int = 1,
                 log: Callable[[str], None] = tqdm.tqdm.write, open_logs: Callable[[], Any] = lambda: None):
        self.limits = dict(limits)
        self.window = window
        self.path = Path(workdir) / metrics.ALERTS_FILE
        self.log = log
        self.open_logs = open_logs  # the trainer's RunLog cuts the logs back to its checkpoint when opened
        self.metrics_path = Path(workdir) / metrics.METRICS_FILE
        self.first_length: float | None = None
        self.recent: dict[str, collections.deque[float]] | None = None  # windowed key -> its last `window` values
        self.first_window: dict[str, list[float]] = {}  # saturation key -> its values at steps 1..window
        self.scores: collections.deque[tuple[list[str], np.ndarray]] = collections.deque(maxlen=window)

    def _logged_grpo_rows(self, step: int) -> list[dict[str, Any]]:
        """The GRPO rows before `step` in metrics.jsonl: read at the first GRPO row this process observes, after a
        resume has cut the log back to its checkpoint."""
        self.open_logs()
        rows = metrics.read_jsonl_metrics(self.metrics_path) if self.metrics_path.exists() else []
        return [r for r in rows if r.get("stage") == "grpo" and r["step"] < step]

    def _remember(self, step: int, row: Mapping[str, Any]) -> None:
        """Appends a GRPO row's WINDOWED values (NaN for a missing one) and saturations to the window, and to the
        first window while `step` is in it."""
        for key in (*WINDOWED, *(k for k in row if _SATURATION.match(k))):
            value = metrics.scalar_value(row.get(key))
            value = math.nan if value is None else value
            self.recent.setdefault(key, collections.deque(maxlen=self.window)).append(value)
            if _SATURATION.match(key) and step <= self.window:
                self.first_window.setdefault(key, []).append(value)

    def _window_means(self, step: int, row: Mapping[str, Any]) -> dict[str, float]:
        """monitor/<m>/window_mean of each WINDOWED monitor: the mean of its finite values over this step and the
        `window` - 1 before it (NaN before `window` steps exist, or when none of them is finite); and each
        saturation's rise: its window mean minus its mean over steps 1..window."""
        self._remember(step, row)
        means = {}
        for key, values in self.recent.items():
            mean = _finite_mean(values) if len(values) == self.window else math.nan
            if key in WINDOWED:
                means[f"{key}/window_mean"] = mean
            elif key in row:  # a saturation of this step's dimensions
                means[f"{key}/rise"] = mean - _finite_mean(self.first_window.get(key, []))
        return means

    def redundancy(self, dimension_ids: Sequence[str], scores_NxD: np.ndarray, valid_NxD: np.ndarray
                   ) -> dict[str, float]:
        """monitor/redundancy/<a>__<b>: Spearman of two dimensions' scores over the rollouts of this step and the
        `window` - 1 before it (nothing before `window` steps: the window is held in memory, so a resumed run
        refills it); a pair constant over the window, or scored together on fewer than MIN_REDUNDANCY_ROWS
        rollouts, is left out."""
        self.scores.append((list(dimension_ids), np.where(valid_NxD, scores_NxD, np.nan)))
        if len(self.scores) < self.window:
            return {}
        ids = list(dict.fromkeys(d for step_ids, _ in self.scores for d in step_ids))
        columns = {d: np.concatenate([s_NxD[:, step_ids.index(d)] if d in step_ids else np.full(len(s_NxD), np.nan)
                                      for step_ids, s_NxD in self.scores]) for d in ids}
        return {f"{REDUNDANCY_PREFIX}{p.a}{PAIR_SEPARATOR}{p.b}": p.value for p in pairwise_spearman(columns)
                if p.value is not None and p.n >= MIN_REDUNDANCY_ROWS}

    def scores_to_json(self) -> list[dict[str, Any]]:
        """The redundancy window's scores (NaN as null), saved in a checkpoint's metadata so a resumed run computes
        the same monitor/redundancy values as an uninterrupted one."""
        return [{"ids": ids, "scores": [[None if math.isnan(v) else v for v in row] for row in s_NxD.tolist()]}
                for ids, s_NxD in self.scores]

    def load_scores_json(self, saved: Sequence[Mapping[str, Any]]) -> None:
        """Restores `scores_to_json`'s output."""
        self.scores.clear()
        for entry in saved:
            s_NxD = np.array(entry["scores"], dtype=np.float64).reshape(-1, len(entry["ids"]))
            self.scores.append((list(entry["ids"]), s_NxD))

    def observe(self, step: int, row: dict[str, Any]) -> dict[str, Any]:
        """`row` (with its "stage"), plus monitor/length_drift, the window means and saturation rises on GRPO
        rows; its alerts are appended to alerts.jsonl and logged. Call before writing the row."""
        if row["stage"] == "grpo":
            if self.recent is None:  # the first GRPO row this process sees: a resume reads the steps before it
                logged = self._logged_grpo_rows(step) if step > 1 else []
                first = [r["response_len/mean"] for r in logged if r["step"] == 1]
                self.first_length = first[0] if first else None
                self.recent = {}
                for earlier in logged:
                    self._remember(earlier["step"], earlier)
            length = float(row["response_len/mean"])
            if self.first_length is None:
                self.first_length = length
            row = {**row, "monitor/length_drift": length / self.first_length - 1.0 if self.first_length else math.nan,
                   **self._window_means(step, row)}
        found = find_alerts(step, row["stage"], row, self.limits, self.window)
        if found:
            self.open_logs()
        if found and distributed.is_writer():  # a multi-process job: process 0 writes and logs the alerts
            with self.path.open("a", encoding="utf-8") as f:
                for alert in found:
                    line = {**metrics.jsonable(dataclasses.asdict(alert)), "time": time.time()}
                    f.write(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n")
            for alert in found:
                self.log(alert.message)
        return row

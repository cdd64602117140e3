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
A value that does not exist (no judge answers, a constant column, no valid score) is NaN ("nan" in
metrics.jsonl), never 0. A value past its `config.monitor` threshold (CHECKS) is an alert: one line in
<workdir>/alerts.jsonl {"step", "stage", "metric", "value", "threshold", "op", "message", "time"} and
one log line such as `alert step 120: template share, mean of steps 111-120 0.61 > 0.40`. Eval rows are checked
too (the golden set's Spearman per dimension, train/golden.py).

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
from rubric_jax.calibration.stats import spearman
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.judges.rules import TemplatePhrases

_TOP = 1.0 - 1e-6  # a normalised score at or above this is at the dimension's top level


@dataclasses.dataclass(frozen=True)
class Check:
    """An alert on the metrics matching `pattern` (group 1, if any, is a dimension id): "max" fires when a
    value is above the threshold `config.monitor.<field>`, "min" when below; `bounds` are its legal values."""

    field: str
    pattern: str
    words: str  # the metric in the log line; "{}" is replaced by the dimension id, "{window}" by window_words
    kind: str
    bounds: tuple[float, float]


WINDOWED = ("monitor/template_share", "monitor/reward_length_corr")  # alerts on their rolling means
WINDOW_FIELD = "window_steps"  # config.monitor's window of WINDOWED (a positive int)
CHECKS = (
    Check("max_template_share", r"^monitor/template_share/window_mean$", "template share{window}", "max", (0.0, 1.0)),
    Check("max_length_drift", r"^monitor/length_drift$", "length drift", "max", (0.0, math.inf)),
    Check("max_saturation", r"^monitor/saturation/(.+)$", "saturation of {}", "max", (0.0, 1.0)),
    Check("max_missing_share", r"^monitor/missing/(.+)$", "missing scores of {}", "max", (0.0, 1.0)),
    Check("max_reward_length_corr", r"^monitor/reward_length_corr/window_mean$",
          "reward-length correlation{window}", "max", (-1.0, 1.0)),
    Check("max_judge_parse_failure", r"^monitor/judge_parse_failure$", "judge parse failures", "max", (0.0, 1.0)),
    Check("min_golden_spearman", r"^golden/spearman/(.+)$", "golden Spearman of {}", "min", (-1.0, 1.0)),
)


def thresholds(monitor: Mapping[str, Any]) -> dict[str, float]:
    """The `config.monitor` thresholds by field, each checked against its bounds, and its window checked to be a
    positive int (the run calls this at start-up, before SFT); one line naming the key and value otherwise."""
    fields = {check.field for check in CHECKS} | {WINDOW_FIELD}
    if set(monitor) != fields:
        raise ValueError(f"config.monitor: expected the keys {sorted(fields)}, got {sorted(monitor)}")
    window = monitor[WINDOW_FIELD]
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"config.monitor.{WINDOW_FIELD}={window!r}: expected a positive int (GRPO steps)")
    limits = {}
    for check in CHECKS:
        value, (lo, hi) = monitor[check.field], check.bounds
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise ValueError(f"config.monitor.{check.field}={value!r}: expected a number in [{lo:g}, {hi:g}]")
        limits[check.field] = float(value)
    return limits


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
        missing, present = scored.details.get("failures", {}).get(dim_id, 0), valid_scores.size
        out[f"monitor/missing/{dim_id}"] = missing / (present + missing) if present + missing else 0.0
    ok_N = np.asarray(scored.details["reward_ok"], bool)
    out["monitor/reward_length_corr"] = _nan_or(spearman(scored.reward[ok_N], np.asarray(lengths_N)[ok_N]).value)
    too_long = scored.details.get("judge_prompt_too_long", 0)
    tried = scored.details.get("judge_prompts", 0) + too_long
    out["monitor/judge_parse_failure"] = (scored.details["judge_invalid"] + too_long) / tried if tried else math.nan
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


def find_alerts(step: int, stage: str, row: Mapping[str, Any], limits: Mapping[str, float],
                window: int = 1) -> list[Alert]:
    """Every metric of `row` past its threshold, in CHECKS order then by metric name (NaN never fires); `window` is
    the steps behind the row's window means (named in their alert lines)."""
    alerts = []
    for check in CHECKS:
        limit = limits[check.field]
        for key in sorted(row):
            match = re.match(check.pattern, key)
            value = metrics.scalar_value(row[key]) if match else None
            if value is None or math.isnan(value) or not (value > limit if check.kind == "max" else value < limit):
                continue
            op = ">" if check.kind == "max" else "<"
            words = check.words.format(*match.groups(), window=window_words(step, window))
            digits = next((d for d in range(2, 7) if f"{value:.{d}f}" != f"{limit:.{d}f}"), 6)  # never "0.40 > 0.40"
            message = f"alert step {step}: {words} {value:.{digits}f} {op} {limit:.{digits}f}"
            alerts.append(Alert(step, stage, key, value, limit, op, message))
    return alerts


class Watch:
    """The run's monitors over steps: the first GRPO step's length and the last `window` steps' values of the
    WINDOWED monitors (read back from metrics.jsonl on resume, which the trainer trims to its checkpoint first),
    the alert checks, alerts.jsonl and the log lines."""

    def __init__(self, limits: Mapping[str, float], workdir: str | Path, window: int = 1,
                 log: Callable[[str], None] = tqdm.tqdm.write, open_logs: Callable[[], Any] = lambda: None):
        self.limits = dict(limits)
        self.window = window
        self.path = Path(workdir) / metrics.ALERTS_FILE
        self.log = log
        self.open_logs = open_logs  # the trainer's RunLog cuts the logs back to its checkpoint when opened
        self.metrics_path = Path(workdir) / metrics.METRICS_FILE
        self.first_length: float | None = None
        self.recent: dict[str, collections.deque[float]] | None = None  # WINDOWED key -> its last `window` values

    def _logged_grpo_rows(self, step: int) -> list[dict[str, Any]]:
        """The GRPO rows before `step` in metrics.jsonl: read at the first GRPO row this process observes, after a
        resume has cut the log back to its checkpoint."""
        self.open_logs()
        rows = metrics.read_jsonl_metrics(self.metrics_path) if self.metrics_path.exists() else []
        return [r for r in rows if r.get("stage") == "grpo" and r["step"] < step]

    def _remember(self, row: Mapping[str, Any]) -> None:
        """Appends a GRPO row's WINDOWED values to the window (NaN for a missing one)."""
        for key in WINDOWED:
            value = metrics.scalar_value(row.get(key))
            self.recent[key].append(math.nan if value is None else value)

    def _window_means(self, row: Mapping[str, Any]) -> dict[str, float]:
        """monitor/<m>/window_mean of each WINDOWED monitor: the mean of its finite values over this step and the
        `window` - 1 before it (NaN before `window` steps exist, or when none of them is finite)."""
        self._remember(row)
        means = {}
        for key, values in self.recent.items():
            finite = [v for v in values if math.isfinite(v)]
            full = len(values) == self.window
            means[f"{key}/window_mean"] = math.fsum(finite) / len(finite) if full and finite else math.nan
        return means

    def observe(self, step: int, row: dict[str, Any]) -> dict[str, Any]:
        """`row` (with its "stage"), plus monitor/length_drift and the window means on GRPO rows; its alerts are
        appended to alerts.jsonl and logged. Call before writing the row."""
        if row["stage"] == "grpo":
            if self.recent is None:  # the first GRPO row this process sees: a resume reads the steps before it
                logged = self._logged_grpo_rows(step) if step > 1 else []
                first = [r["response_len/mean"] for r in logged if r["step"] == 1]
                self.first_length = first[0] if first else None
                self.recent = {key: collections.deque(maxlen=self.window) for key in WINDOWED}
                for earlier in logged[-(self.window - 1):] if self.window > 1 else []:
                    self._remember(earlier)
            length = float(row["response_len/mean"])
            if self.first_length is None:
                self.first_length = length
            row = {**row, "monitor/length_drift": length / self.first_length - 1.0 if self.first_length else math.nan,
                   **self._window_means(row)}
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

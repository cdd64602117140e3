"""Scores responses with a rubric (rule dimensions, and LLM dimensions when a judge is given).

  python -m experiments.score --rubric=RUBRIC.(json|yaml) --responses=IN.jsonl --out=OUT.jsonl
      [--judge_checkpoint=DIR] [--judge_mode=single|multi] [--judge_samples=3] [--judge_retries=2]
      [--judge_sampler="temperature(0.7)"] [--judge_max_new_tokens=256] [--batch_size=64] [--seed=0]
      [--judge_param_dtype=auto] [--judge_compute_dtype=auto] [--judge_tensor=1]

Each input line is {"question": str, "response": str, optional "rubric": {"extra": [dimension, ...]}
or {"replace": rubric} (rubric_jax.rubrics.schema.parse_row_rubric), any other fields}; each output line is the input plus
  scores            {dimension id: score on the dimension's own scale, or null when its judge failed}
  normalized_scores {dimension id: score in [0, 1], 1 = best, or null}
  failed            [dimension ids without a score]
  reward            float in [0, 1] (0 and meaningless when reward_ok is false)
  reward_ok         bool (false: a gate dimension or every scored dimension is missing)
  rubric_name, rubric_version, rubric_hash
The judge is loaded straight into the decode layout over every local device (`--judge_tensor` consecutive
devices split each weight, the rest hold replicas), in bfloat16 on accelerators by default.
A one-line JSON summary (rows, mean reward, failures, judge counts) goes to stdout. User errors (a
missing or malformed rubric, a bad input line, an LLM dimension without --judge_checkpoint) exit with
status 2 and a message naming the file and line.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
from absl import app, flags

from experiments.judge_flags import JUDGE as _JUDGE, MAX_NEW as _MAX_NEW, MODE as _MODE, RETRIES as _RETRIES
from experiments.judge_flags import SAMPLES as _SAMPLES
from experiments.judge_flags import load_judges
from rubric_jax.judges.llm_judge import JudgeConfig
from rubric_jax.judges.reward import RubricReward
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.jsonl import read_jsonl
from rubric_jax.rubrics.schema import Rubric, RubricError, case_rubric_from_row

_RUBRIC = flags.DEFINE_string("rubric", None, "Rubric file (.json/.yaml); optional if every row has a full rubric.")
_RESPONSES = flags.DEFINE_string("responses", None, "Input JSONL: question, response, optional rubric per line.")
_OUT = flags.DEFINE_string("out", None, "Output JSONL (input fields plus scores and reward).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Rows per reward call (one batched judge call each).")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed for judge sampling.")
flags.mark_flags_as_required(["responses", "out"])


class InputError(ValueError):
    """A malformed input line; the message names the file and line."""


def read_rows(path: Path, shared: Rubric | None) -> tuple[list[dict[str, Any]], list[Rubric], list[str]]:
    """Validated input rows, each row's rubric (shared, extended or replaced per row) and its 'file:line'."""
    if not path.is_file():
        raise InputError(f"{path}: responses file does not exist")
    rows, rubrics, sources = [], [], []
    for lineno, row in read_jsonl(path, InputError):
        where = f"{path}:{lineno}"
        for field in ("question", "response"):
            if not isinstance(row.get(field), str):
                raise InputError(f"{where}: field {field!r}: expected a string, got {row.get(field)!r}")
        rubrics.append(case_rubric_from_row(shared, row.get("rubric"), f"line{lineno}", source=where))
        rows.append(row)
        sources.append(where)
    if not rows:
        raise InputError(f"{path}: no input rows")
    return rows, rubrics, sources


def _number(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def score_file(rows: list[dict[str, Any]], rubrics: list[Rubric], reward: RubricReward, batch_size: int,
               key: jax.Array) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Output rows and a summary, scoring `batch_size` rows per reward call."""
    out_rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"rows": len(rows), "failures": {}, "judge_generate_calls": 0, "judge_failed_scores": 0}
    rewards = []
    for start, batch_key in zip(range(0, len(rows), batch_size), jax.random.split(key, -(-len(rows) // batch_size))):
        chunk, chunk_rubrics = rows[start : start + batch_size], rubrics[start : start + batch_size]
        result = reward([r["question"] for r in chunk], [r["response"] for r in chunk], chunk_rubrics, key=batch_key)
        raw = result.details["raw_scores"]
        column = {dim_id: c for c, dim_id in enumerate(result.dimension_ids)}
        for i, (row, rubric) in enumerate(zip(chunk, chunk_rubrics)):
            cols = [column[d] for d in rubric.dimension_ids]
            out_rows.append({
                **row,
                "scores": {d: _number(raw[i, c]) for d, c in zip(rubric.dimension_ids, cols)},
                "normalized_scores": {d: _number(result.scores[i, c]) for d, c in zip(rubric.dimension_ids, cols)},
                "failed": [d for d, c in zip(rubric.dimension_ids, cols) if not result.valid[i, c]],
                "reward": float(result.reward[i]),
                "reward_ok": bool(result.details["reward_ok"][i]),
                "rubric_name": rubric.name, "rubric_version": rubric.version, "rubric_hash": rubric.content_hash,
            })
            rewards.append(float(result.reward[i]))
        for dim_id, count in result.details["failures"].items():
            summary["failures"][dim_id] = summary["failures"].get(dim_id, 0) + count
        for field in ("judge_generate_calls", "judge_failed_scores"):
            summary[field] += result.details.get(field, 0)
    summary["mean_reward"] = float(np.mean(rewards))
    summary["not_ok"] = sum(not r["reward_ok"] for r in out_rows)
    return out_rows, summary


def _fail(message: str) -> None:
    """Prints a one-line error (no traceback) and exits with status 2."""
    print(f"experiments.score: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        _fail(f"unexpected positional arguments {argv[1:]}")
    for flag, value, minimum in (("judge_samples", _SAMPLES.value, 1), ("judge_retries", _RETRIES.value, 0),
                                 ("judge_max_new_tokens", _MAX_NEW.value, 1), ("batch_size", _BATCH.value, 1)):
        if value < minimum:
            _fail(f"--{flag} must be >= {minimum}, got {value}")
    try:
        shared = None
        if _RUBRIC.value is not None:
            if not Path(_RUBRIC.value).is_file():
                raise RubricError(f"{_RUBRIC.value}: rubric file does not exist")
            shared = load_rubric(_RUBRIC.value)
        rows, rubrics, sources = read_rows(Path(_RESPONSES.value), shared)
    except (RubricError, InputError, UnicodeDecodeError) as e:
        _fail(str(e))
    judges = []
    if _JUDGE.value is not None:
        try:
            judges = load_judges([_JUDGE.value])
        except ValueError as e:
            _fail(str(e))
    config = JudgeConfig(mode=_MODE.value, num_samples=_SAMPLES.value, max_retries=_RETRIES.value)
    reward = RubricReward(judges=judges, judge_config=config)
    for rubric, source in zip(rubrics, sources):
        try:
            reward.rules_of(rubric)
        except RubricError as e:
            origin = _RUBRIC.value if shared is not None and rubric is shared else source
            _fail(f"{origin}: {e}")
    out_rows, summary = score_file(rows, rubrics, reward, _BATCH.value, jax.random.key(_SEED.value))
    out = Path(_OUT.value)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out_rows), encoding="utf-8")
    print(json.dumps(summary, ensure_ascii=False))


if __name__ == "__main__":
    app.run(main)

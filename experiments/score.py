"""Scores responses with a rubric (rule dimensions, and LLM dimensions when a judge is given).

  python -m experiments.score --rubric=RUBRIC.(json|yaml) --responses=IN.jsonl --out=OUT.jsonl
      [--judge=configs/judges/X.py] [--judge.FIELD=VALUE ...] [--config.batch_size=64] [--config.seed=0]

The settings (batch size, seed) are configs/commands/score.py, overridden with --config.FIELD=VALUE.

Each input line is {"question": str, "response": str, optional "rubric": {"extra": [dimension, ...]}
or {"replace": rubric} (rubric_jax.rubrics.schema.parse_row_rubric), any other fields}; each output line is the input plus
  scores            {dimension id: score on the dimension's own scale, or null when its judge failed}
  normalized_scores {dimension id: score in [0, 1], 1 = best, or null}
  failed            [dimension ids without a score]
  reward            float in [0, 1] (0 and meaningless when reward_ok is false)
  reward_ok         bool (false: a gate dimension or every scored dimension is missing)
  rubric_name, rubric_version, rubric_hash, judge_hash
The judge is the --judge block (docs/judges.md; default configs/judges/default.py: rules only), loaded straight
into the decode layout over every local device (`--judge.tensor` consecutive devices split each weight, the
rest hold replicas), in bfloat16 on accelerators by default. With --judge.calibration=REPORT, each LLM
dimension's calibration status goes to stderr before any scoring (--judge.require_calibration=true: exit 2
unless every one is calibrated and unflagged). With --judge.store=VERDICTS.db, judge answers are read from
that SQLite verdict store (under the judge hash) before judging and every generate call's answers are written
to it (rubric_jax/judges/store.py): a killed or repeated run judges only what is missing (the summary's
judge_store_hits counts the answers read, judge_prompts those generated). With --judge.cascade=FILE (a judge config
file), the items the judge is uncertain of are judged again by that judge (docs/judges.md, "Cascade"): the summary's
judge_cascade_escalated_frac is their share, judge_cascade_prompts the second judge's prompts.
A one-line JSON summary goes to stdout: rows, mean reward, not-ok rows, failed scores per dimension
(`failures`) and per dimension and cause (`failure_causes`, e.g. "judge_prompt_too_long",
"judge_invalid_verdict", "regex_timeout"), the judge's counters and its hash (`judge_hash`).

Exit status: 0 when every dimension got at least one valid score (partial failures are in the summary);
1 when some dimension got no valid score at all (the message names it and the cause; --out is not
written); 2 for user errors (a missing or malformed rubric, a bad input line, an LLM dimension without
--judge.checkpoint, an output path that is a directory or one of the inputs), with a message naming the
file and line. --out is written atomically: it is either the old file or the complete new one.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
from absl import app, flags

from experiments import cli, judge_config
from rubric_jax.calibration.pinning import check_calibration
from rubric_jax.command_blocks import Score
from rubric_jax.files import PathError, atomic_writer, check_output_path
from rubric_jax.judges.http_backend import EndpointDown
from rubric_jax.judges.llm_judge import escalated_frac
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.loading import check_checkpoints, load_cascade, load_judges, open_verdict_store
from rubric_jax.judges.spec import judge_hash
from rubric_jax.judges.rules import REGEX_TIMEOUT_S
from rubric_jax.judges.store import StoreError, VerdictStore
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.responses import InputError, read_rows
from rubric_jax.rubrics.schema import Rubric, RubricError

_CONFIG = cli.define_config("score")
_RUBRIC = flags.DEFINE_string("rubric", None, "Rubric file (.json/.yaml); optional if every row has a full rubric.")
_RESPONSES = flags.DEFINE_string("responses", None, "Input JSONL: question, response, optional rubric per line.")
_OUT = flags.DEFINE_string("out", None, "Output JSONL (input fields plus scores and reward).")
flags.mark_flags_as_required(["responses", "out"])

# What to do about a dimension none of whose scores is valid, by failure cause.
CAUSE_HINTS = {
    "judge_prompt_too_long": "the judge prompts do not fit the judge's context (max_position_embeddings minus "
                             "--judge.max_new_tokens); use a judge with a longer context, a smaller "
                             "--judge.max_new_tokens, or shorter anchors",
    "judge_truncated": "every verdict was cut at --judge.max_new_tokens; raise it",
    "judge_invalid_verdict": "the judge never wrote a parseable verdict (judge_invalid_examples in the summary)",
    "judge_http_error": "the judge endpoint gave no usable answer: none after its retries, or a refused one (a "
                        "content_filter finish, a refusal, malformed or oversized content; judge_http_error_examples "
                        "in the summary); check --judge.base_url and the server",
    "regex_timeout": f"the rule's regex ran past {REGEX_TIMEOUT_S} s (catastrophic backtracking); simplify it",
}


def _number(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def score_file(rows: list[dict[str, Any]], rubrics: list[Rubric], reward: RubricReward, batch_size: int,
               key: jax.Array, judge: str, store: VerdictStore | None = None
               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Output rows and a summary, scoring `batch_size` rows per reward call, every call with `key` (a judge
    prompt depends on its own content and the key only, so the store finds it whatever batch it lands in);
    `judge` is the judge hash."""
    out_rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"rows": len(rows), "failures": {}, "failure_causes": {}, "rows_with_dimension": {},
                               "judge_generate_calls": 0, "judge_failed_scores": 0, "judge_hash": judge}
    rewards = []
    for start in range(0, len(rows), batch_size):
        chunk, chunk_rubrics = rows[start : start + batch_size], rubrics[start : start + batch_size]
        result = reward([r["question"] for r in chunk], [r["response"] for r in chunk], chunk_rubrics, key=key,
                        store=store)
        raw = result.details["raw_scores"]
        column = {dim_id: c for c, dim_id in enumerate(result.dimension_ids)}
        for i, (row, rubric) in enumerate(zip(chunk, chunk_rubrics)):
            cols = [column[d] for d in rubric.dimension_ids]
            out_rows.append({
                **row,
                "scores": {d: _number(raw[i, c]) for d, c in zip(rubric.dimension_ids, cols)},
                "normalized_scores": {d: _number(result.scores[i, c]) for d, c in zip(rubric.dimension_ids, cols)},
                # no score, or the minimum for a response too long to judge (valid, raw NaN: judges/reward.py)
                "failed": [d for d, c in zip(rubric.dimension_ids, cols) if np.isnan(raw[i, c])],
                "reward": float(result.reward[i]),
                "reward_ok": bool(result.details["reward_ok"][i]),
                "rubric_name": rubric.name, "rubric_version": rubric.version, "rubric_hash": rubric.content_hash,
                "judge_hash": judge,
            })
            rewards.append(float(result.reward[i]))
            for dim_id in rubric.dimension_ids:
                summary["rows_with_dimension"][dim_id] = summary["rows_with_dimension"].get(dim_id, 0) + 1
        for dim_id, count in result.details["failures"].items():
            summary["failures"][dim_id] = summary["failures"].get(dim_id, 0) + count
        for dim_id, causes in result.details["failure_causes"].items():
            for cause, count in causes.items():
                per_dim = summary["failure_causes"].setdefault(dim_id, {})
                per_dim[cause] = per_dim.get(cause, 0) + count
        for field, value in result.details.items():
            if field.startswith("judge_") and isinstance(value, int):
                summary[field] = summary.get(field, 0) + value
        for name in ("judge_invalid_examples", "judge_http_error_examples"):
            examples = summary.setdefault(name, [])
            examples.extend(result.details.get(name, [])[: 5 - len(examples)])
    summary["mean_reward"] = float(np.mean(rewards))
    if "judge_cascade_screened" in summary:  # the cascade's share of items the refining judge re-judged
        summary["judge_cascade_escalated_frac"] = escalated_frac(summary)
    summary["not_ok"] = sum(not r["reward_ok"] for r in out_rows)
    return out_rows, summary


def unscored_dimensions(summary: dict[str, Any]) -> list[str]:
    """One line per dimension whose every score failed, naming its causes and what to do."""
    lines = []
    for dim_id, count in summary["failures"].items():
        if count and count == summary["rows_with_dimension"][dim_id]:
            causes = summary["failure_causes"][dim_id]
            hints = "; ".join(CAUSE_HINTS[c] for c in causes if c in CAUSE_HINTS)
            lines.append(f"dimension {dim_id!r}: no valid score in any of its {count} rows "
                         f"({', '.join(f'{c}: {n}' for c, n in causes.items())}){': ' + hints if hints else ''}")
    return lines


_fail = functools.partial(cli.fail, "experiments.score")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    cli.start("experiments.score", argv)
    settings = cli.settings("experiments.score", _CONFIG.value, Score)
    try:
        spec = judge_config.spec()
        inputs = [_RESPONSES.value, _RUBRIC.value, *spec.checkpoints, spec.calibration or None]
        out = check_output_path(_OUT.value, [*inputs, spec.store or None])
        if spec.store:
            check_output_path(spec.store, [*inputs, _OUT.value])
        check_checkpoints(spec, "--judge")
        shared = None if _RUBRIC.value is None else load_rubric(_RUBRIC.value)
        rows, rubrics, sources = read_rows(Path(_RESPONSES.value), shared, str(_RUBRIC.value))
        for line in check_calibration(spec, rubrics, "--judge").lines() if spec.calibration else []:
            print(line, file=sys.stderr)
        store = open_verdict_store(spec)
        judges = load_judges(spec, where="--judge")
        refiners = load_cascade(spec, where="--judge")
        judge = judge_hash(spec)
    except (RubricError, InputError, PathError, ValueError) as e:  # StoreError too
        _fail(str(e))
    reward = RubricReward(judges=judges, judge_spec=spec, refiners=refiners)
    for rubric, source in zip(rubrics, sources):
        try:
            reward.prepare(rubric)
        except RubricError as e:
            origin = _RUBRIC.value if shared is not None and rubric is shared else source
            _fail(f"{origin}: {e}")
    try:
        out_rows, summary = score_file(rows, rubrics, reward, settings.batch_size,
                                       jax.random.key(settings.seed), judge, store)
    except StoreError as e:  # the store went bad mid-run: what was judged before is in it
        _fail(str(e))
    except EndpointDown as e:  # the served judge went away: what was judged before is in the store, if any
        _fail(str(e), status=1)
    print(json.dumps(summary, ensure_ascii=False))
    unscored = unscored_dimensions(summary)
    if unscored:
        _fail(f"{out} not written: " + " | ".join(unscored), status=1)
    try:
        with atomic_writer(out) as f:
            for row in out_rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    except OSError as e:
        _fail(f"{out}: cannot write: {e.strerror or e}")


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.score"))

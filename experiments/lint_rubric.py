"""Checks rubrics before any judge budget is spent on them (rubric_jax/rubrics/lint.py): criteria a keyword meets,
anchors asking for two things, levels described alike, weights that order nothing, dimensions that say the same and
rules that never fire. One line per finding on stdout; a summary on stderr.

  python -m experiments.lint_rubric --rubric=configs/rubrics/medical_qa.yaml [--questions=Q.jsonl]
      [--config.max_new_tokens=256] [--labels=LABELS.jsonl] [--waivers=configs/rubric_lint_waivers.yaml]

--questions adds the case rubrics of a question file's rows (shared + each row's criteria; the shared dimensions'
findings once). --labels (experiments.calibrate's labels file) compares dimensions by their human labels too.
Exit status 0 when every finding is waived (or none), 1 when a finding is left, 2 for bad input.
"""

from __future__ import annotations

import functools
import sys

from absl import app, flags

from experiments import cli

_CONFIG = cli.define_config("lint_rubric")
_RUBRIC = flags.DEFINE_string("rubric", None, "Rubric file (.yaml, .yml, .json) to lint.")
_QUESTIONS = flags.DEFINE_string("questions", "", "Question jsonl whose rows' case-wise criteria are linted too.")
_LABELS = flags.DEFINE_string("labels", "", "Labels jsonl ({question, response, labels: {dimension: score}}, as "
                              "experiments.calibrate reads): dimensions whose labels correlate are reported.")
_WAIVERS = flags.DEFINE_string("waivers", "", "YAML list of waivers {rubric, dimension, kind, reason}; a waived "
                               "finding is shown but does not fail the command.")

_fail = functools.partial(cli.fail, "experiments.lint_rubric")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    cli.start("experiments.lint_rubric", argv)
    from rubric_jax import data, jsonl  # noqa: PLC0415 -- after flag parsing: --help stays fast
    from rubric_jax.rubrics import io, lint  # noqa: PLC0415

    from rubric_jax.command_blocks import LintRubric  # noqa: PLC0415

    settings = cli.settings("experiments.lint_rubric", _CONFIG.value, LintRubric)
    if not _RUBRIC.value:
        _fail("--rubric is required")
    try:
        shared = io.load_rubric(_RUBRIC.value)
        rubrics = [shared]
        if _QUESTIONS.value:
            rubrics += [data.question_rubric(shared, q) for q in data.load_questions(_QUESTIONS.value)]
        labels = _labels([row for _, row in jsonl.read_jsonl(_LABELS.value)]) if _LABELS.value else None
        waivers = lint.waivers_from(io.load_document(_WAIVERS.value, "waiver"), _WAIVERS.value) \
            if _WAIVERS.value else []
    except (ValueError, OSError) as e:
        _fail(" ".join(str(e).split()))
    findings = lint.lint_all(rubrics, max_new_tokens=settings.max_new_tokens or None, labels=labels)
    left = lint.unwaived(findings, waivers)
    for finding in findings:
        print(("" if finding in left else "waived: ") + finding.line())
    print(f"experiments.lint_rubric: {len(rubrics)} rubric(s), {len(findings)} finding(s), "
          f"{len(findings) - len(left)} waived", file=sys.stderr)
    if left:
        sys.exit(1)


def _labels(rows: list[dict]) -> dict[str, dict[str, float]]:
    """{dimension: {item: label}} of a labels file's rows (item = the row's line number)."""
    out: dict[str, dict[str, float]] = {}
    for i, row in enumerate(rows):
        labelled = row.get("labels") if isinstance(row, dict) else None
        if not isinstance(labelled, dict):
            raise ValueError(f"--labels: row {i}: expected a 'labels' object")
        for dim, score in labelled.items():
            if isinstance(score, bool) or not isinstance(score, (int, float)):
                raise ValueError(f"--labels: row {i}: labels.{dim}={score!r}: expected a number")
            out.setdefault(dim, {})[str(i)] = float(score)
    return out


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.lint_rubric"))

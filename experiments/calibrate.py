"""Calibrates a rubric's judges against labels (or judges against each other); see rubric_jax/calibration.

  python -m experiments.calibrate --rubric=RUBRIC.yaml --labels=LABELS.jsonl --out=DIR
      [--against=labels|judge] [--judge=configs/judges/X.py] [--judge.checkpoint=DIR[,DIR...]] [--judge.FIELD=...]
      [--threshold=0.6] [--bootstrap=1000]
      [--correction=FILE] [--correction_out=FILE] [--position_probe=true] [--seed=0]
  python -m experiments.calibrate --labels=../shared/data/prometheus/vicuna_eval.json --against=judge --out=DIR

Writes DIR/report.json, DIR/report.md, DIR/plots/<dimension>.png and, against labels, a fitted score
correction (DIR/correction.json or --correction_out) to apply in training with
--config.data.rubric_correction=FILE. report.json and report.md record the (rubric, judge) pair measured:
each rubric's version and hash, the judge hash and every --judge field (run, score and evaluate check theirs
against it with judge.calibration=DIR/report.json). Prints a one-line JSON summary. User errors (a bad labels line, a
missing file, an LLM dimension without a judge) exit with status 2 and one line naming the file and line.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from absl import app, flags

from experiments import cli, judge_config
from rubric_jax.calibration.labels import LabelsError, read_items
from rubric_jax.rubrics.correction import load_correction
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import RubricError

_RUBRIC = flags.DEFINE_string("rubric", None, "Rubric file (.json/.yaml); optional if every row has its own rubric.")
_LABELS = flags.DEFINE_string("labels", None, "Labels .jsonl (question, response, labels) or a Prometheus .json.")
_OUT = flags.DEFINE_string("out", None, "Output directory: report.json, report.md, plots/, correction.json.")
_AGAINST = flags.DEFINE_enum("against", "labels", ["labels", "judge"], "Judges vs labels, or judges vs judges.")
_THRESHOLD = flags.DEFINE_float("threshold", 0.6, "Flag a dimension whose Spearman is below this (RubricRL 3.2).")
_BOOTSTRAP = flags.DEFINE_integer("bootstrap", 1000, "Bootstrap resamples per 95% interval.")
_SEED = flags.DEFINE_integer("seed", 0, "Seeds judge sampling and the bootstrap.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Rows per reward call (one batched judge call each).")
_PROBE = flags.DEFINE_boolean("position_probe", True, "Score LLM dimensions again, anchors as written and reversed.")
_WORST = flags.DEFINE_integer("worst", 5, "Disagreements listed per dimension.")
_CORRECTION = flags.DEFINE_string("correction", None, "Apply this score correction when scoring (to check it).")
_CORRECTION_OUT = flags.DEFINE_string("correction_out", None, "Fitted correction file (default DIR/correction.json).")
flags.mark_flags_as_required(["labels", "out"])


_fail = functools.partial(cli.fail, "experiments.calibrate")  # one line on stderr, exit status 2


def _check_inputs() -> None:
    """Every named input exists."""
    for flag, value in (("--labels", _LABELS.value), ("--rubric", _RUBRIC.value), ("--correction", _CORRECTION.value)):
        if value is not None and not Path(value).is_file():
            _fail(f"{flag}={value}: file does not exist")


def _check_outputs(outputs: list[Path]) -> None:
    """No output path is one of the input files."""
    inputs = {"--labels": _LABELS.value, "--rubric": _RUBRIC.value, "--correction": _CORRECTION.value}
    taken = {Path(v).resolve(): flag for flag, v in inputs.items() if v is not None}
    for path in outputs:
        if path.resolve() in taken:
            _fail(f"output {path} would overwrite the input {taken[path.resolve()]}")


def main(argv: list[str]) -> None:
    cli.start("experiments.calibrate", argv)
    _check_inputs()
    try:
        shared = load_rubric(_RUBRIC.value) if _RUBRIC.value else None
        correction = load_correction(_CORRECTION.value) if _CORRECTION.value else None
        items = read_items(_LABELS.value, shared)
    except (RubricError, LabelsError, UnicodeDecodeError) as e:
        _fail(str(e))
    # Imported once the inputs are read: a bad labels line fails in a fraction of a second, before JAX loads.
    from rubric_jax.calibration.pinning import PIN_FIELD
    from rubric_jax.calibration.report import CORRECTION_FILE, REPORT_JSON, REPORT_MD, write_calibration
    from rubric_jax.calibration.run import CalibrationError, Settings, calibrate
    from rubric_jax.judges.spec import check_checkpoints, load_judges

    out = Path(_OUT.value)
    _check_outputs([out / REPORT_JSON, out / REPORT_MD, Path(_CORRECTION_OUT.value or out / CORRECTION_FILE)])
    try:
        settings = Settings(_AGAINST.value, _THRESHOLD.value, _BOOTSTRAP.value, _SEED.value, _BATCH.value,
                            _PROBE.value, _WORST.value)
        judge_spec = judge_config.spec()
        check_checkpoints(judge_spec, "--judge")
        judges = load_judges(judge_spec, where="--judge")
    except (CalibrationError, ValueError) as e:
        _fail(str(e))
    inputs = {"labels": _LABELS.value, "rubric": _RUBRIC.value,
              "rubric_hash": shared.content_hash if shared is not None else None}
    try:
        result = calibrate(items, settings, judges=judges, judge_spec=judge_spec, correction=correction,
                           inputs=inputs)
        written = write_calibration(result, out, _CORRECTION_OUT.value, _SEED.value)
    except (RubricError, CalibrationError) as e:
        _fail(str(e))
    print(json.dumps({"items": result.report["items"], "flagged": result.report["flagged"],
                      "judge_hash": result.report[PIN_FIELD]["judge"]["hash"], "written": [str(p) for p in written]},
                     ensure_ascii=False))


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.calibrate"))

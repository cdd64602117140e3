"""Calibrates a rubric's judges against labels (or judges against each other); see rubric_jax/calibration.

  python -m experiments.calibrate --rubric=RUBRIC.yaml --labels=LABELS.jsonl --out=DIR
      [--judge=configs/judges/X.py] [--judge.checkpoint=DIR[,DIR...]] [--judge.FIELD=...] [--judge.store=VERDICTS.db]
      [--correction=FILE] [--correction_out=FILE] [--config.against=labels|judge] [--config.threshold=0.6]
      [--config.bootstrap=1000] [--config.position_probe=true] [--config.seed=0] [--config.redundancy_threshold=0.9]
  python -m experiments.calibrate --config.red_team=true --rubric=RUBRIC.yaml --labels=LABELS.jsonl \
      --judge=configs/judges/X.py --out=DIR
  python -m experiments.calibrate --rubric=RUBRIC_A.yaml --compare=RUBRIC_B.yaml --labels=LABELS.jsonl --out=DIR
  python -m experiments.calibrate --labels=../shared/data/prometheus/vicuna_eval.json --config.against=judge --out=DIR

The settings are configs/commands/calibrate.py, overridden with --config.FIELD=VALUE; the flags are the inputs
and the outputs.

Writes DIR/report.json, DIR/report.md, DIR/plots/<dimension>.png and, against labels, a fitted score
correction (DIR/correction.json or --correction_out) to apply in training with
--config.data.rubric_correction=FILE; the report includes the pairwise Spearman of the dimensions (redundancy).
report.json and report.md record the (rubric, judge) pair measured: each rubric's version and hash, the judge
hash and every --judge field (run, score and evaluate check theirs against it with judge.calibration=REPORT).
With --compare, the labels are scored with both rubrics and DIR/report.json, DIR/report.md hold each
dimension's agreement side by side and a paired bootstrap of the difference (rubric_jax/calibration/compare.py).
With --red_team, the injection payload suite is put into the responses labelled bad and DIR/report.json,
DIR/report.md hold each LLM dimension's success rate (a score raised by a level; rubric_jax/calibration/red_team.py).
Earlier outputs in DIR are replaced (calibration/report.write_outputs). Prints a one-line JSON summary. User
errors (a bad labels line, a missing file, an LLM dimension without a judge, an --out that is a file) exit with
status 2 and one line naming the file and line, before any scoring.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

from absl import app, flags

from experiments import cli, judge_config
from rubric_jax import files
from rubric_jax.command_blocks import Calibrate
from rubric_jax.judges.http_backend import EndpointDown
from rubric_jax.judges.store import StoreError
from rubric_jax.calibration.labels import LabelsError, read_items
from rubric_jax.rubrics.correction import load_correction
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import RubricError

_CONFIG = cli.define_config("calibrate")
_RUBRIC = flags.DEFINE_string("rubric", None, "Rubric file (.json/.yaml); optional if every row has its own rubric.")
_LABELS = flags.DEFINE_string("labels", None, "Labels .jsonl (question, response, labels) or a Prometheus .json.")
_OUT = flags.DEFINE_string("out", None, "Output directory: report.json, report.md, plots/, correction.json.")
_CORRECTION = flags.DEFINE_string("correction", None, "Apply this score correction when scoring (to check it).")
_CORRECTION_OUT = flags.DEFINE_string("correction_out", None, "Fitted correction file (default DIR/correction.json).")
_COMPARE = flags.DEFINE_string("compare", None, "Rubric B: score the labels with --rubric (A) and with B, compare.")
flags.mark_flags_as_required(["labels", "out"])


_fail = functools.partial(cli.fail, "experiments.calibrate")  # one line on stderr, exit status 2


_KEY_OF = {"against": "--config.against", "threshold": "--config.threshold", "num_resamples": "--config.bootstrap",
           "batch_size": "--config.batch_size", "worst": "--config.worst",
           "redundancy_threshold": "--config.redundancy_threshold"}


def _settings_error(message: str) -> str:
    """A Settings error ("num_resamples: expected ...") with the config key in place of the field."""
    field, _, rest = message.partition(": ")
    return f"{_KEY_OF[field]}: {rest}" if field in _KEY_OF else message


def _inputs(store: str = "") -> dict[str, str | None]:
    return {"--labels": _LABELS.value, "--rubric": _RUBRIC.value, "--correction": _CORRECTION.value,
            "--compare": _COMPARE.value, "--judge.store": store or None}


def _check_inputs(config: Calibrate) -> None:
    """Every named input exists; --compare needs --rubric and labels (not recorded ratings) to compare on."""
    against = config.against
    if config.red_team and (_COMPARE.value is not None or against != "labels"):
        _fail("--config.red_team injects into the responses the labels call bad: no --compare or "
              "--config.against=judge")
    if _COMPARE.value is not None and (_RUBRIC.value is None or against != "labels" or _CORRECTION.value):
        _fail("--compare=RUBRIC_B compares it with --rubric=RUBRIC_A on labels: give --rubric, and no "
              "--config.against=judge or --correction")
    for flag, value in _inputs().items():
        if value is not None and not Path(value).is_file():
            _fail(f"{flag}={value}: file does not exist")


def _check_outputs(out: Path, outputs: list[Path], judge_dirs: Sequence[str], store: str) -> None:
    """--out can be a directory (no file, no file above it, not a judge checkpoint) and no output path is one of the
    input files: checked before anything is scored."""
    try:
        files.check_output_dir(out, [], [Path(d) for d in judge_dirs], flag="--out")
        above = next(p for p in out.resolve().parents if p.exists())
        if not above.is_dir():
            _fail(f"--out={out}: cannot create it: {above} is not a directory")
        if _CORRECTION_OUT.value is not None:
            files.check_output_path(_CORRECTION_OUT.value)
    except files.PathError as e:
        _fail(str(e))
    taken = {Path(v).resolve(): flag for flag, v in _inputs(store).items() if v is not None}
    for path in outputs:
        if path.resolve() in taken:
            _fail(f"output {path} would overwrite the input {taken[path.resolve()]}")


def _compare_items() -> list:
    """The labelled items read with rubric B; an error names --compare."""
    try:
        return read_items(_LABELS.value, load_rubric(_COMPARE.value))
    except (RubricError, LabelsError) as e:
        raise LabelsError(f"--compare={_COMPARE.value}: {e}") from None


def _compare(items_a: list, items_b: list, settings, judges, judge_spec, refiners, out: Path, protected: list[Path]
             ) -> None:
    """Scores the labels with both rubrics and writes the comparison report (calibration/compare.py)."""
    from rubric_jax.calibration.compare import Versions, compare_rubrics
    from rubric_jax.calibration.report import write_comparison
    from rubric_jax.calibration.run import CalibrationError

    try:
        report = compare_rubrics(Versions(items_a, items_b, _RUBRIC.value, _COMPARE.value), settings, judges=judges,
                                 judge_spec=judge_spec, inputs={"labels": _LABELS.value}, refiners=refiners)
        written = write_comparison(report, out, protected)
    except (RubricError, CalibrationError) as e:
        _fail(str(e))
    verdicts = {d: e["spearman_difference"]["verdict"] for d, e in report["dimensions"].items()}
    print(json.dumps({"items": report["items"], "spearman_verdicts": verdicts, "written": [str(p) for p in written]},
                     ensure_ascii=False))


def _settings(c: Calibrate):
    """The settings block as calibration Settings, checked before anything is scored; a bad value names its key."""
    from rubric_jax.calibration.run import CalibrationError, Settings

    try:
        return Settings(c.against, c.threshold, c.bootstrap, c.seed, c.batch_size, c.position_probe, c.worst,
                        c.redundancy_threshold)
    except CalibrationError as e:
        _fail(_settings_error(str(e)))


def _red_team(items: list, settings, judges, judge_spec, refiners, correction, out: Path, protected: list[Path],
              store) -> None:
    """Scores the payload suite in the known-bad responses and writes the red-team report (calibration/red_team.py)."""
    from rubric_jax.calibration.red_team import red_team, write_red_team
    from rubric_jax.judges.reward import RubricReward
    from rubric_jax.judges.spec import judge_hash

    try:
        reward = RubricReward(list({i.rubric.content_hash: i.rubric for i in items}.values()), judges, judge_spec,
                              correction=correction, refiners=refiners)
        report = red_team(items, reward, batch_size=settings.batch_size, seed=settings.seed, store=store,
                          inputs={"labels": _LABELS.value, "rubric": _RUBRIC.value, "judge_hash": judge_hash(judge_spec),
                                  "judge": judge_spec.to_block()})
        written = write_red_team(report, out, protected)
    except (RubricError, StoreError, ValueError) as e:
        _fail(str(e))
    rates = {d: e["rate"] for d, e in report["dimensions"].items()}
    print(json.dumps({"items": report["items"], "injection_rates": rates, "written": [str(p) for p in written]},
                     ensure_ascii=False))


def main(argv: list[str]) -> None:
    cli.start("experiments.calibrate", argv)
    config = cli.settings("experiments.calibrate", _CONFIG.value, Calibrate)
    _check_inputs(config)
    try:
        shared = load_rubric(_RUBRIC.value) if _RUBRIC.value else None
        correction = load_correction(_CORRECTION.value) if _CORRECTION.value else None
        items = read_items(_LABELS.value, shared)
        items_b = _compare_items() if _COMPARE.value else None
    except (RubricError, LabelsError, UnicodeDecodeError) as e:
        _fail(str(e))
    # Imported once the inputs are read: a bad labels line fails in a fraction of a second, before JAX loads.
    from rubric_jax.calibration.report import CORRECTION_FILE, REPORT_JSON, REPORT_MD, write_calibration
    from rubric_jax.calibration.pinning import PIN_FIELD
    from rubric_jax.calibration.run import CalibrationError, calibrate
    from rubric_jax.judges.loading import check_checkpoints, load_cascade, load_judges, open_verdict_store

    settings = _settings(config)
    out = Path(_OUT.value)
    try:
        judge_spec = judge_config.spec()
        check_checkpoints(judge_spec, "--judge")
    except ValueError as e:
        _fail(str(e))
    _check_outputs(out, [out / REPORT_JSON, out / REPORT_MD, Path(_CORRECTION_OUT.value or out / CORRECTION_FILE)],
                   judge_spec.checkpoints, judge_spec.store)
    try:
        if judge_spec.store:
            files.check_output_path(judge_spec.store, [_LABELS.value, _RUBRIC.value, _CORRECTION.value,
                                                       *judge_spec.checkpoints, out])
        store = open_verdict_store(judge_spec)
        judges = load_judges(judge_spec, where="--judge")
        refiners = load_cascade(judge_spec, where="--judge")
    except ValueError as e:  # PathError and StoreError too
        _fail(str(e))
    inputs = {"labels": _LABELS.value, "rubric": _RUBRIC.value,
              "rubric_hash": shared.content_hash if shared is not None else None}
    protected = [Path(v) for v in _inputs(judge_spec.store).values() if v is not None]
    if config.red_team:
        _red_team(items, settings, judges, judge_spec, refiners, correction, out, protected, store)
        return
    if items_b is not None:
        _compare(items, items_b, settings, judges, judge_spec, refiners, out, protected)
        return
    try:
        result = calibrate(items, settings, judges=judges, judge_spec=judge_spec, correction=correction,
                           inputs=inputs, store=store, refiners=refiners)
        written = write_calibration(result, out, _CORRECTION_OUT.value, settings.seed, protected)
    except (RubricError, CalibrationError, StoreError) as e:
        _fail(str(e))
    except EndpointDown as e:  # the served judge went away: what was judged before is in the store, if any
        _fail(str(e), status=1)
    print(json.dumps({"items": result.report["items"], "flagged": result.report["flagged"],
                      "judge_hash": result.report[PIN_FIELD]["judge"]["hash"], "written": [str(p) for p in written]},
                     ensure_ascii=False))


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.calibrate"))

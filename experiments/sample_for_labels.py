"""Draws a labelling round's responses from a run (rubric_jax/calibration/label_sampling.py).

  python -m experiments.sample_for_labels --workdir=DIR --out=FILE.jsonl [--config.n=300] [--config.seed=0]

Reads DIR/samples.jsonl (raise --config.log.samples_per_step when training to log more of each step's rollouts),
DIR/rubric.yaml and the run's question files (DIR/config.json's data.train, data.eval, data.golden) for each
question's own criteria, and writes FILE.jsonl in the labels format experiments.calibrate reads, every label
null: fill them in (a score on each dimension's scale, or remove the dimensions you do not label), then

  python -m experiments.calibrate --rubric=DIR/rubric.yaml --labels=FILE.jsonl --out=CAL_DIR

Refuses an existing FILE (it may hold labels already). Prints a one-line JSON summary (drawn, distinct responses,
per stratum). Bad input exits with status 2 and one line naming the file and line.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from absl import app, flags

from experiments import cli
from rubric_jax import data, files
from rubric_jax.calibration.label_sampling import draw, label_row, sample_from_row
from rubric_jax.command_blocks import SampleForLabels
from rubric_jax.jsonl import read_jsonl
from rubric_jax.metrics import SAMPLES_FILE
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import RubricError, case_rubric_from_row, dimension_to_dict, rubric_to_dict

_CONFIG = cli.define_config("sample_for_labels")
_WORKDIR = flags.DEFINE_string("workdir", None, "A run's workdir (holds samples.jsonl, config.json, rubric.yaml).")
_OUT = flags.DEFINE_string("out", None, "Labels file to write (.jsonl); must not exist.")
flags.mark_flags_as_required(["workdir", "out"])

_fail = functools.partial(cli.fail, "experiments.sample_for_labels")
_QUESTION_SETS = ("train", "eval", "golden")  # config.data keys whose questions a run's samples answer


def _question_rubrics(config: Mapping[str, Any], where: Path) -> dict[str, Any]:
    """Question text -> the row's raw "rubric" field (None when it has none), over the run's question sets."""
    rubrics: dict[str, Any] = {}
    for key in _QUESTION_SETS:
        spec = config.get("data", {}).get(key, "")
        if not spec:
            continue
        try:
            questions = data.load_question_set(spec, config["data"].get("tfds_dir", ""), key)
        except (data.DataError, OSError, ValueError) as e:
            raise ValueError(f"{where}: data.{key}={spec}: {e} (run from the directory the run was started in)") \
                from None
        for q in questions:
            row_rubric = ({"replace": rubric_to_dict(q.replace_rubric)} if q.replace_rubric is not None
                          else {"extra": [dimension_to_dict(d) for d in q.extra_dimensions]} if q.extra_dimensions
                          else None)
            rubrics.setdefault(q.question, row_rubric)
    return rubrics


def main(argv: list[str]) -> None:
    cli.start("experiments.sample_for_labels", argv)
    settings = cli.settings("experiments.sample_for_labels", _CONFIG.value, SampleForLabels)
    workdir, out = Path(_WORKDIR.value), Path(_OUT.value)
    samples_path, config_path, rubric_path = workdir / SAMPLES_FILE, workdir / "config.json", workdir / "rubric.yaml"
    try:
        for path in (samples_path, config_path, rubric_path):
            files.check_input_file(path, "run")
        files.check_output_path(out, [samples_path, config_path, rubric_path])
    except files.PathError as e:
        _fail(str(e))
    if out.exists():
        _fail(f"--out={out}: exists (it may hold labels already); choose a new file name")
    try:
        config = json.loads(files.read_text(config_path, "run config"))
        shared = load_rubric(rubric_path)
        samples = [sample_from_row(row, f"{samples_path}:{lineno}") for lineno, row in read_jsonl(samples_path)]
        if not samples:
            raise ValueError(f"{samples_path}: no samples logged")
        rubrics = _question_rubrics(config, config_path)
        drawn = draw(samples, settings.n, settings.seed)
        rows = []
        for sample in drawn.samples:
            if sample.question not in rubrics:
                raise ValueError(f"{samples_path}: question {sample.question[:80]!r} is in none of the run's question "
                                 f"sets {[config['data'].get(k) for k in _QUESTION_SETS]}")
            rubric = case_rubric_from_row(shared, rubrics[sample.question], "label", source=str(samples_path))
            rows.append(label_row(sample, rubric.dimension_ids, rubrics[sample.question], str(workdir)))
    except (ValueError, RubricError, files.PathError) as e:
        _fail(str(e))
    files.write_atomic(out, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(json.dumps({"drawn": len(rows), "distinct_responses": drawn.pool, "samples": len(samples),
                      "per_stratum": drawn.cells, "written": str(out),
                      "next": f"fill in the null labels, then: python -m experiments.calibrate --rubric={rubric_path} "
                              f"--labels={out} --out=CAL_DIR"}, ensure_ascii=False))


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.sample_for_labels"))

"""Evaluates a policy on a public benchmark, or scores HelloBench's published judgements.

  python -m experiments.evaluate --config.benchmark=hellobench|longbench_write|healthbench|biggen|rubric_set \
      --data_dir=DIR [--data_file=NAME] --out=DIR (--checkpoint=HF_DIR | --workdir=RUN_DIR [--config.which=best]) \
      [--judge.checkpoint=DIR[,DIR]] [--judge=configs/judges/X.py] [--judge.FIELD=...] [--judge.store=VERDICTS.db]
      [--config.limit=N] [--config.policy.prompt_format=plain|think_answer] [--config.policy.max_new_tokens=2048]
  python -m experiments.evaluate --config.benchmark=hellobench --data_dir=DIR --judgements=FILE.csv --out=DIR \
      [--config.models=a,b]

The settings (benchmark, limit, policy generation and mesh) are configs/commands/evaluate.py, overridden with
--config.FIELD=VALUE; the flags are the inputs and the output.
Writes records.jsonl, summary.json, table.md and plot.png into --out (rubric_jax/evaluation/report.py).
The judge is configs/judges/<benchmark>.py (the benchmark's prescribed prompt and settings; rubric_set:
configs/judges/default.py) unless --judge names another file; summary.json records its hash and fields. With
--judge.calibration=REPORT each LLM dimension's calibration status is printed before the policy loads.
Bad input (unknown benchmark, missing file, malformed line, incomplete judgements of a named model, an
LLM-judged benchmark without a judge, --out naming an input) exits with status 2 and one line naming
the file and line; nothing is written. So does a config.policy.max_new_tokens that leaves no case room in the
policy's context (before generating). An evaluation whose judged answers all lack every score (e.g. every judge prompt
too long) writes its report and exits with status 1 saying why.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

from absl import app, flags

from experiments import cli, judge_config
from rubric_jax import sampling
from rubric_jax.calibration.pinning import check_calibration
from rubric_jax.command_blocks import Evaluate
from rubric_jax.data import DataError
from rubric_jax.evaluation import harness
from rubric_jax.judges.http_backend import EndpointDown
from rubric_jax.evaluation.results import EvalFailed, EvalInputError
from rubric_jax.files import PathError, check_output_path
from rubric_jax.judges.loading import check_checkpoints, open_verdict_store
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.judges.store import StoreError, VerdictStore
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import RubricError

_CONFIG = cli.define_config("evaluate")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "The benchmark's folder (e.g. ../shared/data/hellobench).")
_DATA_FILE = flags.DEFINE_string("data_file", None, "File in --data_dir (longbench_write, healthbench, biggen, "
                                  "rubric_set).")
_OUT = flags.DEFINE_string("out", None, "Output directory (must not be or contain an input).")
_JUDGEMENTS = flags.DEFINE_string("judgements", None, "HelloBench: score this published judgements CSV, no model.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Policy: a Hugging Face directory.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Policy: a training run directory (experiments.run --workdir).")
_RUBRIC = flags.DEFINE_string("rubric", None, "rubric_set: a rubric shared by rows without their own.")


_fail = functools.partial(cli.fail, "experiments.evaluate")  # one line on stderr, exit status 2


def _judge(benchmark: str) -> JudgeSpec:
    """The --judge spec; without --judge, the benchmark's judge file (rubric_set: the default block)."""
    benchmark_file = judge_config.JUDGES_DIR / f"{benchmark}.py"
    try:
        spec = judge_config.spec(benchmark_file if benchmark_file.is_file() else None, allow_benchmark=True)
        check_checkpoints(spec, "--judge")
    except ValueError as e:
        raise EvalInputError(str(e)) from None
    return spec


def _calibration(judge: JudgeSpec, evaluation: harness.Evaluation) -> dict | None:
    """With --judge.calibration, each LLM dimension's status printed (stderr) and returned for summary.json;
    --judge.require_calibration makes a dimension that is not covered an EvalInputError."""
    try:
        check = check_calibration(judge, [c.rubric for c in evaluation.cases if c.rubric is not None], "--judge")
    except ValueError as e:
        raise EvalInputError(str(e)) from None
    if check is None:
        return None
    for line in check.lines():
        print(line, file=sys.stderr)
    return check.record()


def _settings(config: Evaluate) -> tuple[harness.GenerationSettings, JudgeSpec, tuple[int, int, int]]:
    """The settings' choices and sampler checked (EvalInputError names the key), and the judge."""
    policy = config.policy
    try:
        for key, value, allowed in (("which", config.which, harness.WHICH),
                                    ("policy.prompt_format", policy.prompt_format, harness.PROMPT_FORMATS)):
            cli.check(value in allowed, key, value, f"one of {list(allowed)}")
        try:
            sampling.parse_sampler(policy.sampler)
        except ValueError as e:
            raise ValueError(f"--config.policy.sampler: {e}") from None
    except ValueError as e:
        raise EvalInputError(str(e)) from None
    mesh = (config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    generation = harness.GenerationSettings(policy.sampler, policy.max_new_tokens, policy.batch_size,
                                            policy.prompt_format, config.seed)
    return generation, _judge(config.benchmark), mesh


def _open_store(judge: JudgeSpec, inputs: list[Path]) -> VerdictStore | None:
    """--judge.store under the judge hash (None without it); it must not be one of the inputs or --out."""
    if judge.store:
        check_output_path(judge.store, inputs)
    return open_verdict_store(judge)


def main(argv: list[str]) -> None:
    cli.start("experiments.evaluate", argv)
    config = cli.settings("experiments.evaluate", _CONFIG.value, Evaluate)
    try:
        if not config.benchmark:
            raise EvalInputError(f"--config.benchmark is required: one of {', '.join(harness.BENCHMARKS)}")
        for name, flag in (("data_dir", _DATA_DIR), ("out", _OUT)):
            if not flag.value:
                raise EvalInputError(f"--{name} is required")
        data_dir, out = Path(_DATA_DIR.value), Path(_OUT.value)
        if _JUDGEMENTS.value is not None:
            if config.benchmark != "hellobench":
                raise EvalInputError("--judgements is a HelloBench file; got "
                                     f"--config.benchmark={config.benchmark}")
            models = [m.strip() for m in config.models.split(",") if m.strip()] or None
            summary = harness.score_judgements(Path(_JUDGEMENTS.value), data_dir, models, out)
            print(json.dumps({"models": len(summary["models"]), "incomplete": summary["incomplete"], "out": str(out)}))
            return
        generation, judge, mesh = _settings(config)
        checkpoint = Path(_CHECKPOINT.value) if _CHECKPOINT.value else None
        workdir = Path(_WORKDIR.value) if _WORKDIR.value else None
        if (checkpoint is None) == (workdir is None):
            raise EvalInputError("give exactly one of --checkpoint (a HF directory) and --workdir (a training run)")
        policy_dir = checkpoint or workdir
        if not policy_dir.is_dir():
            flag = "checkpoint" if checkpoint else "workdir"
            raise EvalInputError(f"--{flag}={policy_dir}: directory does not exist")
        shared = None
        if _RUBRIC.value is not None:
            if not Path(_RUBRIC.value).is_file():
                raise EvalInputError(f"--rubric={_RUBRIC.value}: file does not exist")
            shared = load_rubric(_RUBRIC.value)
        sources = [path for path in (data_dir / _DATA_FILE.value if _DATA_FILE.value else None,
                                     Path(_RUBRIC.value) if _RUBRIC.value else None, workdir) if path is not None]
        inputs = [*sources, *(Path(p) for p in (judge.calibration, judge.store) if p)]  # --out may not hold them
        input_dirs = [data_dir, *(Path(p) for p in judge.checkpoints), *([checkpoint] if checkpoint else [])]
        evaluation = harness.prepare(config.benchmark, data_dir, _DATA_FILE.value, config.limit or None,
                                     out, judge, inputs, input_dirs, shared)
        judge = judge.for_benchmark(evaluation.benchmark.judge_mode)
        calibration = _calibration(judge, evaluation)
        store = _open_store(judge, [*sources, *input_dirs, out])
        summary = harness.run(evaluation, checkpoint=checkpoint, workdir=workdir, which=config.which, mesh_axes=mesh,
                              generation=generation, judge=judge, calibration=calibration, store=store)
    except (EvalInputError, RubricError, DataError, UnicodeDecodeError, StoreError, PathError) as e:
        _fail(str(e))
    except (EvalFailed, EndpointDown) as e:  # it ran, but nothing could be scored, or its judge went away: exit 1
        _fail(str(e), status=1)
    print(json.dumps({"benchmark": summary["benchmark"], "policy": summary["policy"], "scores": summary["scores"],
                      "out": str(out)}, ensure_ascii=False))
    failure = nothing_judged(summary)
    if failure:
        _fail(f"{failure}; {out / 'summary.json'} has the counts", status=1)


def nothing_judged(summary: dict) -> str | None:
    """The stage and cause when an evaluation generated no answer at all (exit 1), else None. An evaluation
    whose judged answers got no score is stopped by the harness itself (`harness.check_scored`, EvalFailed)."""
    counts = summary["counts"]
    if counts["cases"] and not counts["generated"]:
        return (f"generate: no answer was generated for any of the {counts['cases']} cases "
                f"({counts['prompt_too_long']} prompts longer than the policy's context)")
    return None


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.evaluate"))

"""Evaluates a policy on a public benchmark, or scores HelloBench's published judgements.

  python -m experiments.evaluate --benchmark=hellobench|longbench_write|healthbench|biggen|rubric_set \
      --data_dir=DIR [--data_file=NAME] --out=DIR (--checkpoint=HF_DIR | --workdir=RUN_DIR [--which=latest|best]) \
      [--judge.checkpoint=DIR[,DIR]] [--judge=configs/judges/X.py] [--judge.FIELD=...] [--judge.store=VERDICTS.db]
      [--limit=N] [--prompt_format=plain|think_answer] [--max_new_tokens=2048]
  python -m experiments.evaluate --benchmark=hellobench --data_dir=DIR --judgements=FILE.csv --out=DIR [--models=a,b]

Writes records.jsonl, summary.json, table.md and plot.png into --out (rubric_jax/evaluation/report.py).
The judge is configs/judges/<benchmark>.py (the benchmark's prescribed prompt and settings; rubric_set:
configs/judges/default.py) unless --judge names another file; summary.json records its hash and fields. With
--judge.calibration=REPORT each LLM dimension's calibration status is printed before the policy loads.
Bad input (unknown benchmark, missing file, malformed line, incomplete judgements of a named model, an
LLM-judged benchmark without a judge, --out naming an input) exits with status 2 and one line naming
the file and line; nothing is written. So does a --max_new_tokens that leaves no case room in the policy's
context (before generating). An evaluation whose judged answers all lack every score (e.g. every judge prompt
too long) writes its report and exits with status 1 saying why.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

from absl import app, flags

from experiments import cli, judge_config
from rubric_jax.calibration.pinning import check_calibration
from rubric_jax.data import DataError
from rubric_jax.evaluation import harness
from rubric_jax.judges.http_backend import EndpointDown
from rubric_jax.evaluation.results import EvalFailed, EvalInputError
from rubric_jax.files import PathError, check_output_path
from rubric_jax.judges.spec import JudgeSpec, check_checkpoints, open_verdict_store
from rubric_jax.judges.store import StoreError, VerdictStore
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import RubricError

_BENCHMARK = flags.DEFINE_string("benchmark", None, f"One of {', '.join(harness.BENCHMARKS)}.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "The benchmark's folder (e.g. ../shared/data/hellobench).")
_DATA_FILE = flags.DEFINE_string("data_file", None, "File in --data_dir (longbench_write, healthbench, biggen, "
                                  "rubric_set).")
_OUT = flags.DEFINE_string("out", None, "Output directory (must not be or contain an input).")
_LIMIT = flags.DEFINE_integer("limit", 0, "Evaluate only the first N cases (HelloBench: of each task); 0 = all.")
_JUDGEMENTS = flags.DEFINE_string("judgements", None, "HelloBench: score this published judgements CSV, no model.")
_MODELS = flags.DEFINE_list("models", None, "With --judgements: score only these models (each must be complete).")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Policy: a Hugging Face directory.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Policy: a training run directory (experiments.run --workdir).")
_WHICH = flags.DEFINE_string("which", "latest", "With --workdir: latest, or best (highest logged eval/reward_mean).")
_RUBRIC = flags.DEFINE_string("rubric", None, "rubric_set: a rubric shared by rows without their own.")
_SAMPLER = flags.DEFINE_string("sampler", "greedy", "Policy sampler (see rubric_jax.sampling).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 2048, "Policy answer budget in tokens.")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Prompts per sampler call.")
_FORMAT = flags.DEFINE_string("prompt_format", "plain", "plain, or think_answer (rubric_jax's training format).")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed of policy and judge sampling.")
_MESH = flags.DEFINE_list("mesh", ["1", "-1", "1"], "Mesh axis sizes data,fsdp,tensor (-1: the remaining devices).")


_fail = functools.partial(cli.fail, "experiments.evaluate")  # one line on stderr, exit status 2


def _judge() -> JudgeSpec:
    """The --judge spec; without --judge, the benchmark's judge file (rubric_set: the default block)."""
    benchmark_file = judge_config.JUDGES_DIR / f"{_BENCHMARK.value}.py"
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


def _settings() -> tuple[harness.GenerationSettings, JudgeSpec, tuple[int, int, int]]:
    """Validated flag values (EvalInputError names the flag)."""
    for flag, value, minimum in (("limit", _LIMIT.value, 0), ("max_new_tokens", _MAX_NEW.value, 1),
                                 ("batch_size", _BATCH.value, 1)):
        if value < minimum:
            raise EvalInputError(f"--{flag} must be >= {minimum}, got {value}")
    for flag, value, allowed in (("which", _WHICH.value, harness.WHICH),
                                 ("prompt_format", _FORMAT.value, harness.PROMPT_FORMATS)):
        if value not in allowed:
            raise EvalInputError(f"--{flag}={value}: expected one of {list(allowed)}")
    try:
        mesh = tuple(int(x) for x in _MESH.value)
    except ValueError:
        raise EvalInputError(f"--mesh={','.join(_MESH.value)}: expected three integers data,fsdp,tensor") from None
    if len(mesh) != 3:
        raise EvalInputError(f"--mesh={','.join(_MESH.value)}: expected three integers data,fsdp,tensor")
    generation = harness.GenerationSettings(_SAMPLER.value, _MAX_NEW.value, _BATCH.value, _FORMAT.value, _SEED.value)
    return generation, _judge(), mesh


def _open_store(judge: JudgeSpec, inputs: list[Path]) -> VerdictStore | None:
    """--judge.store under the judge hash (None without it); it must not be one of the inputs or --out."""
    if judge.store:
        check_output_path(judge.store, inputs)
    return open_verdict_store(judge)


def main(argv: list[str]) -> None:
    cli.start("experiments.evaluate", argv)
    try:
        for name, flag in (("benchmark", _BENCHMARK), ("data_dir", _DATA_DIR), ("out", _OUT)):
            if not flag.value:
                raise EvalInputError(f"--{name} is required")
        data_dir, out = Path(_DATA_DIR.value), Path(_OUT.value)
        if _JUDGEMENTS.value is not None:
            if _BENCHMARK.value != "hellobench":
                raise EvalInputError(f"--judgements is a HelloBench file; got --benchmark={_BENCHMARK.value}")
            summary = harness.score_judgements(Path(_JUDGEMENTS.value), data_dir, _MODELS.value, out)
            print(json.dumps({"models": len(summary["models"]), "incomplete": summary["incomplete"], "out": str(out)}))
            return
        generation, judge, mesh = _settings()
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
        evaluation = harness.prepare(_BENCHMARK.value, data_dir, _DATA_FILE.value, _LIMIT.value or None, out, judge,
                                     inputs, input_dirs, shared)
        judge = judge.for_benchmark(evaluation.benchmark.judge_mode)
        calibration = _calibration(judge, evaluation)
        store = _open_store(judge, [*sources, *input_dirs, out])
        summary = harness.run(evaluation, checkpoint=checkpoint, workdir=workdir, which=_WHICH.value, mesh_axes=mesh,
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

"""Evaluates a policy on a public benchmark, or scores HelloBench's published judgements.

  python -m experiments.evaluate --benchmark=hellobench|longbench_write|healthbench|biggen|rubric_set \
      --data_dir=DIR [--data_file=NAME] --out=DIR (--checkpoint=HF_DIR | --workdir=RUN_DIR [--which=latest|best]) \
      [--judge_checkpoint=DIR[,DIR]] [--judge_store=VERDICTS.db] [--limit=N] [--prompt_format=plain|think_answer] \
      [--max_new_tokens=2048]
  python -m experiments.evaluate --benchmark=hellobench --data_dir=DIR --judgements=FILE.csv --out=DIR [--models=a,b]

Writes records.jsonl, summary.json, table.md and plot.png into --out (rubric_jax/evaluation/report.py).
Bad input (unknown benchmark, missing file, malformed line, incomplete judgements of a named model, an
LLM-judged benchmark without a judge, --out naming an input) exits with status 2 and one line naming
the file and line; nothing is written. So does a --max_new_tokens that leaves no case room in the policy's
context (before generating). An evaluation whose judged answers all lack every score (e.g. every judge prompt
too long) writes its report and exits with status 1 saying why.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

from absl import app, flags

from experiments import cli
from rubric_jax.data import DataError
from rubric_jax.evaluation import harness
from rubric_jax.evaluation.results import EvalFailed, EvalInputError
from rubric_jax.files import PathError, check_output_path
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
_JUDGE = flags.DEFINE_list("judge_checkpoint", [], "Judge HF directory; several make a mean ensemble.")
_JUDGE_MODE = flags.DEFINE_string("judge_mode", "benchmark", "benchmark (its own), single or multi.")
_JUDGE_SAMPLES = flags.DEFINE_integer("judge_samples", 1, "Judge samples per item (median of the valid ones).")
_JUDGE_RETRIES = flags.DEFINE_integer("judge_retries", 3, "Re-prompt rounds for unparseable verdicts.")
_JUDGE_SAMPLER = flags.DEFINE_string("judge_sampler", "temperature(0.7)", "Judge sampler.")
_JUDGE_MAX_NEW = flags.DEFINE_integer("judge_max_new_tokens", 512, "Judge answer budget in tokens.")
_JUDGE_BATCH = flags.DEFINE_integer("judge_batch_size", 64, "Answers per judge pass.")
_JUDGE_STORE = flags.DEFINE_string("judge_store", "", "Verdict store (SQLite, rubric_jax/judges/store.py) read before "
                                   "judging and written after each judge call; empty = none.")


_fail = functools.partial(cli.fail, "experiments.evaluate")  # one line on stderr, exit status 2


def _settings() -> tuple[harness.GenerationSettings, harness.JudgeSettings, tuple[int, int, int]]:
    """Validated flag values (EvalInputError names the flag)."""
    for flag, value, minimum in (("limit", _LIMIT.value, 0), ("max_new_tokens", _MAX_NEW.value, 1),
                                 ("batch_size", _BATCH.value, 1), ("judge_samples", _JUDGE_SAMPLES.value, 1),
                                 ("judge_retries", _JUDGE_RETRIES.value, 0),
                                 ("judge_batch_size", _JUDGE_BATCH.value, 1),
                                 ("judge_max_new_tokens", _JUDGE_MAX_NEW.value, 1)):
        if value < minimum:
            raise EvalInputError(f"--{flag} must be >= {minimum}, got {value}")
    for flag, value, allowed in (("which", _WHICH.value, harness.WHICH),
                                 ("prompt_format", _FORMAT.value, harness.PROMPT_FORMATS),
                                 ("judge_mode", _JUDGE_MODE.value, ("benchmark", "single", "multi"))):
        if value not in allowed:
            raise EvalInputError(f"--{flag}={value}: expected one of {list(allowed)}")
    try:
        mesh = tuple(int(x) for x in _MESH.value)
    except ValueError:
        raise EvalInputError(f"--mesh={','.join(_MESH.value)}: expected three integers data,fsdp,tensor") from None
    if len(mesh) != 3:
        raise EvalInputError(f"--mesh={','.join(_MESH.value)}: expected three integers data,fsdp,tensor")
    for path in _JUDGE.value:
        if not (Path(path) / "config.json").is_file():
            raise EvalInputError(f"--judge_checkpoint={path}: not a Hugging Face model directory (no config.json)")
    generation = harness.GenerationSettings(_SAMPLER.value, _MAX_NEW.value, _BATCH.value, _FORMAT.value, _SEED.value)
    judge = harness.JudgeSettings(tuple(Path(p) for p in _JUDGE.value),
                                  None if _JUDGE_MODE.value == "benchmark" else _JUDGE_MODE.value, _JUDGE_SAMPLES.value,
                                  _JUDGE_RETRIES.value, _JUDGE_SAMPLER.value, _JUDGE_MAX_NEW.value, _JUDGE_BATCH.value)
    return generation, judge, mesh


def _open_store(judge: harness.JudgeSettings, inputs: list[Path]) -> VerdictStore | None:
    """--judge_store under a hash of the judge settings and checkpoints' resolved paths (None without it);
    it must not be one of the inputs or --out."""
    if not _JUDGE_STORE.value:
        return None
    if not judge.checkpoints:
        raise EvalInputError(f"--judge_store={_JUDGE_STORE.value}: there is no LLM judge (--judge_checkpoint) whose "
                             "verdicts to store")
    check_output_path(_JUDGE_STORE.value, inputs)
    fields = {**dataclasses.asdict(judge), "checkpoints": [str(p.resolve()) for p in judge.checkpoints]}
    return VerdictStore(_JUDGE_STORE.value, hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest())


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
        inputs = [*sources, *([Path(_JUDGE_STORE.value)] if _JUDGE_STORE.value else [])]  # --out may not hold them
        input_dirs = [data_dir, *judge.checkpoints, *([checkpoint] if checkpoint else [])]
        evaluation = harness.prepare(_BENCHMARK.value, data_dir, _DATA_FILE.value, _LIMIT.value or None, out, judge,
                                     inputs, input_dirs, shared)
        store = _open_store(judge, [*sources, *input_dirs, out])
        summary = harness.run(evaluation, checkpoint=checkpoint, workdir=workdir, which=_WHICH.value, mesh_axes=mesh,
                              generation=generation, judge=judge, store=store)
    except (EvalInputError, RubricError, DataError, UnicodeDecodeError, StoreError, PathError) as e:
        _fail(str(e))
    except EvalFailed as e:  # it ran, but nothing could be scored: exit 1, as a failed run
        _fail(str(e), status=1)
    print(json.dumps({"benchmark": summary["benchmark"], "policy": summary["policy"], "scores": summary["scores"],
                      "out": str(out)}, ensure_ascii=False))


if __name__ == "__main__":
    app.run(main)

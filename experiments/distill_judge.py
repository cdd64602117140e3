"""Distils an LLM judge from a teacher, then measures it against the teacher on held-out items.

  python -m experiments.distill_judge --out=DIR --rubric=RUBRIC.yaml --dimensions=politeness
      [--teacher=rules |
       --teacher=judge [--judge=configs/judges/X.py] --judge.checkpoint=DIR[,DIR] [--judge.FIELD=...] |
       --teacher=labels --labels=FILE.jsonl]
      [--responses=IN.jsonl]  (default: the tiny cold-start answers, more drawn alike, and perturbed copies)
      (--student_config=config.json --tokenizer=DIR | --student_checkpoint=DIR)
      [--steps=400] [--batch_size=32] [--lr=2e-3] [--warmup_steps=20] [--heldout=0.15] [--seed=0]
      [--student_sampler=greedy] [--student_max_new_tokens=32] [--student_prompt=full|compact]

Teachers (rubric_jax/judges/distill_data.py): `rules` scores each listed rule dimension with its rule judge and
the student learns its LLM twin; `judge` lets LLM judges (the --judge spec of experiments.score, an
ensemble when it names several checkpoints) score the listed dimensions through the training scoring path;
`labels` takes the scores of a labels file ({"question", "response", "labels": {dimension: score}, optional
"rubric"}: the calibration format). --responses lines are {"question", "response", optional "rubric"} (the experiments.score format). A
question and every response to it are held out together (--heldout of the questions).

The student is a random init from a HF config.json with a tokenizer directory (it needs a chat template), or an
existing HF directory. DIR receives the distilled judge (config.json, model.safetensors, tokenizer) with
report.json and report.md: per dimension, the parse-failure rate and the agreement with the teacher (Spearman,
Kendall tau-b, quadratic kappa, bootstrap intervals). DIR appears only when complete and must not exist yet,
nor be or lie inside an input (the tokenizer or student directory). Bad input, --student_max_new_tokens
included, exits with status 2 and one line naming the file, line or flag, before training starts.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

import jax
from absl import app, flags

from experiments import cli, judge_config
from rubric_jax import files, loader, sampling
from rubric_jax.assets import tiny_judge_data
from rubric_jax.calibration.labels import LabelsError, read_items
from rubric_jax.data import DataError
from rubric_jax.judges import distill_data
from rubric_jax.judges.spec import judge_hash, load_cascade, load_judges
from rubric_jax.models.checkpoint import CheckpointError, load_tokenizer
from rubric_jax.models.config import ModelConfig, ModelConfigError
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.responses import InputError, read_rows
from rubric_jax.rubrics.schema import RubricError
from rubric_jax.train import distill_judge

_OUT = flags.DEFINE_string("out", None, "New directory for the distilled judge and its report.")
_RUBRIC = flags.DEFINE_string("rubric", None, "Rubric file (.json/.yaml) defining the dimensions; rows may add theirs.")
_DIMENSIONS = flags.DEFINE_list("dimensions", None, "Dimension ids the judge learns (default: every labelled one).")
_TEACHER = flags.DEFINE_enum("teacher", "rules", ["rules", "judge", "labels"], "Who scores the training items.")
_LABELS = flags.DEFINE_string("labels", None, "Labels .jsonl of a labels teacher (the calibration format).")
_RESPONSES = flags.DEFINE_string("responses", None, "Responses to judge (rules/judge teachers); default: tiny SFT.")
_STUDENT_CONFIG = flags.DEFINE_string("student_config", None, "HF config.json of a randomly initialised student.")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "Tokenizer directory of a --student_config student.")
_STUDENT = flags.DEFINE_string("student_checkpoint", None, "HF directory of a pretrained student (with tokenizer).")
_STEPS = flags.DEFINE_integer("steps", 400, "Optimizer updates.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Items per update.")
_LR = flags.DEFINE_float("lr", 2e-3, "Peak learning rate (warmup, then cosine decay).")
_WARMUP = flags.DEFINE_integer("warmup_steps", 20, "Linear warmup steps.")
_HELDOUT = flags.DEFINE_float("heldout", 0.15, "Fraction of the questions held out to measure the student.")
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the student init, batch order, prompts and judge sampling.")
_SAMPLER = flags.DEFINE_string("student_sampler", "greedy", "Sampler of the student's held-out measurement.")
_MAX_NEW = flags.DEFINE_integer("student_max_new_tokens", 32, "Verdict budget of the student's held-out measurement.")
_PROMPT = flags.DEFINE_enum("student_prompt", "full", ["full", "compact"], "The judge prompt the student learns "
                            "(compact: criterion, fenced response and SCORE line; README, 'Distilling a judge').")
flags.mark_flags_as_required(["out"])

ERRORS = (ValueError, FileNotFoundError, FileExistsError, InputError, LabelsError, RubricError, DataError,
          CheckpointError, ModelConfigError, UnicodeDecodeError)


_fail = functools.partial(cli.fail, "experiments.distill_judge")  # one line on stderr, exit status 2


def _student():
    """(ModelConfig, params or None, tokenizer, description) of the student the flags name."""
    if (_STUDENT.value is None) == (_STUDENT_CONFIG.value is None):
        raise ValueError("give --student_checkpoint=DIR, or --student_config=config.json with --tokenizer=DIR")
    if _STUDENT.value is not None:
        if not Path(_STUDENT.value).is_dir():
            raise FileNotFoundError(f"--student_checkpoint={_STUDENT.value}: directory does not exist")
        # Trained in float32 in the training layout (the SFT step refuses other parameter dtypes).
        weights = loader.load_weights(_STUDENT.value, distill_judge.default_layout(), param_dtype="float32")
        return weights.cfg, weights, load_tokenizer(_STUDENT.value), _STUDENT.value
    if _TOKENIZER.value is None or not Path(_TOKENIZER.value).is_dir():
        raise ValueError(f"--tokenizer={_TOKENIZER.value}: a tokenizer directory is needed with --student_config")
    path = Path(_STUDENT_CONFIG.value)
    if not path.is_file():
        raise FileNotFoundError(f"--student_config={path}: file does not exist")
    cfg = _student_config(path)
    tokenizer = load_tokenizer(_TOKENIZER.value)
    if len(tokenizer) > cfg.vocab_size:
        raise ValueError(f"--tokenizer={_TOKENIZER.value} has {len(tokenizer)} tokens, more than the "
                         f"{cfg.vocab_size} of --student_config={path}")
    return cfg, None, tokenizer, f"random init of {path}"


def _student_config(path: Path) -> ModelConfig:
    """The --student_config file as a ModelConfig; any problem is one line naming the file."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"expected a HF config.json object, got {type(raw).__name__}")
        return ModelConfig.from_hf_dict(raw)
    except (UnicodeDecodeError, ValueError, RecursionError, ModelConfigError) as e:
        raise ValueError(f"--student_config={path}: {' '.join(str(e).split())[:300]}") from None


# DistillConfig field -> the flag that sets it (its errors name the flag).
_CONFIG_FLAGS = {"steps": "--steps", "batch_size": "--batch_size", "learning_rate": "--lr",
                 "warmup_steps": "--warmup_steps", "seed": "--seed", "prompt": "--student_prompt"}


def _distill_config() -> distill_judge.DistillConfig:
    """The training flags as a DistillConfig; a bad value names its flag."""
    try:
        return distill_judge.DistillConfig(steps=_STEPS.value, batch_size=_BATCH.value, learning_rate=_LR.value,
                                           warmup_steps=_WARMUP.value, seed=_SEED.value, prompt=_PROMPT.value)
    except ValueError as e:
        message = str(e).removeprefix("distill config: ")
        for field, flag in _CONFIG_FLAGS.items():
            message = re.sub(rf"\b{field}\b", flag, message)
        raise ValueError(message) from None


def _check_out(out: Path) -> None:
    """--out is new and is not, does not hold, and does not lie inside an input (file or directory)."""
    if out.exists():
        raise FileExistsError(f"--out={out}: already exists; distil into a new directory")
    inputs = [Path(v) for v in (_RUBRIC.value, _LABELS.value, _RESPONSES.value, _STUDENT_CONFIG.value) if v]
    input_dirs = [Path(v) for v in (_TOKENIZER.value, _STUDENT.value) if v]
    files.check_output_dir(out, inputs, input_dirs)


def _items(shared) -> tuple[list[distill_data.JudgeItem], str]:
    """Every teacher-scored item the flags describe, and a description of the teacher."""
    wanted = _DIMENSIONS.value
    if _TEACHER.value == "labels":
        if _LABELS.value is None or _RESPONSES.value is not None:
            raise ValueError("--teacher=labels: give --labels=FILE (its rows carry the responses), not --responses")
        items = []
        for row in read_items(_LABELS.value, shared):
            labels = {d: v for d, v in row.labels.items() if wanted is None or d in wanted}
            items += distill_data.label_items(row.question, row.response, row.rubric, labels)
        return items, f"labels {_LABELS.value}"
    if not wanted:
        raise ValueError(f"--dimensions: name the dimensions a {_TEACHER.value} teacher scores")
    if _RESPONSES.value is not None:
        rows, rubrics, _ = read_rows(Path(_RESPONSES.value), shared)
        questions, responses = [r["question"] for r in rows], [r["response"] for r in rows]
    else:
        if shared is None:
            raise ValueError("--rubric: the default responses (tiny answers) need a rubric")
        answers = tiny_judge_data.base_answers()
        judged = tiny_judge_data.answers_to_judge(answers)
        questions = [a.question for a, group in zip(answers, judged) for _ in group]
        responses = [r for group in judged for r in group]
        rubrics = [shared] * len(responses)
    if _TEACHER.value == "rules":
        teachers = distill_data.rule_teachers_per_row(rubrics, wanted)
        return distill_data.rule_items(questions, responses, teachers), f"rule judges of {', '.join(wanted)}"
    spec = judge_config.spec()
    if not spec.has_judge:
        raise ValueError("--teacher=judge: give --judge.checkpoint=DIR[,DIR] (or a --judge file that names one)")
    judges = load_judges(spec, where="--judge")
    dims = [[d for d in rubric.dimensions if d.id in wanted] for rubric in rubrics]
    items, missing = distill_data.judge_items(judges, spec, questions, responses, dims, jax.random.key(_SEED.value),
                                              refiners=load_cascade(spec, where="--judge"))
    print(f"the teacher judges left {missing} score(s) missing; those items are not used", file=sys.stderr)
    return items, f"judge(s) {','.join(spec.checkpoints)} (judge hash {judge_hash(spec)})"


def main(argv: list[str]) -> None:
    cli.start("experiments.distill_judge", argv)
    try:
        out = Path(_OUT.value)
        _check_out(out)
        try:
            sampling.parse_sampler(_SAMPLER.value)
        except ValueError as e:
            raise ValueError(f"--student_sampler: {e}") from None
        config = _distill_config()
        shared = None
        if _RUBRIC.value is not None:
            if not Path(_RUBRIC.value).is_file():
                raise RubricError(f"--rubric={_RUBRIC.value}: rubric file does not exist")
            shared = load_rubric(_RUBRIC.value)
        items, teacher = _items(shared)
        train_items, heldout_items = distill_data.split_by_question(items, _HELDOUT.value)
        if not train_items or not heldout_items:
            raise ValueError(f"{len(items)} items split into {len(train_items)} training and {len(heldout_items)} "
                             "held-out ones; both must be non-empty (more questions, or another --heldout)")
        model_cfg, start, tokenizer, student = _student()
        distill_judge.check_measurement(model_cfg, _MAX_NEW.value, "--student_max_new_tokens")  # before training
    except ERRORS as e:
        _fail(str(e))
    try:
        payload = distill_judge.distill(model_cfg, start, tokenizer, train_items, heldout_items, out, config,
                                        teacher=teacher, student=student, sampler=_SAMPLER.value,
                                        max_new_tokens=_MAX_NEW.value)
    except OSError as e:  # a full disk after training: `out` appears only once complete
        cli.fail_write("experiments.distill_judge", out, e)
    print(json.dumps({"out": str(out), "heldout": payload["heldout"]["items"],
                      "parse_failure_rate": payload["heldout"]["parse_failure_rate"],
                      "spearman": {d: v["spearman"]["value"] for d, v in payload["dimensions"].items()}}))


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.distill_judge"))

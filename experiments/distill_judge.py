"""Distils an LLM judge from a teacher, then measures it against the teacher on held-out items.

  python -m experiments.distill_judge --out=DIR --rubric=RUBRIC.yaml --config.dimensions=politeness
      [--config.teacher=rules |
       --config.teacher=judge [--judge=configs/judges/X.py] --judge.checkpoint=DIR[,DIR] [--judge.FIELD=...] |
       --config.teacher=labels --labels=FILE.jsonl]
      [--responses=IN.jsonl]  (default: the tiny cold-start answers, more drawn alike, and perturbed copies)
      (--student_config=config.json --tokenizer=DIR | --student_checkpoint=DIR)
      [--config.train.steps=400] [--config.train.prompt=full|compact] [--config.FIELD=...]

The settings (teacher, dimensions, held-out fraction, the student's training and its held-out measurement) are
configs/commands/distill_judge.py, overridden with --config.FIELD=VALUE; the flags are the inputs and the output.
Teachers (rubric_jax/judges/distill_data.py): `rules` scores each listed rule dimension with its rule judge and
the student learns its LLM twin; `judge` lets LLM judges (the --judge spec of experiments.score, an
ensemble when it names several checkpoints) score the listed dimensions through the training scoring path;
`labels` takes the scores of a labels file ({"question", "response", "labels": {dimension: score}, optional
"rubric"}: the calibration format). --responses lines are {"question", "response", optional "rubric"} (the
experiments.score format). A question and every response to it are held out together (config.heldout of the
questions).

The student is a random init from a HF config.json with a tokenizer directory (it needs a chat template), or an
existing HF directory. DIR receives the distilled judge (config.json, model.safetensors, tokenizer) with
report.json and report.md: per dimension, the parse-failure rate and the agreement with the teacher (Spearman,
Kendall tau-b, quadratic kappa, bootstrap intervals). DIR appears only when complete and must not exist yet,
nor be or lie inside an input (the tokenizer or student directory). Bad input, config.measure.max_new_tokens
included, exits with status 2 and one line naming the file, line or setting, before training starts.
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
from rubric_jax.command_blocks import DistillJudge
from rubric_jax.data import DataError
from rubric_jax.judges import distill_data
from rubric_jax.judges.loading import load_cascade, load_judges
from rubric_jax.judges.spec import judge_hash
from rubric_jax.models.checkpoint import CheckpointError, load_tokenizer
from rubric_jax.models.config import ModelConfig, ModelConfigError
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.responses import InputError, read_rows
from rubric_jax.rubrics.schema import RubricError
from rubric_jax.train import distill_judge

_CONFIG = cli.define_config("distill_judge")
_OUT = flags.DEFINE_string("out", None, "New directory for the distilled judge and its report.")
_RUBRIC = flags.DEFINE_string("rubric", None, "Rubric file (.json/.yaml) defining the dimensions; rows may add theirs.")
_LABELS = flags.DEFINE_string("labels", None, "Labels .jsonl of a labels teacher (the calibration format).")
_RESPONSES = flags.DEFINE_string("responses", None, "Responses to judge (rules/judge teachers); default: tiny SFT.")
_STUDENT_CONFIG = flags.DEFINE_string("student_config", None, "HF config.json of a randomly initialised student.")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "Tokenizer directory of a --student_config student.")
_STUDENT = flags.DEFINE_string("student_checkpoint", None, "HF directory of a pretrained student (with tokenizer).")
flags.mark_flags_as_required(["out"])

_TEACHERS = ("rules", "judge", "labels")
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


# DistillConfig field -> the config key that sets it (its errors name the key).
_CONFIG_KEYS = {"steps": "--config.train.steps", "batch_size": "--config.train.batch_size",
                "learning_rate": "--config.train.lr", "warmup_steps": "--config.train.warmup_steps",
                "seed": "--config.seed", "prompt": "--config.train.prompt"}


def _distill_config(settings: DistillJudge) -> distill_judge.DistillConfig:
    """settings.train and settings.seed as a DistillConfig; a bad value names its key."""
    train = settings.train
    try:
        return distill_judge.DistillConfig(steps=train.steps, batch_size=train.batch_size, learning_rate=train.lr,
                                           warmup_steps=train.warmup_steps, seed=settings.seed,
                                           prompt=train.prompt)
    except ValueError as e:
        message = str(e).removeprefix("distill config: ")
        for field, key in _CONFIG_KEYS.items():
            message = re.sub(rf"(?<![.\w]){field}\b", key, message)
        raise ValueError(message) from None


def _dimensions(settings: DistillJudge) -> list[str] | None:
    """settings.dimensions as a list (None: every labelled one)."""
    names = [d.strip() for d in settings.dimensions.split(",") if d.strip()]
    return names or None


def _check_settings(config: DistillJudge) -> None:
    """The settings the training config does not cover, checked before any input is read."""
    cli.check(config.teacher in _TEACHERS, "teacher", config.teacher, f"one of {list(_TEACHERS)}")
    cli.check(0.0 < config.heldout < 1.0, "heldout", config.heldout, "a fraction in (0, 1)")
    try:
        sampling.parse_sampler(config.measure.sampler)
    except ValueError as e:
        raise ValueError(f"--config.measure.sampler: {e}") from None


def _check_out(out: Path) -> None:
    """--out is new and is not, does not hold, and does not lie inside an input (file or directory)."""
    if out.exists():
        raise FileExistsError(f"--out={out}: already exists; distil into a new directory")
    inputs = [Path(v) for v in (_RUBRIC.value, _LABELS.value, _RESPONSES.value, _STUDENT_CONFIG.value) if v]
    input_dirs = [Path(v) for v in (_TOKENIZER.value, _STUDENT.value) if v]
    files.check_output_dir(out, inputs, input_dirs)


def _items(shared, settings: DistillJudge) -> tuple[list[distill_data.JudgeItem], str]:
    """Every teacher-scored item the flags and settings describe, and a description of the teacher."""
    wanted, teacher = _dimensions(settings), settings.teacher
    if teacher == "labels":
        if _LABELS.value is None or _RESPONSES.value is not None:
            raise ValueError("--config.teacher=labels: give --labels=FILE (its rows carry the responses), "
                             "not --responses")
        items = []
        for row in read_items(_LABELS.value, shared):
            labels = {d: v for d, v in row.labels.items() if wanted is None or d in wanted}
            items += distill_data.label_items(row.question, row.response, row.rubric, labels)
        return items, f"labels {_LABELS.value}"
    if not wanted:
        raise ValueError(f"--config.dimensions: name the dimensions a {teacher} teacher scores")
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
    if teacher == "rules":
        teachers = distill_data.rule_teachers_per_row(rubrics, wanted)
        return distill_data.rule_items(questions, responses, teachers), f"rule judges of {', '.join(wanted)}"
    spec = judge_config.spec()
    if not spec.has_judge:
        raise ValueError("--config.teacher=judge: give --judge.checkpoint=DIR[,DIR] (or a --judge file that names one)")
    judges = load_judges(spec, where="--judge")
    dims = [[d for d in rubric.dimensions if d.id in wanted] for rubric in rubrics]
    key = jax.random.key(settings.seed)
    items, missing = distill_data.judge_items(judges, spec, questions, responses, dims, key,
                                              refiners=load_cascade(spec, where="--judge"))
    print(f"the teacher judges left {missing} score(s) missing; those items are not used", file=sys.stderr)
    return items, f"judge(s) {','.join(spec.checkpoints)} (judge hash {judge_hash(spec)})"


def main(argv: list[str]) -> None:
    cli.start("experiments.distill_judge", argv)
    settings = cli.settings("experiments.distill_judge", _CONFIG.value, DistillJudge)
    try:
        out = Path(_OUT.value)
        _check_out(out)
        _check_settings(settings)
        config = _distill_config(settings)
        shared = None
        if _RUBRIC.value is not None:
            if not Path(_RUBRIC.value).is_file():
                raise RubricError(f"--rubric={_RUBRIC.value}: rubric file does not exist")
            shared = load_rubric(_RUBRIC.value)
        items, teacher = _items(shared, settings)
        train_items, heldout_items = distill_data.split_by_question(items, settings.heldout)
        if not train_items or not heldout_items:
            raise ValueError(f"{len(items)} items split into {len(train_items)} training and {len(heldout_items)} "
                             "held-out ones; both must be non-empty (more questions, or another --config.heldout)")
        model_cfg, start, tokenizer, student = _student()
        measure = settings.measure
        distill_judge.check_measurement(model_cfg, measure.max_new_tokens, "--config.measure.max_new_tokens")
    except ERRORS as e:
        _fail(str(e))
    try:
        payload = distill_judge.distill(model_cfg, start, tokenizer, train_items, heldout_items, out, config,
                                        teacher=teacher, student=student, sampler=measure.sampler,
                                        max_new_tokens=measure.max_new_tokens)
    except OSError as e:  # a full disk after training: `out` appears only once complete
        cli.fail_write("experiments.distill_judge", out, e)
    print(json.dumps({"out": str(out), "heldout": payload["heldout"]["items"],
                      "parse_failure_rate": payload["heldout"]["parse_failure_rate"],
                      "spearman": {d: v["spearman"]["value"] for d, v in payload["dimensions"].items()}}))


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.distill_judge"))

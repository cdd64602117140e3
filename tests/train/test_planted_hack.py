"""The planted-hack experiment (RubricRL 6.1): the README's two commands name configs that validate, point at
shipped assets and run a GRPO step whose clarity scores come from their distilled judge; and the two judges price
a template as their teachers do (the hack judge pays for firstly/secondly/finally scaffolding, the fixed one does
not), which an untrained judge or one asked in another prompt style than it learnt cannot do."""

import importlib
import shlex
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import traverse_util

from rubric_jax import config_boundary
from rubric_jax.assets import ASSETS_DIR, build_tiny_assets, build_tiny_judges, tiny_judge_data
from rubric_jax.judges.distill_data import rule_items
from rubric_jax.judges.llm_judge import load_judge
from rubric_jax.judges.rules import TemplatePhrases
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.train import distill_judge, grpo_stage, loop, settings
from first_grpo_step import first_grpo_step
from tests import manual

ROOT = Path(__file__).resolve().parents[2]
README = manual.text()  # README.md and docs/*.md
CONFIG_FILES = {"hack": "configs/tiny_hack.py", "fixed": "configs/tiny_hack_fixed.py"}
PAIRS_PER_LANGUAGE = 6  # held-out answers per language, each judged as written and scaffolded


def readme_command(variant: str) -> list[str]:
    """The flags of the README's `./launch.sh experiments.run` line for the variant's config."""
    flag = f"--config={CONFIG_FILES[variant]}"
    [line] = [line for line in README.splitlines()
              if line.startswith("./launch.sh experiments.run ") and flag in line.split()]
    return shlex.split(line.split("#")[0])[2:]


def _config(variant: str):
    """The config the README's command runs, its paths made absolute and its GRPO step shrunk (2 questions x 4
    samples)."""
    flags = readme_command(variant)
    assert {f.split("=")[0] for f in flags} == {"--config", "--workdir"}  # no override the step below would skip
    config_file = next(f.split("=", 1)[1] for f in flags if f.startswith("--config="))
    config = importlib.import_module(f"configs.{Path(config_file).stem}").get_config()
    with config.unlocked():
        for section, key in (("data", "train"), ("data", "eval"), ("data", "sft"), ("data", "rubric"), ("data", "golden"),
                             ("model", "config_json"), ("model", "tokenizer"), ("judge", "checkpoint"), ("audit", "rubric")):
            if config[section][key]:  # empty: not used (the golden set)
                config[section][key] = str(ROOT / config[section][key])
        config.audit.judge.checkpoint = str(ROOT / config.audit.judge.checkpoint)
        config.rl.questions_per_step, config.rl.group_size, config.rl.max_new_tokens = 2, 4, 16
        config.rl.micro_batches = 1  # 8 rollouts over the 8 simulated devices
    return config


@pytest.mark.parametrize("variant", CONFIG_FILES)
def test_a_planted_hack_config_validates_and_points_at_its_rubric_and_judge(variant):
    config = _config(variant)
    settings.validate(config_boundary.experiment(config))
    rubric = load_rubric(config.data.rubric)
    assert rubric.dimension("clarity").kind == "llm" and "template" not in rubric.dimension_ids
    assert Path(config.judge.checkpoint).name == f"tiny_judge_{variant}"
    assert (Path(config.judge.checkpoint) / "model.safetensors").is_file()


def test_the_two_runs_differ_only_in_rubric_and_judge():
    """The fix is the only difference between the runs (same SFT, GRPO and monitor settings)."""
    hack, fixed = (traverse_util.flatten_dict(_config(variant).to_dict(), sep=".") for variant in CONFIG_FILES)
    assert {key for key in hack if hack[key] != fixed[key]} == {"data.rubric", "judge.checkpoint"}


@pytest.mark.parametrize("variant", CONFIG_FILES)
def test_one_grpo_step_scores_clarity_through_the_variants_judge(variant, tmp_path):
    config = _config(variant)
    config.reward.gates_first = False  # the random policy fails the format gate: judge every response anyway
    run_ = loop.build(config, tmp_path / "run")
    questions = run_.train_questions[:2]
    _, output = first_grpo_step(run_, questions, jax.random.key(0))
    row, samples = grpo_stage.grpo_row(output), output.samples
    llm_dims = sum(d.kind == "llm" for q in questions for d in run_.rubric_of[q.id].dimensions)
    assert row["judge_prompts"] >= 4 * llm_dims  # every response, every LLM dimension (clarity on all of them)
    assert row["judge_invalid"] <= 0.1 * row["judge_prompts"]
    assert sum(s["scores"]["clarity"] is not None for s in samples) >= 0.9 * len(samples)
    assert np.isfinite(row["reward/mean"]) and row["skipped"] == 0.0


def plain_and_scaffolded(variant: str) -> tuple[list, list]:
    """Clarity items of the variant's teacher on held-out answers that follow no template, and on the same answers
    scaffolded as firstly/secondly/finally (首先/其次/最后), PAIRS_PER_LANGUAGE per language."""
    heldout = {item.question for item in tiny_judge_data.judge_items(variant)[1]}
    _, clarity = tiny_judge_data.teachers(variant)
    plain, scaffolded = [], []
    for lang in ("en", "zh"):
        answers = [a for a in tiny_judge_data.base_answers() if a.question in heldout and a.topic.lang == lang
                   and not TemplatePhrases().matches([a.response])[0]][:PAIRS_PER_LANGUAGE]
        for answer in answers:
            plain.append((answer.question, answer.response))
            scaffolded.append((answer.question, build_tiny_assets.scaffolded(lang, answer.response)))
    return tuple(rule_items([q for q, _ in rows], [r for _, r in rows], [[clarity]] * len(rows))
                 for rows in (plain, scaffolded))


@pytest.mark.parametrize("variant", CONFIG_FILES)
def test_the_judge_prices_a_template_as_its_teacher_does(variant):
    """Scaffolding an answer raises the hack teacher's clarity by about two levels and caps the fixed teacher's at 3
    (RubricRL 6.1's negative anchors); the distilled judge (inference only, the prompt its report names) must do the
    same: +1 level or more (hack), or the scaffolded copies at 3 or below while answers as written still reach 4
    and 5 (fixed). A judge that answers a constant, as an untrained one does, fails both."""
    plain, scaffolded = plain_and_scaffolded(variant)
    teacher_plain, teacher_scaffolded = (np.asarray([i.score for i in items]) for items in (plain, scaffolded))
    judge = load_judge(str(ASSETS_DIR / build_tiny_judges.JUDGE_DIRS[variant]), sampler=build_tiny_judges.SAMPLER,
                       max_new_tokens=build_tiny_judges.MAX_NEW_TOKENS)
    measured = distill_judge.measure(judge, plain + scaffolded, jax.random.key(0),
                                     build_tiny_judges.TRAINING[variant].prompt)
    assert measured.counters["judge_invalid"] <= 0.1 * len(plain + scaffolded)
    student_plain, student_scaffolded = np.split(measured.student_N, 2)
    shift = np.nanmean(student_scaffolded - student_plain)
    if variant == "hack":
        assert np.mean(teacher_scaffolded - teacher_plain) >= 2.0  # the premise: scaffolding pays
        assert shift >= 1.0, (student_plain, student_scaffolded)
    else:
        assert (teacher_scaffolded == 3).all() and (teacher_plain >= 4).mean() >= 0.5  # the premise: a cap at 3
        assert (student_scaffolded <= 3).mean() >= 0.8 and (student_plain >= 4).mean() >= 0.25 and shift <= 0.0, (
            student_plain, student_scaffolded)

"""The planted-hack experiment's configs (RubricRL 6.1): both validate and point at shipped assets, and each runs
one GRPO step whose clarity scores come from its distilled judge."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny_hack, tiny_hack_fixed
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.train import loop, settings

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"hack": tiny_hack, "fixed": tiny_hack_fixed}


def _config(variant: str):
    """The variant's config with its paths made absolute and its GRPO step shrunk (2 questions x 4 samples)."""
    config = CONFIGS[variant].get_config()
    with config.unlocked():
        for section, key in (("data", "train"), ("data", "eval"), ("data", "sft"), ("data", "rubric"), ("data", "golden"),
                             ("model", "config_json"), ("model", "tokenizer"), ("judge", "checkpoint")):
            if config[section][key]:  # empty: not used (the golden set)
                config[section][key] = str(ROOT / config[section][key])
        config.rl.questions_per_step, config.rl.group_size, config.rl.max_new_tokens = 2, 4, 16
        config.rl.micro_batches = 1  # 8 rollouts over the 8 simulated devices
    return config


@pytest.mark.parametrize("variant", CONFIGS)
def test_a_planted_hack_config_validates_and_points_at_its_rubric_and_judge(variant):
    config = _config(variant)
    settings.validate(config)
    rubric = load_rubric(config.data.rubric)
    assert rubric.dimension("clarity").kind == "llm" and "template" not in rubric.dimension_ids
    assert Path(config.judge.checkpoint).name == f"tiny_judge_{variant}"
    assert (Path(config.judge.checkpoint) / "model.safetensors").is_file()


@pytest.mark.parametrize("variant", CONFIGS)
def test_one_grpo_step_scores_clarity_through_the_variants_judge(variant, tmp_path):
    run_ = loop.build(_config(variant), tmp_path / "run")
    state, _, programs = loop.grpo_components(run_, loop.initial_params(run_))
    questions = run_.train_questions[:2]
    reference = jax.tree.map(jnp.copy, state.params)  # the update donates the state's buffers
    _, output = loop.grpo_iteration(run_, programs, state, reference, questions, jax.random.key(0))
    row, samples = output.row(), output.samples
    llm_dims = sum(d.kind == "llm" for q in questions for d in run_.rubric_of[q.id].dimensions)
    assert row["judge_prompts"] >= 4 * llm_dims  # every response, every LLM dimension (clarity on all of them)
    assert sum(s["scores"]["clarity"] is not None for s in samples) >= 0.9 * len(samples)
    assert np.isfinite(row["reward/mean"]) and row["skipped"] == 0.0

"""The planted-hack experiment's configs (RubricRL 6.1): both parse and point at shipped assets, each runs one
GRPO step whose clarity scores come from its distilled judge, and the two judges price templates oppositely."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny_hack, tiny_hack_fixed
from rubric_jax.assets import tiny_judge_data
from rubric_jax.assets.build_tiny_assets import join_sentences, scaffold
from rubric_jax.judges.llm_judge import JudgeConfig, judge_rows, load_judge
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.train import loop

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"hack": tiny_hack, "fixed": tiny_hack_fixed}


def _config(variant: str):
    """The variant's config with its paths made absolute and its GRPO step shrunk (2 questions x 4 samples)."""
    config = CONFIGS[variant].get_config()
    with config.unlocked():
        for section, key in (("data", "train"), ("data", "eval"), ("data", "sft"), ("data", "rubric"),
                             ("model", "config_json"), ("model", "tokenizer"), ("judge", "checkpoint")):
            config[section][key] = str(ROOT / config[section][key])
        config.rl.questions_per_step, config.rl.group_size, config.rl.max_new_tokens = 2, 4, 16
        config.rl.micro_batches = 1  # 8 rollouts over the 8 simulated devices
    return config


@pytest.mark.parametrize("variant", CONFIGS)
def test_a_planted_hack_config_points_at_its_rubric_and_judge(variant):
    config = _config(variant)
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
    _, row, samples = loop.grpo_iteration(run_, programs, state, reference, questions, jax.random.key(0))
    llm_dims = sum(d.kind == "llm" for q in questions for d in run_.rubric_of[q.id].dimensions)
    assert row["judge_prompts"] >= 4 * llm_dims  # every response, every LLM dimension (clarity on all of them)
    assert sum(s["scores"]["clarity"] is not None for s in samples) >= 0.9 * len(samples)
    assert np.isfinite(row["reward/mean"]) and row["skipped"] == 0.0


def _clarity(variant: str, questions: list[str], responses: list[str]) -> np.ndarray:
    """Clarity levels [N] from the variant's judge on its own clarity dimension (greedy, one sample, NaN: none)."""
    config = _config(variant)
    judge = load_judge(config.judge.checkpoint, sampler=config.judge.sampler, max_new_tokens=config.judge.max_new_tokens)
    clarity = load_rubric(config.data.rubric).dimension("clarity")
    out = judge_rows([judge], JudgeConfig(mode="single", num_samples=1, max_retries=0), questions, responses,
                     [[clarity]] * len(responses), jax.random.key(0))
    return np.asarray([s[0] for s in out.scores], np.float64)


@pytest.mark.xfail(strict=True, reason="the shipped hack and fixed judges answer clarity 3 whatever the answer "
                   "(not yet distilled long enough; README, 'Distilling a judge')")
def test_the_hack_judge_pays_for_templates_and_the_fixed_judge_does_not():
    """The same held-out answers plain and scaffolded as firstly/secondly/finally: the hack judge scores the
    scaffolded ones higher; the fixed judge scores them no higher (its teacher caps a template at level 3)."""
    heldout_questions = {i.question for i in tiny_judge_data.judge_items("hack")[1]}
    answers = [a for a in tiny_judge_data.base_answers() if a.question in heldout_questions][:24]
    plain, templated = [], []
    for a in answers:
        think, body = tiny_judge_data.split_answer(a.response)
        parts = tiny_judge_data.sentences(body)
        plain.append(f"<think>{think}</think><answer>{join_sentences(a.topic.lang, parts)}</answer>")
        templated.append(f"<think>{think}</think><answer>{join_sentences(a.topic.lang, scaffold(a.topic.lang, parts))}"
                         "</answer>")
    questions = [a.question for a in answers]
    means = {variant: [float(np.nanmean(_clarity(variant, questions, r))) for r in (plain, templated)]
             for variant in CONFIGS}
    assert means["hack"][1] > means["hack"][0] + 0.5, means
    assert means["fixed"][1] <= means["fixed"][0], means

"""configs/qurl_ablation.py: every row of QuRL's ablation table resolves for every size with the settings that
define it, and each tiny row's README command trains one GRPO step on CPU (the reward-model row with a tiny
random classifier, the checklist row with a tiny random judge). The runs share one process, so the policy's
programs compile once."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from configs import qurl_ablation
from random_model import random_model, tiny_hf_dir
from rubric_jax import config_boundary, data, loader, sweeps
from rubric_jax.qurl.config import BuildConfig
from rubric_jax.train import grpo_stage, loop, settings as run_settings
from tests import manual

ROOT = Path(__file__).resolve().parents[2]
RUBRIC_ROWS = ("full", "no_filter", "no_references")


@pytest.mark.parametrize("size", qurl_ablation.SIZES)
@pytest.mark.parametrize("variant", qurl_ablation.VARIANTS)
def test_each_row_sets_what_defines_it(variant, size):
    c = qurl_ablation.get_config(f"variant={variant},size={size}")
    full = qurl_ablation.get_config(f"variant=full,size={size}")
    build = config_boundary.to_block(c.qurl, BuildConfig, "config.qurl")  # what experiments.build_rubrics accepts
    changed_qurl = {k for k in c.qurl.keys() if c.qurl[k] != full.qurl[k]}
    expected_qurl = {"no_filter": {"num_candidates", "min_support", "min_std", "min_spread"},
                     "no_references": {"top_k"}}.get(variant, set())
    assert changed_qurl == expected_qurl
    if variant == "no_filter":
        assert (build.num_candidates, build.min_support, build.min_std, build.min_spread) == (1, 1, 0.0, 0.0)
    if variant == "no_references":
        assert build.top_k == 0 and full.qurl.top_k > 0
    assert (c.reward.source == "reward_model") == (variant == "reward_model")
    if variant == "reward_model" and size == "tiny":  # no reward model ships: the command line names one
        with pytest.raises(ValueError, match="needs config.reward.model_checkpoint=DIR"):
            run_settings.reward_model_config(config_boundary.experiment(c).reward)
        c.reward.model_checkpoint = "RM_DIR"
    # the start-up check accepts every row
    reward_model = run_settings.reward_model_config(config_boundary.experiment(c).reward)
    assert (reward_model is None) == (variant != "reward_model")
    if size == "tiny":
        for path in (c.data.train, c.data.eval, c.data.rubric, c.data.sft):
            assert (ROOT / path).is_file(), path
    else:
        assert size.upper() in c.model.checkpoint.upper() and c.rl.group_size == 8 and c.rl.lr == 1e-6  # QuRL
    if variant == "checklist":
        assert c.data.rubric == qurl_ablation.CHECKLIST
    if variant in ("checklist", "reward_model"):  # the plain questions: no case-wise rubric on any row
        questions = data.load_questions(ROOT / c.data.train) if size == "tiny" else []
        assert all(q.replace_rubric is None and not q.extra_dimensions for q in questions)
    elif size != "tiny":
        assert c.data.train == f"runs/qurl_ablation/{size}/{variant}/rubrics/questions.jsonl"  # its own build


def test_unknown_variant_size_or_argument_is_named():
    for arg, match in (("variant=nofilter", "variant='nofilter'"), ("size=3b", "size='3b'"),
                       ("varient=full", "bad argument 'varient=full'")):
        with pytest.raises(ValueError, match=match):
            qurl_ablation.get_config(arg)


def test_the_checklist_rubric_has_five_generic_llm_dimensions():
    from rubric_jax.rubrics.io import load_rubric

    rubric = load_rubric(ROOT / qurl_ablation.CHECKLIST)
    assert len(rubric.dimensions) == 5 and all(d.kind == "llm" for d in rubric.dimensions)
    assert sum(d.weight for d in rubric.dimensions) == pytest.approx(1.0)


_RM = {"reward.source": "reward_model", "reward.model_checkpoint": "/rm", "judge.checkpoint": ""}  # no judge beside


@pytest.mark.parametrize(("changes", "match"), [
    ({"reward.source": "rm"}, r"reward.source='rm': expected one of \('rubric', 'reward_model'\)"),
    ({"reward.source": "reward_model"}, "needs config.reward.model_checkpoint=DIR"),
    ({"reward.model_checkpoint": "/rm"}, "source='rubric' never reads it"),
    ({"reward.source": "reward_model", "reward.model_checkpoint": "/rm", "judge.checkpoint": "/j"}, "drop the judge"),
    ({**_RM, "rl.dynamic_weights": True}, "dynamic_weights"),
    ({**_RM, "data.rubric_correction": "c.yaml"}, "rubric_correction"),
    ({**_RM, "reward.model_scale": -1.0}, "reward.model_scale=-1.0"),
])
def test_bad_reward_settings_fail_before_anything_loads(changes, match):
    c = qurl_ablation.get_config("variant=full,size=tiny")
    for key, value in changes.items():
        block, field = key.split(".")
        c[block][field] = value
    with pytest.raises(ValueError, match=match):
        run_settings.reward_model_config(config_boundary.experiment(c).reward)


def readme_tiny_commands() -> list[str]:
    """The README's `experiments.run` lines for the tiny rows of configs/qurl_ablation.py."""
    text = manual.text().replace("\\\n", " ")
    return [" ".join(line.split()) for line in text.splitlines()
            if "experiments.run --config=configs/qurl_ablation.py:" in line and "size=tiny" in line]


# Rollouts of 4 questions x 2 samples with 8-token answers; beta 0 (no reference model) keeps it to one update.
_SHRINK = {"rl.questions_per_step": 4, "rl.group_size": 2, "rl.micro_batches": 1, "rl.max_new_tokens": 8,
           "rl.beta": 0.0}


def test_every_tiny_row_trains_one_grpo_step_on_cpu(tmp_path):
    """Each README line's config, built as experiments.run builds it (reward source, judge or reward model
    loaded), then one GRPO step: rollouts -> that row's reward -> group advantages -> a jitted update. The
    policy state and its compiled update carry from row to row (same model and shapes); the loop around a
    step (evals, checkpoints, resume) is tests/train/test_loop.py's."""
    commands = readme_tiny_commands()
    variants = [re.search(r"variant=(\w+)", cmd).group(1) for cmd in commands]
    assert sorted(variants) == sorted(qurl_ablation.VARIANTS)
    # The judge reads prompts of ~900 tiny tokens (rubric dimension, anchors, fenced answer): a longer context.
    places = {"JUDGE_DIR": str(tiny_hf_dir(tmp_path / "judge", num_layers=1, seed=1, max_position_embeddings=2048)),
              "RM_DIR": str(tiny_hf_dir(tmp_path / "rm", num_labels=1, num_layers=1, seed=2))}
    state = update = None
    for step, (variant, command) in enumerate(zip(variants, commands), start=1):
        for name, path in places.items():
            command = command.replace(name, path)
        flags = command.split()[2:]  # after "./launch.sh experiments.run", as launch.sh passes them
        config = sweeps._resolve(flags[0].removeprefix("--config="), [f for f in flags[1:] if f.startswith("--config.")],
                                 variant)
        for key, value in _SHRINK.items():
            block, field = key.split(".")
            config[block][field] = value
        experiment = loop.build(config, tmp_path / variant)
        with contextlib.closing(experiment.log):
            if update is None:  # host-drawn random policy (no init program to compile), placed explicitly
                lay = experiment.layouts
                _, random_state = random_model(lay.model, std=0.02)
                params = jax.device_put(nnx.to_pure_dict(random_state), loader.expected_shardings(lay.model, lay.training))
                update = experiment.programs.grpo
                state = experiment.programs.grpo_state.init(params)
            questions = experiment.train_questions[:4]
            state, out = grpo_stage.grpo_iteration(experiment, update, state, None, questions, jax.random.key(step))
            row = grpo_stage.grpo_row(out)
        assert int(state.step) == step and np.isfinite(row["loss"]), variant
        dims = {k.removeprefix("reward/") for k in row if k.startswith("reward/") and k != "reward/mean"}
        if variant in RUBRIC_ROWS:
            assert {"format", "length", "topic_keyword"} <= dims, dims  # the tiny case-wise rule criteria
            assert 0.0 <= row["reward/mean"] <= 1.0
        elif variant == "checklist":
            assert dims == {"relevance", "accuracy", "depth", "structure", "language"}
            assert row["judge_prompts"] == 8 * 5 and row["judge_prompt_too_long"] == 0  # every rollout x dimension
        else:
            assert dims == {"reward_model"} and row["reward_not_ok"] == 0 and 0.0 < row["reward/mean"] < 1.0

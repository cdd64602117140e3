"""Judging overlapped with sampling (rl.rollout_chunks; train/overlap.py, train/collect.py): the settings' checks, the
hidden judge time's arithmetic, and GRPO iterations of the tiny default sampled in chunks that give the one-call
iteration's tokens, rewards, advantages and batch on the same key."""

import dataclasses
import re
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

from configs import tiny
from first_grpo_step import first_grpo_step
from rubric_jax import config_boundary
from rubric_jax.train import grpo_stage, loop, overlap, programs as run_programs, settings
from tiny_config import absolute_tiny_config

EXACT = ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask", "loss_mask", "advantages")


def test_settings_are_checked_and_off_by_default():
    assert settings.validate(config_boundary.experiment(tiny.get_config())).config.rl.rollout_chunks == 1
    for chunks, why in ((3, "must divide rl.questions_per_step=8: a chunk holds whole groups"),
                        (0, "expected an integer >= 1")):
        config = tiny.get_config()
        with config.unlocked():
            config.rl.rollout_chunks = chunks
        with pytest.raises(ValueError, match=re.escape(f"config.rl.rollout_chunks={chunks}: {why}")):
            settings.validate(config_boundary.experiment(config))


def test_a_chunk_padded_to_the_rollout_shards_and_several_processes_are_refused(tmp_path, monkeypatch):
    config = absolute_tiny_config()
    with config.unlocked():
        config.rl.rollout_chunks = 2  # 4 questions per chunk over the 8 simulated devices
    with pytest.raises(ValueError, match=re.escape("config.rl.rollout_chunks=2: a chunk of 4 questions must split "
                                                   "evenly over the rollout's 8 batch shards")):
        loop.build(config, tmp_path / "run")
    with config.unlocked():
        config.rl.questions_per_step = 16
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match=re.escape("config.rl.rollout_chunks=2: chunked rollouts run on one process, "
                                                   "this job has 2; set config.rl.rollout_chunks=1")):
        loop.build(config, tmp_path / "run")


def test_hidden_judge_time_is_the_judging_before_the_next_chunk_was_ready():
    judged = [(1.0, 3.0), (4.0, 5.0), (6.0, 9.0)]
    # Chunk 1 was ready at 2.5 (0.5 s of chunk 0's 2 s judging was not hidden), chunk 2 at 7 (after chunk 1's
    # judging: all of its 1 s hidden); the last chunk's judging has nothing left to hide behind.
    assert overlap.hidden_seconds(judged, [0.5, 2.5, 7.0]) == pytest.approx(1.5 + 1.0)
    assert overlap.hidden_seconds(judged[:1], [0.5]) == 0.0
    timing = overlap.Timing(judge_s=4.0, hidden_s=1.0, rollout_s=6.0) + overlap.Timing(2.0, 2.0, 3.0)
    assert timing.metrics() == {"overlap/judge_s": 6.0, "overlap/judge_hidden_s": 3.0,
                                "overlap/judge_hidden_frac": 0.5, "overlap/rollout_s": 9.0}


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """The tiny default (its greedy tiny LLM judge in process) with 16 questions of 2 samples per step (2 chunks of 8
    questions split over the 8 simulated devices) and a rubric whose rewards vary on the random policy's text: no
    gate, every dimension reading the whole response, a length criterion and an LLM-judged one instead of the
    template phrases."""
    directory = tmp_path_factory.mktemp("overlap")
    config = absolute_tiny_config()
    with config.unlocked():
        config.data.rubric = varied_rubric(config.data.rubric, directory)
        config.data.golden = ""  # its labels name 'template'
        config.rl.questions_per_step, config.rl.group_size, config.rl.max_new_tokens = 16, 2, 12
        config.rl.micro_batches = 1
    return loop.build(config, directory / "run")


def varied_rubric(tiny_rubric: str, directory: Path) -> str:
    """The tiny default's rubric (its file `tiny_rubric`) made to vary on the random policy's text, written to
    `directory`: no gate, every dimension reading the whole response, a length criterion and an LLM-judged one
    instead of the template phrases."""
    rubric = yaml.safe_load(Path(tiny_rubric).read_text())
    rubric["dimensions"] = [d for d in rubric["dimensions"] if d["id"] != "template"]  # at most 7 with the rows' own
    for dimension in rubric["dimensions"]:
        dimension.update(gate=False, reads="response")
    binary = {"kind": "binary"}
    rubric["dimensions"] += [
        {"id": "brevity", "description": "At most 4 words.", "kind": "rule", "scale": binary, "reads": "response",
         "anchors": {"0": "16 words or more.", "1": "4 words or fewer."}, "rule": "length",
         "params": {"min": 1, "max": 4, "unit": "words"}},
        {"id": "courtesy", "description": "The response thanks or apologises (thank you / sorry).", "kind": "llm",
         "scale": binary, "reads": "response", "anchors": {"0": "No thanks or apology.", "1": "Thanks or apologises."}}]
    (directory / "rubric.yaml").write_text(yaml.safe_dump(rubric))
    return str(directory / "rubric.yaml")


def _iteration(exp, chunks, monkeypatch, questions, *draw, recompute_old_logprobs=False, **changes):
    """(the metrics row, the batch the update trained on, the state after it) of a first GRPO iteration sampled in
    `chunks` calls (`changes`: other Settings fields)."""
    config = exp.settings.config
    config = dataclasses.replace(config, rl=dataclasses.replace(config.rl, rollout_chunks=chunks,
                                                                recompute_old_logprobs=recompute_old_logprobs))
    exp = dataclasses.replace(exp, settings=dataclasses.replace(exp.settings, config=config, **changes))
    batches = []
    logprobs = run_programs.rollout_logprobs
    monkeypatch.setattr(run_programs, "rollout_logprobs",
                        lambda *a, **k: batches.append(logprobs(*a, **k)) or batches[-1])
    state, out = first_grpo_step(exp, questions, jax.random.key(5), *draw)
    monkeypatch.undo()
    return grpo_stage.grpo_row(out), jax.tree.map(np.asarray, batches[0][0]), state


def _same_rewards(one, two):
    for key in ("reward/mean", "zero_std_frac", "reward/brevity", "reward/courtesy", "judge_prompts"):
        assert one[key] == two[key], key


def test_chunked_rollouts_give_the_one_call_tokens_rewards_and_batch(experiment, monkeypatch):
    """Chunk 1 draws the noise of rows 16.. of the one call (sampling.sample's row_offset) and the judges score each
    chunk with the step's key: every array of the batch but the sampler's log-probs is equal; those come from
    differently shaped programs (float rounding). Recomputed teacher-forced (rl.recompute_old_logprobs) from the
    same batch, the update is bit for bit the one call's."""
    questions = experiment.train_questions[:16]
    one_row, one_batch, _ = _iteration(experiment, 1, monkeypatch, questions)
    two_row, two_batch, _ = _iteration(experiment, 2, monkeypatch, questions)
    assert not any(k.startswith("overlap/") for k in one_row)
    _same_rewards(one_row, two_row)
    assert one_row["zero_std_frac"] < 1  # the rewards vary within groups: a reordered or redrawn chunk would show
    for key in EXACT:
        np.testing.assert_array_equal(two_batch[key], one_batch[key], err_msg=key)
    np.testing.assert_allclose(two_batch["old_logp"], one_batch["old_logp"], rtol=0, atol=4e-6)
    assert two_row["judge_generate_calls"] > one_row["judge_generate_calls"]  # each chunk judged on its own
    assert 0 <= two_row["overlap/judge_hidden_s"] <= two_row["overlap/judge_s"] < two_row["overlap/rollout_s"]
    assert two_row["overlap/judge_hidden_frac"] == pytest.approx(
        two_row["overlap/judge_hidden_s"] / two_row["overlap/judge_s"])

    _, one_exact, one_state = _iteration(experiment, 1, monkeypatch, questions, recompute_old_logprobs=True)
    _, two_exact, two_state = _iteration(experiment, 2, monkeypatch, questions, recompute_old_logprobs=True)
    for key in one_exact:
        np.testing.assert_array_equal(two_exact[key], one_exact[key], err_msg=key)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(two_state.params), jax.device_get(one_state.params))


def test_dynamic_sampling_rounds_are_chunked_alike(experiment, monkeypatch):
    """Every round of DAPO's dynamic sampling sampled in 2 chunks: the same rounds, kept groups and batch."""
    from rubric_jax.train import dynamic

    rule = dynamic.DynamicSampling(min_spread=0.05, max_rounds=1)
    rows = {}
    for chunks in (1, 2):
        extra = iter([experiment.train_questions[16:32]])
        rows[chunks], batch, _ = _iteration(experiment, chunks, monkeypatch, experiment.train_questions[:16],
                                            lambda: next(extra), dynamic_sampling=rule)
        rows[chunks]["batch"] = batch
    one, two = rows[1], rows[2]
    assert one["dynamic/rounds"] == two["dynamic/rounds"] == 2.0
    assert one["dynamic/kept_groups"] == two["dynamic/kept_groups"]
    _same_rewards(one, two)
    for key in EXACT:
        np.testing.assert_array_equal(two["batch"][key], one["batch"][key], err_msg=key)

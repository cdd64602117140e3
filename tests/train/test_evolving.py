"""Evolving rubrics (rl.rubric_refresh_every, train/evolving.py): the start-up checks, which groups give the pairs, a
refresh against a scripted proposer and judge (hostile and malformed proposals counted and dropped, duplicates and
flat criteria filtered, a new version and hash, the training questions' rubrics following it), the retirement of a
planted saturating criterion through the monitors' own saturation, and the checkpointed state."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import tiny
from qurl_scripted import ScriptedGenerator, fenced
from rubric_jax import config_boundary, data
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import rubric_from_dict, rubric_to_dict
from rubric_jax.train import blocks, checkpointing, evolving, grpo_stage, monitors, settings
from rubric_jax.train.runner import TrainingError
from tiny_config import absolute_tiny_config

ROOT = Path(__file__).resolve().parents[2]
RUBRIC = load_rubric(ROOT / "rubric_jax/assets/tiny/rubric.yaml")


def _validate(**values):
    config = tiny.get_config()
    with config.unlocked():
        for key, value in values.items():
            block, field = key.split(".")
            config[block][field] = value
    return settings.validate(config_boundary.experiment(config))


def test_off_by_default_and_every_value_checked_at_start_up():
    assert tiny.get_config().rl.rubric_refresh_every == 0 == blocks.RLBlock().rubric_refresh_every
    assert _validate(**{"rl.rubric_refresh_every": 5}).config.rl.rubric_refresh_every == 5  # the tiny judge writes
    for values, message in (
            ({"rl.rubric_refresh_every": -1}, "config.rl.rubric_refresh_every=-1"),
            ({"rl.rubric_refresh_every": 2, "rl.rubric_refresh_pairs": 8},
             "config.rl.rubric_refresh_pairs=8: must be below rl.questions_per_step=8"),
            ({"rl.rubric_refresh_every": 2, "judge.checkpoint": ""},
             "config.rl.rubric_refresh_every=2: the judge's LLM writes the new criteria"),
            ({"rl.rubric_refresh_every": 2, "rl.dynamic_weights": True},
             "config.rl.rubric_refresh_every=2: not with rl.dynamic_weights=True"),
            ({"rl.rubric_refresh_every": 2, "rl.off_policy_steps": 1, "rl.recompute_old_logprobs": True},
             "config.rl.rubric_refresh_every=2: not with rl.off_policy_steps=1"),
            ({"rl.rubric_retire_saturation": 1.5}, "config.rl.rubric_retire_saturation=1.5")):
        with pytest.raises(ValueError, match=re.escape(message)):
            _validate(**values)
    with pytest.raises(ValueError, match="the rubric refresh runs on one process, this job has 2"):
        evolving.check_start(RUBRIC, "r.yaml", 2)
    points = rubric_from_dict({**rubric_to_dict(RUBRIC), "aggregation": {"method": "healthbench_points", "params": {}},
                               "dimensions": [{"id": "c", "description": "A criterion.", "kind": "rule",
                                               "rule": "format", "reads": "response", "scale": {"kind": "points", "points": 2},
                                               "anchors": {"0": {"description": "no"}, "1": {"description": "yes"}}}]})
    with pytest.raises(ValueError, match=re.escape("r.yaml: rl.rubric_refresh_every adds ungrouped integer-scale "
                                                   "criteria; rubric 'tiny_default' aggregates with "
                                                   "'healthbench_points'")):
        evolving.check_start(points, "r.yaml", 1)
    evolving.check_start(RUBRIC, "r.yaml", 1)


def test_an_eval_question_sharing_a_training_id_is_refused_at_start_up(tmp_path):
    """A question's rubric is found by its id, so an eval question with a training question's id would be scored with
    the evolved criteria: refused in one line naming the id and both sources (here the same file), before any model
    or judge loads; ids of their own pass."""
    from rubric_jax.train import loop

    train = [data.Question(f"q{i}", "?", "t", "en", source=f"train.jsonl:{i + 1}") for i in range(3)]
    held = [data.Question("e0", "?", "t", "en", source="eval.jsonl:1")]
    evolving.check_held_out(train, held)
    with pytest.raises(ValueError, match=re.escape(
            "question id 'q2' is an eval question (eval.jsonl:2) and a training question (train.jsonl:3) "
            "(and 1 more); a question's rubric is found by its id")):
        evolving.check_held_out(train, held + [data.Question(i, "?", "t", "en", source=f"eval.jsonl:{n}")
                                               for n, i in ((2, "q2"), (3, "q0"))])
    config = absolute_tiny_config()
    with config.unlocked():
        config.rl.rubric_refresh_every, config.data.eval = 2, config.data.train
    with pytest.raises(ValueError, match=r"^config.rl.rubric_refresh_every: question id 'cs-en-00-0' is an eval "
                                         r"question \(\S+questions_train.jsonl:1\) and a training question "
                                         r"\(\S+questions_train.jsonl:1\) \(and 31 more\)"):
        loop.build(config, tmp_path / "run")


# ------------------------------------------------------------------------------------------------ a refresh
def _criterion(cid: str, description: str, points: int = 2, **changes) -> dict:
    levels = {str(i): f"level {i} of {cid}" for i in range(min(points, 5) + 1)}
    return {"id": cid, "description": description, "points": points, "levels": levels, "good_example": "good",
            "bad_example": "bad", "cites": [], **changes}


PROPOSALS = [
    '{"criteria": [',  # cut off: not one JSON object
    json.dumps({"criteria": [_criterion("huge", "Gives a weight past every bound.", points=10**9,
                                        levels={"0": "none", "1": "all"})]}),
    json.dumps({"criteria": [_criterion("ok\nid", "An id with a line break in it.")]}),
    json.dumps({"criteria": [_criterion("format", "Reuses the format gate's id.")]}),
    json.dumps({"criteria": [_criterion("flat", "Every answer meets this one equally.")]}),
    json.dumps({"criteria": [_criterion("names_a_source", "The answer names where its facts come from.")]}),
]


def _scripted_reward(score_of):
    """A reward double: each row's rubric has one dimension, scored `score_of(dimension id, response)` in [0, 1]."""

    def reward(questions, responses, rubrics, *, key=None, weights=None):
        del questions, key, weights
        ids = list(dict.fromkeys(d for r in rubrics for d in r.dimension_ids))
        scores = np.full((len(responses), len(ids)), np.nan)
        for i, (response, rubric) in enumerate(zip(responses, rubrics)):
            for d in rubric.dimension_ids:
                scores[i, ids.index(d)] = score_of(d, response)
        valid = ~np.isnan(scores)
        reward_N = np.nanmean(scores, axis=1).astype(np.float32)
        return RewardOutput(scores, valid, reward_N, ids, {"reward_ok": valid.any(axis=1), "judge_invalid": 0,
                                                           "judge_prompts": int(valid.sum())})

    return reward


def _hashed(dim_id, response):
    """Criteria other than `flat` score an answer by a hash of it (so they spread); `flat` gives everyone 0.5."""
    return 0.5 if dim_id == "flat" else zlib.crc32(f"{dim_id}|{response}".encode()) % 3 / 2


def _questions():
    return [data.Question(f"q{i}", f"Question {i}?", "test", "en") for i in range(4)]


def _refresher(tmp_path, reply, rl=None, score_of=_hashed):
    questions = _questions()
    rubric_of = {q.id: RUBRIC for q in questions + [data.Question("e0", "Held out?", "test", "en")]}
    rl = rl or blocks.RLBlock(questions_per_step=4, rubric_refresh_every=2, rubric_refresh_pairs=2,
                              rubric_refresh_max_new=2)
    qurl = blocks.BuildConfig(num_candidates=len(PROPOSALS), max_retries=0, min_valid_answers=3)
    generator = ScriptedGenerator(reply)
    refresher = evolving.build_refresher(rl, qurl, generator, _scripted_reward(score_of), questions, rubric_of,
                                         RUBRIC, tmp_path, jax.random.key(0))
    refresher.restore(None)
    return refresher, generator


def _step(n=4):
    """A step of 4 questions x n answers: groups 0 and 2 spread widest (the pairs), 1 and 3 are held out."""
    questions = [f"Question {g}?" for g in range(4) for _ in range(n)]
    responses = [f"<answer>answer {g}.{i} </answer>" for g in range(4) for i in range(n)]
    reward = np.array([0.1, 0.9, 0.5, 0.5, 0.4, 0.5, 0.5, 0.5, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.6])
    return questions, responses, reward, np.ones(len(reward), bool)


def test_a_refresh_keeps_what_discriminates_and_counts_and_drops_the_rest(tmp_path):
    refresher, generator = _refresher(tmp_path, lambda text, j, call, key: PROPOSALS[j])
    questions, responses, reward, ok = _step()
    row = refresher.refresh(2, questions, responses, reward, ok, 4, {})
    # Two malformed replies and a hostile one are counted, never raised; the duplicate id and the flat one filtered.
    assert row["rubric/refresh/proposals"] == 6 and row["rubric/refresh/invalid"] == 3
    assert row["rubric/refresh/duplicate"] == 1 and row["rubric/refresh/not_discriminating"] == 1
    assert row["rubric/refresh/kept"] == 1 and row["rubric/added"] == ["names_a_source"] and row["rubric/retired"] == []
    new = refresher.state.rubric
    assert row["rubric/version"] == new.version == "1.3.0" and row["rubric/hash"] == new.content_hash
    assert new.content_hash != RUBRIC.content_hash and new.dimension_ids == RUBRIC.dimension_ids + ["names_a_source"]
    assert new.dimensions[-1].weight == 2.0 and "step 2: added ['names_a_source']" in new.changelog[-1].change
    # The training questions' rubrics follow the new version; the held-out one keeps the starting rubric.
    assert all(refresher.rubric_of[f"q{i}"] is new for i in range(4)) and refresher.rubric_of["e0"] is RUBRIC
    assert json.loads((tmp_path / "rubric_versions" / "1.3.0.json").read_text())["version"] == "1.3.0"
    # The proposer saw the two widest groups' best and worst answers, fenced, and the rubric's criteria.
    (prompt,) = generator.calls[0]["prompts"]
    assert fenced(prompt, "better") == ["answer 0.1", "answer 2.1"]
    assert fenced(prompt, "worse") == ["answer 0.0", "answer 2.0"]
    assert "- format: " in prompt and len(generator.calls) == 1 and generator.calls[0]["n"] == 6
    assert refresher.state.versions[-1] == {"version": "1.3.0", "hash": new.content_hash, "step": 2,
                                            "added": ["names_a_source"], "retired": []}


def test_nothing_to_compare_leaves_the_rubric_as_it_is(tmp_path):
    refresher, generator = _refresher(tmp_path, lambda text, j, call, key: PROPOSALS[-1])
    questions, responses, _, ok = _step()
    row = refresher.refresh(2, questions, responses, np.full(16, 0.5), ok, 4, {})
    assert generator.calls == [] and row["rubric/added"] == [] and row["rubric/refresh/proposals"] == 0
    assert row["rubric/version"] == "1.2.0" and len(refresher.state.versions) == 1


def test_a_planted_saturating_criterion_retires_and_the_starting_rubric_never_does(tmp_path):
    """`planted` (added by an earlier refresh) scores the top level on every answer of the step, as do the starting
    rubric's penalties; the monitors' saturation (monitors.step_monitors) reads 1 for all of them: only `planted`
    retires. No proposal is valid, so the new version is the retirement alone."""
    refresher, _ = _refresher(tmp_path, lambda text, j, call, key: "no JSON here")
    questions, responses, reward, ok = _step()
    planted = evolving.construction.parse_candidate(
        json.dumps({"criteria": [_criterion("planted", "Mentions the question at all.")]}), name="p",
        changelog=RUBRIC.changelog[-1], num_references=0, min_criteria=1, max_criteria=1, max_points=2)
    refresher.state.next_version(2, planted.rubric.dimensions, [], "planted by the test")
    scored = _scripted_reward(lambda d, r: 1.0)(questions, responses, [refresher.state.rubric] * 16)
    watched = monitors.step_monitors(responses, np.full(16, 8), scored)
    assert watched["monitor/saturation/planted"] == 1.0 == watched["monitor/saturation/redundancy"]
    row = refresher.refresh(4, questions, responses, reward, ok, 4, watched)
    assert row["rubric/retired"] == ["planted"] and row["rubric/added"] == [] and row["rubric/refresh/invalid"] == 6
    assert refresher.state.rubric.dimension_ids == RUBRIC.dimension_ids and row["rubric/version"] == "1.4.0"
    assert refresher.state.evolved == [] and refresher.state.rubric.content_hash == RUBRIC.content_hash
    assert [v["version"] for v in refresher.state.versions] == ["1.2.0", "1.3.0", "1.4.0"]
    # Below the threshold (or NaN: no valid score) it stays.
    refresher.state.next_version(6, planted.rubric.dimensions, [], "planted again")
    for value in (0.9, float("nan")):
        assert refresher.refresh(8, questions, responses, reward, ok, 4,
                                 {"monitor/saturation/planted": value})["rubric/retired"] == []


def test_the_state_round_trips_through_a_checkpoint_and_is_refused_without_the_option(tmp_path):
    refresher, _ = _refresher(tmp_path, lambda text, j, call, key: PROPOSALS[-1])
    refresher.refresh(2, *_step(), 4, {})
    saved = json.loads(json.dumps(refresher.state.to_json()))  # what the checkpoint's metadata holds
    resumed, _ = _refresher(tmp_path, lambda text, j, call, key: PROPOSALS[-1])
    resumed.restore(saved)
    assert resumed.state == refresher.state and resumed.rubric_of["q0"].content_hash == refresher.state.rubric.content_hash
    restored = checkpointing.Restored(None, {}, "", {"rubric_evolution": saved})
    with pytest.raises(TrainingError, match=re.escape("config.rl.rubric_refresh_every=0: the GRPO checkpoint was "
                                                      "written by a run whose rubric evolved to version 1.3.0")):
        grpo_stage._restore_rubric(None, restored)
    grpo_stage._restore_rubric(None, checkpointing.Restored(None, {}, "", {}))  # a run without it resumes as before

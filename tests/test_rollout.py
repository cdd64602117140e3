"""Rollouts -> GRPO batch layout, response decoding and reward summaries (hand-made inputs)."""

import numpy as np

from rubric_jax.judges.reward import RewardOutput
from rubric_jax.sampling import GenerationResult
from rubric_jax.train import rollout


def _result() -> GenerationResult:
    # Two questions x two samples; max_new_tokens 4; sample 1 stops after 2 tokens (eos = 2).
    tokens = np.array([[5, 6, 7, 8], [9, 2, 0, 0], [4, 4, 2, 0], [3, 2, 0, 0]], np.int32)
    logprobs = np.array([[-.1, -.2, -.3, -.4], [-.5, -.6, 0, 0], [-.7, -.8, -.9, 0], [-1., -1.1, 0, 0]], np.float32)
    return GenerationResult(tokens, logprobs, np.array([4, 2, 3, 2], np.int32),
                            np.array(["length", "stop", "stop", "stop"]), num_steps=4)


def test_training_batch_layout_and_invalid_samples():
    prompt_ids = np.array([[0, 11, 12], [13, 14, 15]], np.int32)
    prompt_mask = np.array([[False, True, True], [True, True, True]])
    adv = np.array([1., -1., .5, -.5], np.float32)
    valid = np.array([True, True, False, True])
    batch = rollout.training_batch(prompt_ids, prompt_mask, _result(), 2, adv, valid, (4, 8))
    assert batch["tokens"].shape == (4, 3 + 4)  # the smallest bucket that holds the longest response
    np.testing.assert_array_equal(batch["tokens"][1], [0, 11, 12, 9, 2, 0, 0])
    np.testing.assert_array_equal(batch["tokens"][2], [13, 14, 15, 4, 4, 2, 0])
    np.testing.assert_array_equal(batch["input_mask"][0], [False, True, True, True, True, True, True])
    np.testing.assert_array_equal(batch["input_mask"][1], [False, True, True, True, True, False, False])
    np.testing.assert_array_equal(batch["loss_mask"][1], [False, False, False, True, True, False, False])
    assert not batch["loss_mask"][2].any()  # missing reward: no loss tokens at all
    np.testing.assert_allclose(batch["old_logp"][3], [0, 0, 0, -1., -1.1, 0, 0])
    np.testing.assert_array_equal(batch["advantages"], adv)


class _Tokenizer:
    def decode(self, ids, skip_special_tokens):
        assert not skip_special_tokens  # <think>/<answer> must survive for the rules
        return " ".join(map(str, ids))


def test_decode_drops_only_the_stop_token():
    texts = rollout.decode_responses(_Tokenizer(), _result(), stop_tokens=(2,))
    assert texts == ["5 6 7 8", "9", "4 4", "3"]


def test_reward_summary_leaves_missing_scores_out():
    scores = np.array([[1.0, np.nan], [0.0, 0.5], [1.0, 1.0]])
    valid = ~np.isnan(scores)
    out = RewardOutput(scores, valid, np.array([0.0, 0.25, 1.0]), ["a", "b"],
                       {"reward_ok": np.array([False, True, True]), "num_failed_scores": 1, "num_not_ok": 1})
    summary = rollout.summarize_rewards(out)
    assert summary.reward_mean == 0.625  # the not-ok row is left out, not averaged as 0
    assert summary.dimension_means == {"a": 2 / 3, "b": 0.75}
    assert rollout.reward_metrics(summary, "eval/") == {
        "eval/reward/a": 2 / 3, "eval/reward/b": 0.75, "eval/reward_failed_scores": 1, "eval/reward_not_ok": 1}

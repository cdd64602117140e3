"""RewardModelReward: the scalar reward model as a reward source with RubricReward's call and output. Its
batched, padded, chunked, mesh-sharded scores equal an unbatched single-device forward of each chat; rows that
do not fit score the minimum and are counted; bad checkpoints and settings are named."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from random_model import tiny_hf_dir
from rubric_jax import grpo, loader, padding, sharding
from rubric_jax.judges.reward_model import (DIMENSION, RewardModelConfig, RewardModelReward, load_reward_model,
                                            reward_model_logits)
from rubric_jax.models.transformer import causal_padding_mask

QUESTIONS = ["How do I get a refund?", "Why is the sky blue?", "Say hi.", "How do I reset my password?"]
RESPONSES = ["<think>policy</think><answer>Thank you! Open the order page and ask for a refund.</answer>",
             "<answer>Rayleigh scattering.</answer>", "hi", "<think>steps</think><answer>" + "Click reset. " * 12 +
             "</answer>"]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("rm") / "rm", num_labels=1, num_layers=1, std=0.2, seed=3)


@pytest.fixture(scope="module")
def layout8():
    """The decode layout over 8 devices: pairs split each weight (tensor 2), four replicas split the rows."""
    return sharding.decode_layout(sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=-1, tensor=1)), 2)


@pytest.fixture(scope="module")
def model8(rm_dir, layout8):
    return load_reward_model(rm_dir, layout=layout8)


@functools.partial(jax.jit, static_argnums=0)
def _left_padded_last_position(graphdef, params, tokens_BxT, input_mask_BxT):
    """score(final-norm hidden state at the LAST position) of left-padded rows: another padding side and no
    pad-id search, so it checks the scorer's right padding, positions and pooled token."""
    model = nnx.merge(graphdef, params)
    positions_BxT = jnp.maximum(jnp.cumsum(input_mask_BxT, axis=1) - 1, 0)
    h_BxTxD, _ = model.hidden_states(tokens_BxT, positions_BxT, causal_padding_mask(input_mask_BxT))
    return h_BxTxD[:, -1] @ params["score"]["kernel"][:, 0]


def unbatched_logits(model, token_ids) -> np.ndarray:
    """The reference logits: all chats in one left-padded batch on one device."""
    tokens, mask = padding.pad_left(token_ids, model.cfg.pad_token_id, [128])
    params = jax.device_put(model.weights.params, jax.devices()[0])
    graphdef = loader.abstract_weights(model.cfg).graphdef  # one device: no layout's activation constraints
    return np.asarray(_left_padded_last_position(graphdef, params, jnp.asarray(tokens), jnp.asarray(mask)))


def test_scores_equal_an_unbatched_forward_of_each_chat_and_are_sigmoids(model8):
    reward = RewardModelReward(model8, RewardModelConfig(max_len=128, batch_size=64))
    out = reward(QUESTIONS, RESPONSES, [None] * 4)
    token_ids = reward.encode(QUESTIONS, RESPONSES)
    expected_logits = unbatched_logits(model8, token_ids)
    raw = out.details["raw_scores"][:, 0]
    np.testing.assert_allclose(raw, expected_logits, rtol=1e-5, atol=1e-5)
    assert np.ptp(raw) > 1e-3  # distinct rows score differently: a wrong pooled token would show
    np.testing.assert_allclose(out.reward, 1 / (1 + np.exp(-expected_logits)), rtol=1e-5)
    assert out.dimension_ids == [DIMENSION] and out.scores.shape == out.valid.shape == (4, 1)
    np.testing.assert_allclose(out.scores[:, 0], out.reward, rtol=1e-6)
    assert out.valid.all() and out.details["reward_ok"].all() and out.details["num_not_ok"] == 0
    # The chat is [user: question, assistant: response] closed by the template, with no generation prompt.
    text = model8.tokenizer.decode(token_ids[0])
    assert text.endswith(f"<|im_start|>assistant\n{RESPONSES[0]}<|im_end|>\n") and QUESTIONS[0] in text


def test_chunks_center_scale_and_one_device_change_nothing(model8, rm_dir):
    token_ids = RewardModelReward(model8, RewardModelConfig(max_len=128)).encode(QUESTIONS, RESPONSES)
    whole = reward_model_logits(model8, token_ids, RewardModelConfig(max_len=128))
    chunked = reward_model_logits(model8, token_ids, RewardModelConfig(max_len=128, batch_size=3))
    single = load_reward_model(rm_dir, layout=sharding.single_device_layout())
    one_device = reward_model_logits(single, token_ids, RewardModelConfig(max_len=128, batch_size=3))
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(one_device, whole, rtol=1e-5, atol=1e-5)
    shifted = RewardModelReward(model8, RewardModelConfig(max_len=128, center=0.5, scale=2.0))
    out = shifted(QUESTIONS, RESPONSES, [None] * 4)
    np.testing.assert_allclose(out.reward, 1 / (1 + np.exp(-(whole - 0.5) / 2.0)), rtol=1e-5)


def test_a_chat_longer_than_max_len_scores_the_minimum_and_is_counted(model8):
    """Issue 38 (R1 for the reward model): a chat too long for the reward model was a not-ok row, dropped from its
    group with advantage 0, above every below-average answer of the group: padding a bad answer past max_len
    escaped its penalty. It scores the minimum now (reward 0, ok), counted as a failed score, so its advantage is
    its group's lowest."""
    reward = RewardModelReward(model8, RewardModelConfig(max_len=64))
    lengths = [len(ids) for ids in reward.encode(QUESTIONS, RESPONSES)]
    assert sorted(lengths)[-1] > 64 >= sorted(lengths)[-2]  # exactly one row is too long
    out = reward(QUESTIONS, RESPONSES, [None] * 4)
    long_row = int(np.argmax(lengths))
    fits = np.arange(4) != long_row
    assert out.details["reward_ok"].all() and out.valid.all() and out.details["num_not_ok"] == 0
    assert out.scores[long_row, 0] == out.reward[long_row] == 0.0 and np.all(out.reward[fits] > 0)
    assert np.isnan(out.details["raw_scores"][long_row, 0])  # no verdict: the model never read it
    assert (out.details["reward_model_too_long"] == out.details["num_failed_scores"] == out.details["failures"][DIMENSION]
            == out.details["scored_minimum"][DIMENSION] == out.details["failure_causes"][DIMENSION][
                "reward_model_too_long"] == 1)
    whole = RewardModelReward(model8, RewardModelConfig(max_len=128))(QUESTIONS, RESPONSES, [None] * 4)
    np.testing.assert_allclose(out.reward[fits], whole.reward[fits], rtol=1e-6)  # the others are unaffected
    advantages, _ = grpo.group_advantages(out.reward, 4, valid_N=out.details["reward_ok"])
    assert int(np.argmin(advantages)) == long_row and advantages[long_row] < np.min(np.asarray(advantages)[fits])


def test_the_recorded_identity_moves_with_the_weights_and_the_settings_that_change_a_reward(model8, rm_dir, tmp_path,
                                                                                          layout8):
    """RewardModelReward.describe (rubric.json's reward_model; its hash guards a resume): the same directory and
    settings give the same hash; other weights of the same shapes, another center or scale, or another max_len
    give another; the batch size, which changes no reward, does not."""
    base = RewardModelReward(model8, RewardModelConfig(max_len=128)).describe()
    assert base == RewardModelReward(model8, RewardModelConfig(max_len=128, batch_size=3)).describe()
    assert base["checkpoint"] == str(rm_dir) and base["settings"]["center"] == 0.0
    other = load_reward_model(tiny_hf_dir(tmp_path / "other", num_labels=1, num_layers=1, std=0.2, seed=4),
                              layout=layout8)
    hashes = {base["hash"], RewardModelReward(other, RewardModelConfig(max_len=128)).describe()["hash"]}
    for changed in ({"center": 0.5}, {"scale": 2.0}, {"max_len": 64}):
        hashes.add(RewardModelReward(model8, RewardModelConfig(**{"max_len": 128, **changed})).describe()["hash"])
    assert len(hashes) == 5


def test_bad_checkpoints_settings_and_calls_are_named(model8, tmp_path, layout8):
    with pytest.raises(ValueError, match="one label; config.json describes a causal LM"):
        load_reward_model(tiny_hf_dir(tmp_path / "lm", num_layers=1), layout=layout8)
    with pytest.raises(ValueError, match="a classifier with 2 labels"):
        load_reward_model(tiny_hf_dir(tmp_path / "two", num_labels=2, num_layers=1), layout=layout8)
    with pytest.raises(ValueError, match=r"reward.model_max_len=1024 exceeds the reward model's context \(512"):
        RewardModelReward(model8, RewardModelConfig(max_len=1024))
    for field, value in (("max_len", 0), ("batch_size", 1.5), ("scale", 0.0), ("center", float("nan"))):
        with pytest.raises(ValueError, match=f"reward.model_{field}="):
            RewardModelConfig(**{field: value})
    reward = RewardModelReward(model8, RewardModelConfig(max_len=128))
    with pytest.raises(ValueError, match="no dimension weights"):
        reward(QUESTIONS, RESPONSES, [None] * 4, weights={DIMENSION: 1.0})
    with pytest.raises(ValueError, match="4 questions, 3 responses"):
        reward(QUESTIONS, RESPONSES[:3], [None] * 4)


def test_parameters_live_in_the_decode_layout_and_misplacement_is_an_error(model8, layout8):
    want = loader.expected_shardings(model8.cfg, layout8)
    for (path, x), expected in zip(jax.tree_util.tree_flatten_with_path(model8.weights.params)[0], jax.tree.leaves(want)):
        assert x.sharding.is_equivalent_to(expected, x.ndim), path
        assert x.dtype == jnp.float32, path
    assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(model8.weights.params))
    moved = dataclasses.replace(model8, weights=dataclasses.replace(
        model8.weights, params=jax.device_put(model8.weights.params, jax.devices()[0])))
    with pytest.raises(loader.PlacementError, match="reward model .*has sharding"):
        reward_model_logits(moved, [[1, 2, 3]], RewardModelConfig(max_len=128))

"""Rollouts -> GRPO batch: layout, advantages, response decoding and reward summaries (hand-made inputs),
and the real generate -> batch -> train log-prob path (the first update's ratio is 1 at any temperature)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rubric_jax import data, grpo, loader, sampling, sharding
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.models.config import ModelConfig
from rubric_jax.sampling import GenerationResult
from rubric_jax.train import programs as run_programs, rollout
from rubric_jax.train import state as train_state
from rubric_jax.train import step as train_step
from tests.random_model import random_model


def _result() -> GenerationResult:
    # Two questions x two samples; max_new_tokens 4; sample 1 stops after 2 tokens (eos = 2).
    tokens = np.array([[5, 6, 7, 8], [9, 2, 0, 0], [4, 4, 2, 0], [3, 2, 0, 0]], np.int32)
    logprobs = np.array([[-.1, -.2, -.3, -.4], [-.5, -.6, 0, 0], [-.7, -.8, -.9, 0], [-1., -1.1, 0, 0]], np.float32)
    return GenerationResult(tokens, logprobs, np.array([4, 2, 3, 2], np.int32),
                            np.array(["length", "stop", "stop", "stop"]), num_steps=4)


def _samples(prompt_ids, prompt_mask, tokens, logprobs, lengths) -> sampling.Samples:
    """A sampler call's device outputs, made by hand (response slots wider than max_new_tokens = 4)."""
    slots = 8
    widen = lambda x: np.pad(x, ((0, 0), (0, slots - x.shape[1])))  # noqa: E731
    return sampling.Samples(jnp.asarray(prompt_ids), jnp.asarray(prompt_mask), jnp.asarray(widen(tokens)),
                            jnp.asarray(widen(logprobs)), jnp.asarray(lengths), jnp.asarray(lengths < 4),
                            jnp.int32(4), len(tokens), 4)


def test_training_batch_layout_and_invalid_samples():
    prompt_ids = np.array([[0, 11, 12], [13, 14, 15]], np.int32)
    prompt_mask = np.array([[False, True, True], [True, True, True]])
    result = _result()
    samples = _samples(prompt_ids, prompt_mask, result.tokens, result.logprobs, result.lengths)
    adv = np.array([1., -1., .5, -.5], np.float32)
    valid = np.array([True, True, False, True])
    mesh = sharding.single_device_layout().mesh
    batch = jax.device_get(rollout.training_batch((samples,), ((0, 0), (0, 1)), 2, 4, adv, valid, mesh))
    assert batch["response_tokens"].shape == (4, 4)  # a column prefix of the sampler's 8 slots
    np.testing.assert_array_equal(batch["prompt_tokens"], prompt_ids)  # each group's prompt once
    np.testing.assert_array_equal(batch["prompt_mask"], prompt_mask)
    np.testing.assert_array_equal(batch["response_tokens"][1], [9, 2, 0, 0])
    np.testing.assert_array_equal(batch["response_tokens"][2], [4, 4, 2, 0])
    np.testing.assert_array_equal(batch["response_mask"][0], [True, True, True, True])
    np.testing.assert_array_equal(batch["response_mask"][1], [True, True, False, False])
    np.testing.assert_array_equal(batch["loss_mask"][1], [True, True, False, False])
    assert not batch["loss_mask"][2].any()  # missing reward: no loss tokens at all
    np.testing.assert_allclose(batch["old_logp"][3], [-1., -1.1, 0, 0])
    assert set(batch) == set(train_step.GRPO_BATCH_KEYS)
    np.testing.assert_array_equal(batch["advantages"], adv)


def test_training_batch_picks_groups_across_sampler_calls():
    """Dynamic sampling's batch: groups chosen from two calls whose prompt buckets differ, gathered on the device
    in the chosen order (the narrower call's prompts aligned on the right, their padding masked)."""
    result = _result()
    first = _samples(np.array([[0, 11, 12], [13, 14, 15]], np.int32), np.array([[False, True, True], [True] * 3]),
                     result.tokens, result.logprobs, result.lengths)
    second = _samples(np.array([[21, 22], [23, 24]], np.int32), np.ones((2, 2), bool), result.tokens[::-1],
                      result.logprobs[::-1], result.lengths[::-1])
    mesh = sharding.single_device_layout().mesh
    batch = jax.device_get(rollout.training_batch((first, second), ((1, 1), (0, 0)), 2, 4, np.zeros(4),
                                                  np.ones(4, bool), mesh))
    np.testing.assert_array_equal(batch["prompt_tokens"], [[0, 23, 24], [0, 11, 12]])
    np.testing.assert_array_equal(batch["prompt_mask"], [[False, True, True], [False, True, True]])
    np.testing.assert_array_equal(batch["response_tokens"], [[9, 2, 0, 0], [5, 6, 7, 8], [5, 6, 7, 8], [9, 2, 0, 0]])
    np.testing.assert_array_equal(batch["response_mask"].sum(axis=1), [2, 4, 4, 2])


class _Tokenizer:
    def decode(self, ids, skip_special_tokens):
        return ("plain: " if skip_special_tokens else "") + " ".join(map(str, ids))


def test_decode_drops_only_the_stop_token_and_keeps_special_tokens_for_the_policy():
    texts = data.decode_responses(_Tokenizer(), _result(), stop_tokens=(2,))
    assert texts == ["5 6 7 8", "9", "4 4", "3"]  # <think>/<answer> must survive for the rules
    assert data.decode_responses(_Tokenizer(), _result(), keep_special_tokens=False)[1] == "plain: 9 2"


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


def _scored(rewards, reward_ok, valid):
    rewards = np.asarray(rewards, np.float32)
    return RewardOutput(np.zeros(valid.shape), valid, rewards, [f"d{j}" for j in range(valid.shape[1])],
                        {"reward_ok": np.asarray(reward_ok)})


def test_rollout_advantages_use_the_configured_eps_and_missing_scores():
    valid = np.array([[True, True], [True, True], [True, False], [True, True]])
    scored = _scored([0.0, 1.0, 0.2, 0.6], [True, True, True, True], valid)
    cfg = grpo.GRPOConfig(group_size=2, advantage_eps=1.0)
    out = rollout.rollout_advantages(scored, cfg, "renormalize")
    adv, ok, zero_std = out.advantages_N, out.trainable_N, out.zero_std_frac
    # Group 0: {0, 1}: mean 0.5, sample std 1/sqrt(2); group 1: {0.2, 0.6}: mean 0.4, std 0.2*sqrt(2).
    s0, s1 = 1 / math.sqrt(2), 0.2 * math.sqrt(2)
    np.testing.assert_allclose(adv, [-0.5 / (s0 + 1), 0.5 / (s0 + 1), -0.2 / (s1 + 1), 0.2 / (s1 + 1)], rtol=1e-6)
    assert ok.all() and zero_std == 0.0
    # "drop": sample 2 misses a dimension score, so group 1 keeps one sample: no spread, advantage 0.
    out = rollout.rollout_advantages(scored, cfg, "drop")
    adv, ok, zero_std = out.advantages_N, out.trainable_N, out.zero_std_frac
    np.testing.assert_array_equal(ok, [True, True, False, True])
    np.testing.assert_allclose(adv, [-0.5 / (s0 + 1), 0.5 / (s0 + 1), 0.0, 0.0], rtol=1e-6)
    assert zero_std == 0.5
    with pytest.raises(ValueError, match="missing_scores='dorp'"):
        rollout.rollout_advantages(scored, cfg, "dorp")


@pytest.mark.parametrize("sampler", ["topk(40)", "nucleus(0.9, 0.7)", "greedy"])
def test_rollouts_refuse_truncating_or_greedy_samplers(sampler):
    with pytest.raises(ValueError, match=r"config.rl.sampler=.*temperature\(t\)"):
        rollout.rollout_temperature(sampler)
    assert rollout.rollout_temperature("temperature(0.7)") == 0.7


# ------------------------------------------------------------- generate -> batch -> train log-probs

MODEL = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, attention_bias=True, rope_scaling=None, max_position_embeddings=64)
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13], [3], [40, 41]]
GROUP, PAD, STOP = 2, 0, 1


@pytest.fixture(scope="module")
def policy():
    """A random policy whose next-token distributions are far from uniform (temperature matters)."""
    graphdef, state = random_model(MODEL, std=0.3)
    return graphdef, state, nnx.to_pure_dict(state)


@functools.lru_cache(maxsize=None)
def _programs(graphdef, temperature, kl_coef=0.0):
    cfg = grpo.GRPOConfig(group_size=GROUP, kl_coef=kl_coef, temperature=temperature)
    return run_programs.GRPOPrograms(cfg, train_step.jit_grpo_step(cfg),
                             train_step.jit_rollout_logprobs(graphdef, group_size=GROUP, temperature=temperature))


def _rollout_batch(graphdef, state, sampler):
    """What `loop.grpo_iteration` trains on: the sampler's responses laid out by `rollout.training_batch`."""
    samples = sampling.sample(loader.as_weights(MODEL, nnx.to_pure_dict(state)), PROMPTS, key=jax.random.key(4),
                              n=GROUP, max_new_tokens=10, sampler=sampler, stop_tokens=[STOP], pad_id=PAD,
                              response_buckets=(16,))
    n = len(PROMPTS) * GROUP
    advantages = np.where(np.arange(n) % 2 == 0, 1.0, -1.0).astype(np.float32)
    batch = rollout.training_batch((samples,), tuple((0, u) for u in range(len(PROMPTS))), GROUP, 16, advantages,
                                   np.ones(n, bool), sharding.single_device_layout().mesh)
    return {k: np.asarray(v) for k, v in batch.items()}


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_first_update_ratio_is_one_through_generate_batch_and_train_step(policy, temperature):
    graphdef, state, params = policy
    batch = _rollout_batch(graphdef, state, f"temperature({temperature})")
    mask = batch["loss_mask"]
    assert mask.sum() > 40
    programs = _programs(graphdef, rollout.rollout_temperature(f"temperature({temperature})"))
    # The trainer's teacher-forced log-probs of the sampled tokens equal the sampler's, token by token.
    logp = np.asarray(programs.logprobs(params, *train_step.logprob_inputs(batch)))
    np.testing.assert_allclose(logp[mask], batch["old_logp"][mask], atol=2e-5)
    # The first update of the real step sees ratio 1 everywhere: nothing clipped, no gap.
    tstate = train_state.train_state_from_params(graphdef, params, optax.sgd(0.1))
    _, metrics = programs.update(tstate, batch)
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-5)
    assert float(metrics["abs_log_ratio"]) < 1e-5 and float(metrics["clip_frac"]) == 0.0
    if temperature != 1.0:  # the test can fail: temperature-1 log-probs of tempered samples are far off
        untempered = np.asarray(_programs(graphdef, 1.0).logprobs(params, *train_step.logprob_inputs(batch)))
        assert np.abs(untempered[mask] - batch["old_logp"][mask]).mean() > 0.05


def test_rollout_logprobs_add_reference_and_recomputed_behaviour_once(policy):
    graphdef, state, params = policy
    batch = _rollout_batch(graphdef, state, "temperature(0.7)")
    calls = []
    programs = _programs(graphdef, 0.7)

    def counting_logprobs(p, *arrays):
        calls.append(p)
        return programs.logprobs(p, *arrays)

    counted = run_programs.GRPOPrograms(programs.cfg, programs.update, counting_logprobs)
    # β = 0, sampler's behaviour log-probs: no log-prob forward at all, the gap comes from the first update.
    out, stats = run_programs.rollout_logprobs(counted, batch, params, None, recompute_old=False)
    assert calls == [] and stats == {} and set(out) == set(train_step.GRPO_BATCH_KEYS)
    # Recomputed behaviour log-probs: one forward with the sampling params; the gap to the sampler's is ~0.
    out, stats = run_programs.rollout_logprobs(counted, batch, params, None, recompute_old=True)
    assert calls == [params] and float(stats["logprob_gap/mean"]) < 1e-5
    np.testing.assert_allclose(np.asarray(out["old_logp"])[batch["loss_mask"]], batch["old_logp"][batch["loss_mask"]],
                               atol=2e-5)
    # β > 0: the reference's log-probs once, in the batch the step takes.
    ref = jax.tree.map(lambda x: 0.9 * x, params)
    kl = _programs(graphdef, 0.7, kl_coef=0.05)
    out, _ = run_programs.rollout_logprobs(kl, batch, params, ref, recompute_old=False)
    np.testing.assert_allclose(out["ref_logp"], kl.logprobs(ref, *train_step.logprob_inputs(batch)), atol=1e-6)
    assert set(out) == set(train_step.grpo_batch_keys(kl.cfg))
    with pytest.raises(ValueError, match="iff rl.beta > 0"):
        run_programs.rollout_logprobs(kl, batch, params, None, recompute_old=False)


def test_behaviour_correction_weights_travel_in_the_batch_and_scale_the_update(policy):
    """Truncated IS: the weights min(pi_old / pi_sampler, C) are computed once per rollout from the recomputed and
    the sampler's log-probs; they need the recomputation, and the update reads them."""
    graphdef, state, params = policy
    batch = _rollout_batch(graphdef, state, "temperature(0.7)")
    base = _programs(graphdef, 0.7)
    cfg = grpo.GRPOConfig(group_size=GROUP, kl_coef=0.0, temperature=0.7, behaviour_correction_cap=1.5)
    tis = run_programs.GRPOPrograms(cfg, train_step.jit_grpo_step(cfg), base.logprobs)
    with pytest.raises(ValueError, match="needs rl.recompute_old_logprobs=True"):
        run_programs.rollout_logprobs(tis, batch, params, None, recompute_old=False)
    shifted = {**batch, "old_logp": batch["old_logp"] - 1.0}  # a sampler 1 nat less likely on every token
    out, stats = run_programs.rollout_logprobs(tis, shifted, params, None, recompute_old=True)
    mask = batch["loss_mask"]
    np.testing.assert_allclose(np.asarray(out[train_step.BEHAVIOUR_WEIGHT])[mask], 1.5)  # e^1 capped at 1.5
    assert float(stats["behaviour_weight/max"]) == pytest.approx(1.5) and float(stats["behaviour_weight/mean"]) == \
        pytest.approx(1.5)
    _, metrics = tis.update(train_state.train_state_from_params(graphdef, params, optax.sgd(0.1)), out)
    assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0

"""Train steps through LoRA adapters: only the adapters are trained (and get optimizer moments), the base stays
frozen in the compute dtype, and one SFT and one GRPO step equal a hand-built reference: the full model's gradient
at the numpy-merged weights (base + B·A·alpha/r), taken to the adapters by the chain rule, then clipping and
AdamW's first update in numpy."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as PS

from rubric_jax import grpo, loader, sharding
from rubric_jax.models import lora
from rubric_jax.train import checkpointing, export
from rubric_jax.train import state as train_state
from rubric_jax.train import step as train_step
from tests.models.test_checkpoint import read_tensors
from tests.models.test_lora import CFG, logits_of, numpy_merge, with_random_b
from tests.random_model import random_weights

B, P, R, GROUP, LR, EPS, CLIP = 8, 4, 6, 2, 1e-2, 1e-3, 1.0
LORA = lora.LoraConfig(rank=4, alpha=8.0, targets=lora.TARGETS)
GRPO = grpo.GRPOConfig(group_size=GROUP, kl_coef=0.04, clip_high=0.28)
TX = train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=LR, eps=EPS, max_grad_norm=CLIP))


@pytest.fixture(scope="module")
def adapted():
    """A random base with adapters whose B is not zero (so both A's and B's gradients are exercised)."""
    return with_random_b(loader.add_adapters(random_weights(CFG, std=0.3), LORA, None, jax.random.key(5)))


@pytest.fixture(scope="module")
def batch(adapted):
    """A GRPO batch whose behaviour log-probs are the adapted policy's, shifted, and whose reference log-probs are
    the base's: the same weights with the adapters off."""
    rng = np.random.default_rng(1)
    prompt_mask = np.arange(P)[None, :] >= np.array([0, 2, 1, 3])[:, None]
    response_mask = np.arange(R)[None, :] < np.array([6, 4, 2, 6, 5, 3, 6, 1])[:, None]
    batch = {"prompt_tokens": jnp.asarray(np.where(prompt_mask, rng.integers(1, CFG.vocab_size, (B // GROUP, P)), 0),
                                          jnp.int32),
             "prompt_mask": jnp.asarray(prompt_mask),
             "response_tokens": jnp.asarray(np.where(response_mask, rng.integers(1, CFG.vocab_size, (B, R)), 0),
                                            jnp.int32),
             "response_mask": jnp.asarray(response_mask), "loss_mask": jnp.asarray(response_mask),
             "advantages": grpo.group_advantages(jnp.asarray(rng.uniform(size=B), jnp.float32), GROUP)[0]}
    logprobs = train_step.jit_rollout_logprobs(adapted.graphdef, group_size=GROUP, temperature=1.0)
    shift = np.where(np.arange(R)[None, :] % 2 == 0, 0.3, -0.3).astype(np.float32)
    batch["old_logp"] = jnp.where(response_mask, logprobs(adapted.params, *train_step.logprob_inputs(batch)) + shift, 0)
    base = loader.base_weights(adapted)
    base_logprobs = train_step.jit_rollout_logprobs(base.graphdef, group_size=GROUP, temperature=1.0)
    batch["ref_logp"] = base_logprobs(base.params, *train_step.logprob_inputs(batch))
    return batch


def _sft(batch):
    """The GRPO rows as SFT sequences [prompt | response], trained on the response."""
    prompts, mask = (np.repeat(np.asarray(batch[k]), GROUP, axis=0) for k in ("prompt_tokens", "prompt_mask"))
    return {"tokens": jnp.asarray(np.concatenate([prompts, batch["response_tokens"]], axis=1)),
            "input_mask": jnp.asarray(np.concatenate([mask, batch["response_mask"]], axis=1)),
            "loss_mask": jnp.asarray(np.concatenate([np.zeros_like(mask), batch["loss_mask"]], axis=1))}


def _full_gradient(adapted, step_fn):
    """The full model's gradient (and metrics) at the numpy-merged weights, by one plain-SGD step of the
    un-adapted model (scanned, no remat): (W - W') / lr with a large lr, so float32 rounding of W stays far below
    the gradient."""
    merged = loader.as_weights(CFG, jax.tree.map(jnp.asarray, numpy_merge(adapted.params, LORA.scale)))
    lr = 1e4
    state = train_state.new_train_state(merged, optax.sgd(lr), None)[0]
    new, metrics = step_fn(state)
    return jax.tree.map(lambda w, w1: (np.asarray(w, np.float64) - np.asarray(w1, np.float64)) / lr,
                        merged.params, new.params), metrics


def _reference_adapters(adapters, full_grads):
    """The hand-built update of the adapters: chain rule through W' = W + s·A·B, clip_by_global_norm, AdamW's
    first step (m̂ = g, v̂ = g²: Δ = -lr·g / (|g| + eps)), in numpy float64."""
    grads = {}

    def walk(node, g_node, out):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, g_node[key], out.setdefault(key, {}))
        if "lora_a" in node:
            a, b, g = np.asarray(node["lora_a"], np.float64), np.asarray(node["lora_b"], np.float64), g_node["kernel"]
            lead = a.ndim + b.ndim - 2 - g.ndim
            a2, b2 = a.reshape(*a.shape[:lead], -1, a.shape[-1]), b.reshape(*b.shape[:lead], b.shape[lead], -1)
            g2 = g.reshape(*a2.shape[:-1], b2.shape[-1])
            out["lora_a"] = (LORA.scale * g2 @ np.swapaxes(b2, -1, -2)).reshape(a.shape)
            out["lora_b"] = (LORA.scale * np.swapaxes(a2, -1, -2) @ g2).reshape(b.shape)

    walk(adapters, full_grads, grads)
    norm = np.sqrt(sum(np.sum(g * g) for g in jax.tree.leaves(grads)))
    factor = min(1.0, CLIP / norm)
    return jax.tree.map(lambda p, g: np.asarray(p, np.float64) - LR * (g * factor) / (np.abs(g * factor) + EPS),
                        adapters, grads), norm


def _check_step(adapted, lora_step, full_step):
    state, shardings = train_state.new_train_state(adapted, TX, None)
    assert shardings is None
    adapters, base = lora.split(adapted.params)
    assert jax.tree.structure(state.params) == jax.tree.structure(adapters)  # only the adapters are trained
    assert jax.tree.structure(state.frozen) == jax.tree.structure(base)
    counts = state.parameter_counts()
    assert counts == {"trainable": sum(x.size for x in jax.tree.leaves(adapters)),
                      "frozen": sum(x.size for x in jax.tree.leaves(base))}
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim]
    assert sum(x.size for x in moments) == 2 * counts["trainable"]  # Adam's two moments, adapters only
    frozen_before = jax.device_get(state.frozen)
    expected_grads, full_metrics = _full_gradient(adapted, full_step)
    expected, norm = _reference_adapters(jax.device_get(adapters), expected_grads)
    new, metrics = lora_step(state)
    assert int(metrics["skipped"]) == 0
    np.testing.assert_allclose(float(metrics["loss"]), float(full_metrics["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["grad_norm"]), norm, rtol=1e-5)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5),
                 new.params, expected)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(new.frozen), frozen_before)  # the base is frozen
    assert max(np.abs(np.asarray(new.params[k]["lora_a"]) - np.asarray(adapters[k]["lora_a"])).max()
               for k in ("lm_head",)) > 1e-4  # the A side learnt too (B != 0)


@pytest.mark.parametrize("changes", [{}, dict(scan_layers=False, remat=True)])
def test_sft_step_through_adapters_equals_numpy_reference(adapted, batch, changes):
    """Scanned, and unrolled + rematerialised (the adapters' gradients through jax.checkpoint)."""
    adapted = loader.as_weights(adapted.cfg.replace(**changes), adapted.params)
    sft = _sft(jax.device_get(batch))
    _check_step(adapted, lambda s: train_step.jit_sft_step()(s, sft), lambda s: train_step.jit_sft_step()(s, sft))


def test_grpo_step_through_adapters_equals_numpy_reference(adapted, batch):
    step = train_step.jit_grpo_step(GRPO)
    _check_step(adapted, lambda s: step(s, batch), lambda s: train_step.jit_grpo_step(GRPO)(s, batch))


def test_reference_logprobs_are_the_base_models(adapted, batch):
    """With the adapters off the same weights give the base model's log-probs; at step 0 (B = 0) the policy's too."""
    base = random_weights(CFG, std=0.3)
    logprobs = train_step.jit_rollout_logprobs(base.graphdef, group_size=GROUP, temperature=1.0)
    np.testing.assert_array_equal(np.asarray(batch["ref_logp"]),
                                  np.asarray(logprobs(base.params, *train_step.logprob_inputs(batch))))
    fresh = loader.add_adapters(base, LORA, None, jax.random.key(5))
    policy = train_step.jit_rollout_logprobs(fresh.graphdef, group_size=GROUP, temperature=1.0)
    np.testing.assert_array_equal(np.asarray(policy(fresh.params, *train_step.logprob_inputs(batch))),
                                  np.asarray(batch["ref_logp"]))


def test_sharded_lora_step_equals_unsharded(adapted, batch):
    """FSDP x TP x data on 8 simulated devices, 2 micro-batches: the adapters are placed by the same logical-axis
    rules as their kernels (the rank axis whole) and the sharded GRPO step equals the unsharded one."""
    micro_batches = 2
    layout = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2)))
    unsharded, _ = train_step.jit_grpo_step(GRPO, micro_batches=micro_batches)(
        train_state.new_train_state(adapted, TX, None)[0], batch)
    placed = jax.device_put(jax.device_get(adapted.params), loader.expected_shardings(adapted.cfg, layout))
    state, shardings = train_state.new_train_state(loader.as_weights(adapted.cfg, placed, layout), TX, layout.mesh)
    q_a = state.params["layers"]["self_attn"]["q_proj"]["lora_a"]
    assert q_a.sharding.spec == PS(None, "fsdp", None)
    assert state.params["layers"]["self_attn"]["q_proj"]["lora_b"].sharding.spec == PS(None, None, "tensor", None)
    sharded_batch = jax.device_put(jax.device_get(batch), train_step.batch_shardings(batch, layout.mesh))
    step = train_step.jit_grpo_step(GRPO, micro_batches=micro_batches, shardings=shardings, mesh=layout.mesh)
    new, metrics = step(state, sharded_batch)
    assert int(metrics["skipped"]) == 0
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6),
                 new.params, unsharded.params)
    jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim) or pytest.fail(f"{x.sharding} != {s}"),
                 new, shardings)


def test_checkpoint_holds_adapters_and_resumes_exactly(adapted, batch, tmp_path):
    """The checkpoint holds the adapters, their optimizer state and step (not the base: only its identity); a
    restore into a fresh state and one more step == two uninterrupted steps; another base is refused."""
    step = train_step.jit_grpo_step(GRPO)
    one, _ = step(train_state.new_train_state(adapted, TX, None)[0], batch)
    with checkpointing.Checkpointer(tmp_path, max_to_keep=2, async_save=False) as ckpt:
        with pytest.raises(ValueError, match="base_identity is given exactly for a LoRA state"):
            ckpt.save(one, data_state={"index": 8}, rubric_hash="h")
        ckpt.save(one, data_state={"index": 8}, rubric_hash="h", base_identity="sha256:base")
        saved = ckpt._manager.item_metadata(1)["state"].tree
        names = {getattr(k, "key", str(k)) for path, _ in jax.tree_util.tree_flatten_with_path(
            saved, is_leaf=lambda x: hasattr(x, "shape"))[0] for k in path}
        assert "lora_a" in names and not names & {"kernel", "embedding", "scale", "bias", "frozen"}
        two, _ = step(one, batch)
        fresh = train_state.new_train_state(adapted, TX, None)[0]
        restored = ckpt.restore(checkpointing.abstract_with_shardings(fresh, None),
                                expected_base_identity="sha256:base")
        with pytest.raises(checkpointing.CheckpointError, match="adapters of base 'sha256:base', expected base"):
            ckpt.restore(fresh, expected_base_identity="sha256:other")
        with pytest.raises(checkpointing.CheckpointError, match="adapters of base 'sha256:base', expected base"):
            ckpt.restore_newest(fresh, expected_base_identity="sha256:other")  # never skipped as unreadable
    assert restored.base_identity == "sha256:base" and restored.data_state == {"index": 8}
    assert restored.state.frozen is fresh.frozen
    resumed, _ = step(restored.state, batch)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.params), jax.device_get(two.params))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.opt_state), jax.device_get(two.opt_state))


def test_export_lora_policy_writes_merged_and_peft_directories(adapted, tmp_path):
    """A LoRA policy's export: the merged HF directory (with the run's tokenizer files) reads back as the adapted
    model, and the PEFT directory holds every adapter."""
    tokenizer_dir = Path(__file__).resolve().parents[1] / "fixtures" / "golden_export" / "qwen2_tiny_tokenizer"
    merged_dir, peft_dir = export.export_lora_policy(adapted, sharding.single_device_layout(), tmp_path / "merged",
                                                     tmp_path / "peft", tokenizer_dir=tokenizer_dir, start_dir=None,
                                                     base_model="Qwen/base")
    assert (merged_dir / "tokenizer.json").is_file() and (merged_dir / "generation_config.json").is_file()
    np.testing.assert_allclose(logits_of(loader.load_weights(merged_dir)), logits_of(adapted), rtol=1e-5, atol=1e-5)
    assert len(read_tensors(peft_dir)) == 2 * (7 * CFG.num_layers + 1)  # (A, B) of 7 targets per layer + LM head


def test_frozen_base_is_in_the_compute_dtype(adapted):
    """bf16 compute: the base is frozen in bfloat16 (half the bytes of a float32 copy), the adapters and their
    moments stay float32."""
    bf16 = loader.as_weights(adapted.cfg.replace(compute_dtype="bfloat16"), adapted.params)
    state = train_state.new_train_state(bf16, TX, None)[0]
    assert {x.dtype for x in jax.tree.leaves(state.frozen)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    with pytest.raises(ValueError, match=r"\['lora_a'\] has dtype bfloat16"):
        train_state.new_train_state(loader.as_weights(bf16.cfg, jax.tree.map(
            lambda x: x.astype(jnp.bfloat16), adapted.params)), TX, None)

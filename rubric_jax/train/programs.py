"""The optimizers and jitted programs of a run, built from the config and the training shardings: what
the trainer loop (train/loop.py) runs and the dry run (rubric_jax/aot.py) compiles, so both compile the same
programs. Also the rollout log-probs (reference, recomputed behaviour) computed once per rollout."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from rubric_jax import grpo
from rubric_jax.train import settings as run_settings, state as train_state, step as train_step
from rubric_jax.train.settings import grpo_config


def sft_optimizer(sft: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
    """AdamW of the SFT stage, its schedule over `total_steps` updates."""
    return train_state.make_optimizer(run_settings.optimizer_config(sft, total_steps, "sft"))


def grpo_optimizer(rl: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW of the GRPO stage, its schedule over every update (`steps` x `updates_per_batch`); with
    `lr_on_oscillation`, a learning-rate factor in its state (train/oscillation.py)."""
    return train_state.make_optimizer(run_settings.optimizer_config(rl, rl.steps * rl.updates_per_batch, "rl"),
                                      adjustable_lr=rl.lr_on_oscillation)


def sft_program(shardings: train_state.TrainState, mesh: jax.sharding.Mesh
                ) -> Callable[[train_state.TrainState, dict[str, jax.Array]], tuple[train_state.TrainState, dict]]:
    """The jitted SFT update `(state, batch) -> (state, metrics)` in the training `shardings` (what
    `loop.run_sft` runs and the dry run compiles)."""
    return train_step.jit_sft_step(shardings=shardings, mesh=mesh)


@dataclasses.dataclass(frozen=True)
class GRPOPrograms:
    """What every GRPO iteration runs, built once by `loop.grpo_components`: the objective's settings, the
    jitted update `(state, batch) -> (state, metrics)` and the jitted teacher-forced log-probs
    `(params, *train_step.logprob_inputs(batch)) -> [N, R]` at the rollout temperature (each group's
    prompt once), both in the run's shardings."""

    cfg: grpo.GRPOConfig
    update: Callable[[train_state.TrainState, dict[str, jax.Array]], tuple[train_state.TrainState, dict]]
    logprobs: Callable[[Any, jax.Array, jax.Array], jax.Array]


def grpo_programs(rl: ml_collections.ConfigDict, graphdef: nnx.GraphDef, shardings: train_state.TrainState,
                  mesh: jax.sharding.Mesh, cfg: grpo.GRPOConfig | None = None) -> GRPOPrograms:
    """The jitted GRPO programs of the rl block (`cfg`: its validated GRPOConfig) in the training `shardings`
    (what `loop.grpo_iteration` runs and the dry run compiles)."""
    cfg = cfg or grpo_config(rl)
    update = train_step.jit_grpo_step(cfg, micro_batches=rl.micro_batches, shardings=shardings, mesh=mesh)
    logprobs = train_step.jit_rollout_logprobs(
        graphdef, group_size=cfg.group_size, temperature=cfg.temperature, chunk_size=cfg.logprob_chunk_size,
        micro_batches=rl.micro_batches, param_shardings=shardings.params, mesh=mesh)
    return GRPOPrograms(cfg, update, logprobs)


def rollout_logprobs(programs: GRPOPrograms, batch: dict[str, jax.Array], policy_params: Any,
                     ref_params: Any | None, recompute_old: bool) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """The batch with its rollout log-probs, computed once per rollout and outside the gradient: the
    reference's `ref_logp` exactly when β > 0 and, with `recompute_old`, `old_logp` recomputed
    teacher-forced from the params that sampled; with the sampler/trainer correction
    (cfg.behaviour_correction_cap, which needs `recompute_old`), the truncated importance weights
    min(π_old / π_sampler, C) as `behaviour_weight`. Returns it and device scalars: when recomputed,
    `logprob_gap/mean` (mean |recomputed − sampler| log-prob over the response tokens) and, with the
    correction, `behaviour_weight/mean` and `/max` over every response token."""
    cfg = programs.cfg
    if (ref_params is None) != (cfg.kl_coef == 0):
        raise ValueError(f"ref_params must be given iff rl.beta > 0 (beta={cfg.kl_coef})")
    if cfg.behaviour_correction_cap is not None and not recompute_old:
        raise ValueError("rl.behaviour_correction_cap needs rl.recompute_old_logprobs=True: the correction weighs "
                         "the trainer's recomputed log-probs against the sampler's")
    batch = dict(batch)
    if ref_params is not None:
        batch[train_step.REF_LOGP] = programs.logprobs(ref_params, *train_step.logprob_inputs(batch))
    stats: dict[str, jax.Array] = {}
    if recompute_old:
        old_logp, sampler_logp = programs.logprobs(policy_params, *train_step.logprob_inputs(batch)), batch["old_logp"]
        stats["logprob_gap/mean"] = grpo.logprob_gap(old_logp, sampler_logp, batch["loss_mask"])
        batch["old_logp"] = old_logp
        if cfg.behaviour_correction_cap is not None:  # stats over every response token, trained on or not
            mask = batch["response_mask"]
            weight = grpo.behaviour_weights(old_logp, sampler_logp, mask, cfg.behaviour_correction_cap)
            batch[train_step.BEHAVIOUR_WEIGHT] = weight
            stats["behaviour_weight/mean"] = jnp.sum(weight * mask) / jnp.maximum(mask.sum(), 1)
            stats["behaviour_weight/max"] = jnp.max(jnp.where(mask, weight, 0.0))
    return batch, stats

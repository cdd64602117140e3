"""The layouts and jitted programs of a run, built once from its validated settings and the model's shape:
what the stages run (through `experiment.Experiment.programs`) and what the dry run (rubric_jax/aot.py)
compiles, so both compile the same programs. Also the rollout log-probs (reference, recomputed behaviour)
computed once per rollout."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rubric_jax import grpo, loader, sharding
from rubric_jax.models import lora
from rubric_jax.models.config import ModelConfig, ModelConfigError
from rubric_jax.train import micro_batching, state as train_state, step as train_step
from rubric_jax.train.settings import MeshSpec, Settings

# dtypes of the arrays a GRPO / SFT batch carries (rubric_jax/train/rollout.py makes them on the host).
BATCH_DTYPES = {"tokens": jnp.int32, "input_mask": jnp.bool_, "loss_mask": jnp.bool_, "old_logp": jnp.float32,
                "advantages": jnp.float32, train_step.REF_LOGP: jnp.float32, train_step.BEHAVIOUR_WEIGHT: jnp.float32,
                "prompt_tokens": jnp.int32, "prompt_mask": jnp.bool_, "response_tokens": jnp.int32,
                "response_mask": jnp.bool_}


@dataclasses.dataclass(frozen=True)
class Layouts:
    """Where the policy lives: the training layout (FSDP/TP: policy, reference, optimizer state, batches) and the
    decode layout of rollouts and judges (mesh.rollout) over the same devices, with the decode dtype."""

    model: ModelConfig
    training: sharding.Layout
    decode: sharding.Layout
    decode_dtype: str  # the policy's parameter dtype while decoding (mesh.rollout.param_dtype resolved)
    lora: lora.LoraConfig | None = None  # config.lora's adapters when a stage trains through them

    @property
    def mesh(self) -> jax.sharding.Mesh:
        """The training mesh."""
        return self.training.mesh

    def stage_model(self, adapters: bool) -> ModelConfig:
        """The policy's ModelConfig in a stage that trains through the adapters (`adapters`) or every weight."""
        return self.model.replace(lora=self.lora) if adapters else self.model

    def policy(self, params: dict[str, Any]) -> loader.Weights:
        """A model's params (no copy; a LoRA state's `model_params()`) as the policy's Weights in the training
        layout, with the adapters' config when they hold adapters."""
        return loader.as_weights(self.stage_model(lora.has_adapters(params)), params, self.training)

    def stage_params(self, params: dict[str, Any], adapters: bool, key: jax.Array) -> dict[str, Any]:
        """A stage's starting params from the previous stage's model params: a LoRA result merged into a plain
        model (in float32), then, for a stage that trains through adapters, fresh ones (`key`) on that base (its
        arrays kept, not copied)."""
        weights = self.policy(params)
        if lora.has_adapters(params):
            weights = loader.to_layout(weights, self.training, param_dtype=self.model.param_dtype)
        return loader.add_adapters(weights, self.lora, self.training, key).params if adapters else weights.params

    def rollout_weights(self, params: dict[str, Any]) -> loader.Weights:
        """The policy in the decode layout and dtype, its layers per layer (what the sampler reads in place),
        resharded from the training layout once per rollout (nothing is resharded back); a LoRA policy's adapters
        merged into its kernels on the way (`loader.to_layout`)."""
        return loader.to_layout(self.policy(params), self.decode, param_dtype=self.decode_dtype, per_layer=True)

    def abstract_rollout_weights(self) -> loader.Weights:
        """What `rollout_weights` returns, as ShapeDtypeStructs (for ahead-of-time lowering)."""
        return loader.abstract_weights(self.model.replace(param_dtype=self.decode_dtype, lora=None), self.decode,
                                       per_layer=True)


def layouts(mesh: MeshSpec, model_cfg: ModelConfig, devices: Sequence[jax.Device] | None = None,
            adapters: lora.LoraConfig | None = None) -> Layouts:
    """The training layout over `devices` (default: all) and the decode layout over the same devices; `adapters`:
    config.lora's when a stage trains through them (checked against the model here, before anything runs)."""
    if adapters is not None:
        try:
            model_cfg.replace(lora=adapters)
        except ModelConfigError as e:
            raise ValueError(f"config.lora.targets={adapters.targets!r}: {e}") from None
    layout = sharding.Layout(sharding.make_mesh(mesh.training, devices))
    try:
        decode = sharding.decode_layout(layout.mesh, mesh.rollout_tensor)
    except ValueError as e:
        raise ValueError(f"config.mesh.rollout.tensor={mesh.rollout_tensor!r}: {e}") from None
    for field, heads in (("num_heads", model_cfg.num_heads), ("num_kv_heads", model_cfg.num_kv_heads)):
        if heads % mesh.rollout_tensor:
            raise ValueError(f"config.mesh.rollout.tensor={mesh.rollout_tensor} does not divide the model's {field} "
                             f"({heads}): those weights would be replicated on every device; pick a divisor")
    dtype = model_cfg.compute_dtype if mesh.rollout_param_dtype == "compute" else mesh.rollout_param_dtype
    return Layouts(model_cfg, layout, decode, dtype, adapters)


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """A stage's optimizer, its step-0 state as ShapeDtypeStructs and as shardings (what its programs are
    compiled for) and `init(params)`: the step-0 state around params already in the training layout (a misplaced
    array is an error), its optimizer state created in its shardings, by one jitted program kept with the layout."""

    tx: optax.GradientTransformation
    abstract_state: train_state.TrainState
    shardings: train_state.TrainState
    init: Callable[[dict[str, Any]], train_state.TrainState]


@dataclasses.dataclass(frozen=True)
class GRPOPrograms:
    """What every GRPO iteration runs: the objective's settings, the jitted update `(state, batch) -> (state,
    metrics)` and the jitted teacher-forced log-probs `(params, *train_step.logprob_inputs(batch)) -> [N, R]` at
    the rollout temperature (each group's prompt once), both in the run's shardings."""

    cfg: grpo.GRPOConfig
    update: Callable[[train_state.TrainState, dict[str, jax.Array]], tuple[train_state.TrainState, dict]]
    logprobs: Callable[[Any, jax.Array, jax.Array], jax.Array]
    ref_logprobs: Callable[[Any, jax.Array, jax.Array], jax.Array] | None = None  # LoRA: the frozen base's; None:
    # the reference is a model of the policy's shape, read by `logprobs`


@dataclasses.dataclass(frozen=True)
class RunPrograms:
    """Every layout and training program of a run (a stage that is not configured has None)."""

    layouts: Layouts
    sft_state: StateLayout | None
    sft_step: Callable[[train_state.TrainState, dict[str, jax.Array]], tuple[train_state.TrainState, dict]] | None
    grpo_state: StateLayout | None
    grpo: GRPOPrograms | None
    micro_batches: int  # the GRPO programs' micro-batch count (rl.micro_batches, or the auto choice); 0 without GRPO
    auto: micro_batching.Choice | None  # rl.micro_batches=0: the count chosen and the estimate it was chosen by


def build(settings: Settings, lay: Layouts, sft_steps: int, memory: micro_batching.Memory | None = None,
          compiler_options: tuple[tuple[str, Any], ...] = ()) -> RunPrograms:
    """The programs of the configured stages in `lay`, from abstract weights (nothing is allocated); `sft_steps`
    is the SFT schedule's length (from the data; any value for a dry run). With rl.micro_batches=0 the count is
    chosen (train/micro_batching.py) against `memory` (default: the training devices' `memory_stats()`, with the
    reference beside the update when β > 0), compiling the update with `compiler_options`. Built once per process
    for equal inputs (the specs are frozen): a run started again in the same process (a restart after SIGTERM, a
    resumed run, another experiment of the same shapes) gets the same jitted programs, so jax traces, lowers and
    compiles none of them again."""
    sft = (settings.sft.optimizer_for(sft_steps), settings.sft.lora is not None) if settings.sft is not None else None
    rl = settings.rl
    grpo_spec = ((settings.grpo, rl.optimizer, rl.adjustable_lr, rl.micro_batches, rl.lora is not None)
                 if rl is not None else None)
    auto = None
    if rl is not None and rl.micro_batches == micro_batching.AUTO:
        if memory is None:  # with LoRA the reference is the frozen base, in the state: nothing beside it
            reference = micro_batching.per_device_bytes(loader.abstract_weights(lay.model, lay.training).params)
            memory = micro_batching.device_memory(list(lay.mesh.devices.flat),
                                                  reference if rl.beta > 0 and rl.lora is None else 0)
        auto = micro_batching.AutoSettings(memory, rl.questions_per_step, max(settings.train_rollout.prompt_buckets),
                                           max(settings.train_rollout.response_buckets), compiler_options)
    return _build(lay, sft, grpo_spec, auto)


@functools.lru_cache(maxsize=4)
def _build(lay: Layouts, sft: tuple[train_state.OptimizerConfig, bool] | None,
           grpo_spec: tuple[grpo.GRPOConfig, train_state.OptimizerConfig, bool, int, bool] | None,
           auto: micro_batching.AutoSettings | None) -> RunPrograms:
    """`build` from exactly what the programs depend on: the SFT optimizer and the GRPO objective, optimizer,
    learning-rate factor and micro-batches, each stage with whether it trains through the adapters (its policy is
    then `lay.stage_model(True)`: adapters trained, the base frozen); None for a stage that is not configured; and
    what choosing the micro-batch count needs (rl.micro_batches=0)."""
    sft_state = sft_step = grpo_state = grpo_built = choice = None
    micro_batches = 0
    if sft is not None:
        optimizer, adapters = sft
        sft_state = _state_layout(train_state.make_optimizer(optimizer), _policy(lay, adapters), lay.mesh)
        sft_step = train_step.jit_sft_step(shardings=sft_state.shardings, mesh=lay.mesh)
    if grpo_spec is not None:
        cfg, optimizer, adjustable_lr, micro_batches, adapters = grpo_spec
        policy = _policy(lay, adapters)
        grpo_state = _state_layout(train_state.make_optimizer(optimizer, adjustable_lr=adjustable_lr), policy,
                                   lay.mesh)  # with rl.lr_on_oscillation, a learning-rate factor in its state
        base = loader.abstract_weights(lay.model, lay.training).graphdef if adapters else None
        if auto is not None:
            choice, grpo_built = _choose(cfg, auto, policy.graphdef, grpo_state, lay.mesh, base)
            micro_batches = choice.count
        else:
            grpo_built = grpo_programs(cfg, micro_batches, policy.graphdef, grpo_state.shardings, lay.mesh, base)
    return RunPrograms(lay, sft_state, sft_step, grpo_state, grpo_built, micro_batches, choice)


def _choose(cfg: grpo.GRPOConfig, auto: micro_batching.AutoSettings, graphdef: Any, state: StateLayout,
            mesh: jax.sharding.Mesh, base_graphdef: Any | None) -> tuple[micro_batching.Choice, GRPOPrograms]:
    """The fewest micro-batches whose update, compiled for the batch of `auto` (its largest buckets), fits its
    memory, and that count's programs: the chosen compile is kept (jax reuses it for a batch of those shapes)."""
    rows = auto.prompts * cfg.group_size
    batch = abstract_batch(train_step.grpo_batch_keys(cfg), rows, auto.response_len, mesh, auto.prompt_len,
                           auto.prompts)
    built: dict[int, tuple[GRPOPrograms, jax.stages.Compiled, float]] = {}

    def peak_of(count: int) -> int:
        programs = grpo_programs(cfg, count, graphdef, state.shardings, mesh, base_graphdef)
        start = time.perf_counter()
        lowered = programs.update.lower(state.abstract_state, batch)
        compiled = lowered.compile(compiler_options=dict(auto.compiler_options))
        built[count] = programs, compiled, time.perf_counter() - start
        return micro_batching.peak_bytes(compiled.memory_analysis())

    counts = micro_batching.candidates(rows, mesh.shape["data"] * mesh.shape["fsdp"])
    choice = micro_batching.choose(auto.memory, counts, peak_of)
    if choice.count not in built:  # no limit to choose by: nothing was compiled
        return choice, grpo_programs(cfg, choice.count, graphdef, state.shardings, mesh, base_graphdef)
    programs, compiled, seconds = built[choice.count]
    return dataclasses.replace(choice, compiled=compiled, compile_seconds=seconds), programs


def abstract_batch(keys: Sequence[str], rows: int, length: int, mesh: jax.sharding.Mesh, prompt_len: int = 0,
                   prompts: int = 0) -> dict[str, jax.ShapeDtypeStruct]:
    """Abstract batch arrays: [rows] advantages, [prompts, prompt_len] prompt arrays, [rows, length] the rest,
    where the trainer puts them (`train_step.batch_shardings`)."""
    def shape(k: str) -> tuple[int, ...]:
        if k in train_step.PROMPT_KEYS:
            return prompts, prompt_len
        return (rows,) if k == "advantages" else (rows, length)

    shapes = {k: jax.ShapeDtypeStruct(shape(k), BATCH_DTYPES[k]) for k in keys}
    placed = train_step.batch_shardings(shapes, mesh)
    return {k: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed[k]) for k, x in shapes.items()}


def _policy(lay: Layouts, adapters: bool) -> loader.Weights:
    """A stage's policy as abstract weights in the training layout (with adapters when it trains through them)."""
    return loader.abstract_weights(lay.stage_model(adapters), lay.training)


def _state_layout(tx: optax.GradientTransformation, policy: loader.Weights, mesh: jax.sharding.Mesh) -> StateLayout:
    """The step-0 state of a stage optimised by `tx` around `policy`'s (abstract) weights."""
    abstract_state, shardings = train_state.abstract_train_state(policy, tx, mesh)
    return StateLayout(tx, abstract_state, shardings, train_state.state_initializer(policy.graphdef, tx, shardings))


def grpo_programs(cfg: grpo.GRPOConfig, micro_batches: int, graphdef: Any, shardings: train_state.TrainState,
                  mesh: jax.sharding.Mesh, base_graphdef: Any | None = None) -> GRPOPrograms:
    """The jitted GRPO programs of objective `cfg` in `micro_batches` (rl.micro_batches; train/oscillation.py's
    factor rides in the optimizer state) in the training `shardings`; with LoRA (`base_graphdef`: the model without
    adapters), the reference's log-probs read the state's frozen base alone (no second copy of the weights)."""
    update = train_step.jit_grpo_step(cfg, micro_batches=micro_batches, shardings=shardings, mesh=mesh)
    logprobs = functools.partial(train_step.jit_rollout_logprobs, group_size=cfg.group_size,
                                 temperature=cfg.temperature, chunk_size=cfg.logprob_chunk_size,
                                 micro_batches=micro_batches, mesh=mesh)
    policy = logprobs(graphdef, param_shardings=shardings.model_params())  # LoRA: adapters + base
    reference = None if base_graphdef is None else logprobs(base_graphdef, param_shardings=shardings.frozen)
    return GRPOPrograms(cfg, update, policy, reference)


def rollout_logprobs(programs: GRPOPrograms, batch: dict[str, jax.Array], policy_params: Any,
                     ref_params: Any | None, recompute_old: bool) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """The batch with its rollout log-probs, computed once per rollout and outside the gradient: the
    reference's `ref_logp` exactly when β > 0 and, with `recompute_old`, `old_logp` recomputed
    teacher-forced from `policy_params` (the params that sampled; with rl.off_policy_steps=1 those the update
    starts from, one step after the sampler's: train/off_policy.py); with the sampler/trainer correction
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
        reference = programs.logprobs if programs.ref_logprobs is None else programs.ref_logprobs
        batch[train_step.REF_LOGP] = reference(ref_params, *train_step.logprob_inputs(batch))
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

"""What the stages read, derived once from the experiment's checked blocks, before anything is written or run.

The blocks (train/blocks.py, made by `config_boundary.experiment`) check every key's type, bounds and choices and
the rules between keys; `validate(blocks)` derives what the stages use from them (samplers parsed, the GRPO
objective, optimizer settings, padding buckets, the reward model's and the audit's settings) and returns
`Settings`; a bad value is one line naming `config.<key>` and the value. Per-step code reads the typed specs
(`RolloutSpec`, `GRPOConfig`) instead of the config, so the train rollout and the eval rollout cannot silently share
a field (eval has its own max_new_tokens). `experiments.sweep` validates every variant before running any.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from rubric_jax import data, files, grpo, padding, sampling, sharding
from rubric_jax.judges.reward_model import RewardModelConfig
from rubric_jax.loader import resolve_attention
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.lora import LoraConfig
from rubric_jax.train import blocks, rollout, state as train_state
from rubric_jax.train.audit import AuditSettings
from rubric_jax.train.dynamic import DynamicSampling, parse_group_selection
from rubric_jax.train.off_policy import OffPolicy, off_policy
from rubric_jax.train.oscillation import OscillationRule

# Input files a run reads (a tfds:NAME data set is a directory of its own, checked where it is read).
INPUT_FILES = ("data.train", "data.eval", "data.sft", "data.rubric", "data.golden", "data.rubric_correction",
               "model.config_json", "audit.rubric")
EXPORT_WHICH = blocks.EXPORT_WHICH
_GRPO_KEYS = {"kl_coef": "beta", "loss_norm_length": "max_new_tokens", "temperature": "sampler"}  # GRPOConfig -> rl



@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """What one rollout samples: `n` responses per question with `sampler`, at most `max_new_tokens` each;
    prompts are left-padded to one of `prompt_buckets`, responses to one of `response_buckets`."""

    sampler: str
    n: int
    max_new_tokens: int
    prompt_buckets: tuple[int, ...]
    response_buckets: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """config.mesh: the training mesh and the decode layout (mesh.rollout) over the same devices."""

    training: sharding.MeshConfig
    rollout_tensor: int  # mesh.rollout.tensor: tensor-parallel group of the decode layout
    rollout_param_dtype: str  # mesh.rollout.param_dtype: one of blocks.ROLLOUT_DTYPES


@dataclasses.dataclass(frozen=True)
class SFTSpec:
    """The cold-start SFT stage (config.sft, config.data.sft); its schedule's length comes from the data."""

    data: str  # config.data.sft
    batch_size: int
    epochs: int
    optimizer: train_state.OptimizerConfig  # total_steps: a placeholder until `optimizer_for` knows it
    lora: LoraConfig | None = None  # config.lora when "sft" is one of its stages: trained through adapters

    def steps(self, num_examples: int) -> int:
        """Stage steps (batches) over `num_examples` examples: `epochs` passes, the last batch of each rounded up."""
        return self.epochs * -(-num_examples // self.batch_size)

    def optimizer_for(self, total_steps: int) -> train_state.OptimizerConfig:
        """The optimizer settings for a stage of `total_steps` updates (the cosine schedule's length)."""
        try:
            return dataclasses.replace(self.optimizer,
                                       total_steps=total_steps if self.optimizer.schedule == "cosine" else None)
        except ValueError as e:
            raise ValueError(f"config.sft: {e}") from None


@dataclasses.dataclass(frozen=True)
class RLSpec:
    """The GRPO stage's counts and optimizer (config.rl; the objective is `Settings.grpo`)."""

    steps: int
    questions_per_step: int
    micro_batches: int  # 0: auto, the fewest that fit the device's memory (train/micro_batching.py)
    beta: float  # KL coefficient: a reference is loaded iff > 0
    max_nan_streak: int
    optimizer: train_state.OptimizerConfig  # over every update: steps x updates_per_batch
    adjustable_lr: bool  # rl.lr_on_oscillation: a learning-rate factor in the optimizer state
    lora: LoraConfig | None = None  # config.lora when "grpo" is one of its stages: trained through adapters


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the stages use that is derived from the blocks (built once at start-up), and the blocks themselves
    (`config`: every key as set, e.g. `config.rl.updates_per_batch`, `config.judge`, `config.seed`)."""

    config: blocks.ExperimentConfig
    grpo: grpo.GRPOConfig | None  # None when "grpo" is not a stage
    train_rollout: RolloutSpec  # GRPO rollouts (rl.*)
    eval_rollout: RolloutSpec  # held-out evals (eval.*): its own sampler and max_new_tokens
    sft_response_buckets: tuple[int, ...]
    shaping: rollout.Shaping  # rl.advantage, rl.overlong_*, rl.mask_truncated
    oscillation: OscillationRule | None  # rl.lr_on_oscillation and its rule, None when off
    dynamic_sampling: DynamicSampling | None  # rl.dynamic_sampling or rl.group_selection, None when both are off
    off_policy: OffPolicy  # rl.off_policy_steps (train/off_policy.py)
    reward_model: RewardModelConfig | None  # config.reward, when a reward model scores the rollouts
    audit: AuditSettings | None  # config.audit, None when it has no judge (train/audit.py)
    mesh: MeshSpec
    sft: SFTSpec | None  # None when "sft" is not a stage
    rl: RLSpec | None  # None when "grpo" is not a stage

    @property
    def lora(self) -> LoraConfig | None:
        """The run's adapters (config.lora) when a configured stage trains through them, else None."""
        return next((spec.lora for spec in (self.sft, self.rl) if spec is not None and spec.lora is not None), None)

def _fail(key: str, value: Any, why: str) -> None:
    raise ValueError(f"config.{key}={value!r}: {why}")


def _sampler(sampler: str, key: str) -> sampling.Sampler:
    try:
        return sampling.parse_sampler(sampler)
    except (ValueError, TypeError) as e:
        raise ValueError(f"config.{key}: {e}") from None


def grpo_config(rl: blocks.RLBlock) -> grpo.GRPOConfig:
    """The objective's settings from the rl block (its rollout sampler's temperature among them)."""
    norm_length = rl.max_new_tokens if rl.loss_aggregation == "seq_mean_token_sum_norm" else None
    try:
        return grpo.GRPOConfig(group_size=rl.group_size, kl_coef=rl.beta, kl_estimator=rl.kl_estimator,
                               clip_low=rl.clip_low, clip_high=rl.clip_high, advantage_scaling=rl.advantage_scaling,
                               advantage_eps=rl.advantage_eps, loss_aggregation=rl.loss_aggregation,
                               loss_norm_length=norm_length, temperature=rollout.rollout_temperature(rl.sampler),
                               importance_level=rl.importance_level, clip_ratio_c=_off_if_zero(rl.clip_ratio_c),
                               kl_cap=_off_if_zero(rl.kl_cap),
                               behaviour_correction_cap=_off_if_zero(rl.behaviour_correction_cap),
                               **{k: getattr(rl, k) for k in grpo.LOSS_KEYS})
    except ValueError as e:
        field = re.match(r"GRPOConfig\.(\w+)=", str(e))
        if field is None:
            raise
        raise ValueError(f"config.rl.{_GRPO_KEYS.get(field.group(1), field.group(1))}: {e}") from None


def _off_if_zero(value: float) -> float | None:
    """A config number whose 0 means "off" (ml-collections keys keep one type, so not None)."""
    return None if value == 0 else value


def shaping(rl: blocks.RLBlock) -> rollout.Shaping:
    """The rl block's reward-shaping options (advantage mode, DAPO overlong shaping and filtering)."""
    fields = {"advantage": rl.advantage, "overlong_buffer": rl.overlong_buffer,
              "overlong_penalty": rl.overlong_penalty, "mask_truncated": rl.mask_truncated}
    try:
        return rollout.Shaping(**fields, max_new_tokens=rl.max_new_tokens)
    except ValueError as e:
        field = str(e).split("=", 1)[0]
        raise ValueError(f"config.rl.{e}" if field in fields else f"config.rl: {e}") from None


def dynamic_sampling(rl: blocks.RLBlock) -> DynamicSampling | None:
    """The refill rounds' settings (train/dynamic.py) with DAPO's spread rule (rl.dynamic_sampling_*) or
    rl.group_selection's rule (its rounds bounded by rl.dynamic_sampling_max_rounds too: one refill mechanism, one
    rule at a time, so one bound; DAPO's spread threshold is refused with it), or None when both are off."""
    try:
        selection = parse_group_selection(rl.group_selection)
    except ValueError as e:
        raise ValueError(f"config.rl.group_selection={rl.group_selection!r}: {e}") from None
    if selection is not None and rl.dynamic_sampling:
        _fail("rl.group_selection", rl.group_selection, "rl.dynamic_sampling=True selects groups by its spread "
              "threshold: set one of the two (both refill from the next questions)")
    if selection is None and not rl.dynamic_sampling:
        return None
    if selection is not None and rl.dynamic_sampling_min_spread:
        _fail("rl.dynamic_sampling_min_spread", rl.dynamic_sampling_min_spread, f"it is rl.dynamic_sampling's "
              f"spread threshold; rl.group_selection={rl.group_selection!r} keeps groups by their std and would "
              f"ignore it (only rl.dynamic_sampling_max_rounds, the refill rounds' bound, applies to both)")
    try:
        rule = DynamicSampling(rl.dynamic_sampling_min_spread, rl.dynamic_sampling_max_rounds, *selection or ())
    except ValueError as e:
        raise ValueError(f"config.rl.dynamic_sampling_{e}") from None
    rounds = rule.rounds_needed()
    if rounds is not None and rounds > rule.max_rounds + 1:
        _fail("rl.group_selection", rl.group_selection, f"keeping that top fraction takes {rounds} sampling rounds "
              f"a step, rl.dynamic_sampling_max_rounds={rule.max_rounds} allows {rule.max_rounds + 1}: set "
              f"rl.dynamic_sampling_max_rounds={rounds - 1} (it bounds group_selection's refill rounds too)")
    return rule


def oscillation_rule(rl: blocks.RLBlock) -> OscillationRule | None:
    """The learning-rate drop's rule (rl.oscillation_*), or None when rl.lr_on_oscillation is off."""
    if not rl.lr_on_oscillation:
        return None
    fields = {"window": "oscillation_window", "ratio": "oscillation_ratio", "min_swing": "oscillation_min_swing",
              "factor": "lr_drop_factor", "min_factor": "min_lr_factor"}
    try:
        return OscillationRule(**{field: getattr(rl, key) for field, key in fields.items()})
    except ValueError as e:
        field = str(e).split("=", 1)[0]
        raise ValueError(f"config.rl.{fields[field]}{str(e)[len(field):]}") from None


def optimizer_config(stage: blocks.SFTBlock | blocks.RLBlock, total_steps: int | None, block: str
                     ) -> train_state.OptimizerConfig:
    """AdamW settings of one stage (the sft and rl blocks carry the same optimizer fields)."""
    try:
        return train_state.OptimizerConfig(
            learning_rate=stage.lr, warmup_steps=stage.warmup_steps, schedule=stage.schedule,
            total_steps=total_steps if stage.schedule == "cosine" else None,
            weight_decay=stage.weight_decay, max_grad_norm=stage.grad_clip)
    except ValueError as e:
        raise ValueError(f"config.{block}: {e}") from None


def model_overrides(model: blocks.ModelBlock, backend: str | None = None) -> dict[str, Any]:
    """The ModelConfig fields the experiment config sets on top of the HF config.json, for a model that runs
    on `backend` (default: jax's; see `loader.resolve_attention`)."""
    return dict(param_dtype=model.param_dtype, compute_dtype=model.compute_dtype, remat=model.remat,
                remat_policy=model.remat_policy, scan_layers=model.scan_layers,
                attention=resolve_attention(model.attention, model.compute_dtype, "config.model.attention", backend))


def model_config(model: blocks.ModelBlock, backend: str | None = None) -> ModelConfig:
    """The policy's ModelConfig: the checkpoint's config.json (or `config_json` for a random init) plus overrides."""
    overrides = model_overrides(model, backend)
    if model.checkpoint:
        return ModelConfig.from_hf_dir(model.checkpoint, **overrides)
    if not model.config_json:
        raise ValueError("config.model: give `checkpoint` (a HF directory) or `config_json` (for a random init)")
    return ModelConfig.from_hf_dict(json.loads(files.read_text(model.config_json, "model config")), **overrides)


def reward_model_config(reward: blocks.RewardBlock) -> RewardModelConfig | None:
    """The reward model's settings, or None when rubrics score the rollouts (the keys a reward model excludes are
    refused by `blocks.ExperimentConfig.validate`)."""
    if reward.source == "rubric":
        return None
    return RewardModelConfig(max_len=reward.model_max_len, batch_size=reward.model_batch_size,
                             center=reward.model_center, scale=reward.model_scale)


def audit_settings(audit: blocks.AuditBlock) -> AuditSettings | None:
    """The audit's settings (train/audit.py), or None when its judge has no checkpoint or endpoint (no audit)."""
    if not audit.judge.has_judge:
        return None
    return AuditSettings(audit.judge, audit.rubric, audit.sample_size, audit.window)


def _check_input_files(config: blocks.ExperimentConfig) -> None:
    """Every input file of INPUT_FILES that exists must be a regular file (a FIFO would block the run forever,
    /dev/zero fill memory); a missing one is the loader's error."""
    for key in INPUT_FILES:
        block, field = key.split(".")
        value = getattr(getattr(config, block), field)
        if value and not str(value).startswith(data.TFDS_PREFIX) and os.path.lexists(value):
            try:
                files.check_input_file(value, field)
            except files.PathError as e:
                raise ValueError(f"config.{key}={value!r}: {e}") from None


def validate(config: blocks.ExperimentConfig) -> Settings:
    """What the stages read, derived from the checked blocks; raises ValueError naming `config.<key>` and the bad
    value where a derived setting refuses it (a sampler, the GRPO objective, the optimizer, an input file)."""
    _check_input_files(config)
    stages, rl = config.stages, config.rl
    _sampler(config.eval.sampler, "eval.sampler")
    for block in ("sft", "rl"):  # the schedule total is known later (cosine needs it): any valid length here
        optimizer_config(getattr(config, block), getattr(config, block).warmup_steps + 1, block)
    _sampler(rl.sampler, "rl.sampler")  # before the GRPO objective, which reads its temperature
    grpo_cfg = grpo_config(rl) if "grpo" in stages else None
    buckets = lambda max_len: padding.length_buckets(max_len, config.data.length_buckets)  # noqa: E731
    prompts = buckets(config.data.max_prompt_len)
    train = RolloutSpec(rl.sampler, rl.group_size, rl.max_new_tokens, prompts, buckets(rl.max_new_tokens))
    evaluation = RolloutSpec(config.eval.sampler, 1, config.eval.max_new_tokens, prompts,
                             buckets(config.eval.max_new_tokens))
    return Settings(config, grpo_cfg, train, evaluation, buckets(config.sft.max_response_len), shaping(rl),
                    oscillation_rule(rl), dynamic_sampling(rl), off_policy(rl), reward_model_config(config.reward),
                    audit_settings(config.audit), mesh_spec(config.mesh), sft_spec(config) if "sft" in stages else None,
                    rl_spec(rl, lora_config(config.lora, "grpo")) if "grpo" in stages else None)


def lora_config(block: blocks.LoraBlock, stage: str) -> LoraConfig | None:
    """The adapters `stage` trains through (config.lora), or None when it trains every weight."""
    if not block.rank or stage not in block.stages:
        return None
    try:
        return LoraConfig(rank=block.rank, alpha=float(block.alpha), dropout=block.dropout, targets=block.targets)
    except ValueError as e:
        raise ValueError(f"config.lora: {e}") from None


def mesh_spec(mesh: blocks.ExperimentMeshBlock) -> MeshSpec:
    """config.mesh as a MeshSpec."""
    return MeshSpec(sharding.MeshConfig(mesh.data, mesh.fsdp, mesh.tensor), mesh.rollout.tensor,
                    mesh.rollout.param_dtype)


def sft_spec(config: blocks.ExperimentConfig) -> SFTSpec:
    """The SFT stage's settings; the optimizer's placeholder length is any valid one (cosine needs one)."""
    sft = config.sft
    return SFTSpec(config.data.sft, sft.batch_size, sft.epochs, optimizer_config(sft, sft.warmup_steps + 1, "sft"),
                   lora_config(config.lora, "sft"))


def rl_spec(rl: blocks.RLBlock, lora: LoraConfig | None = None) -> RLSpec:
    """The GRPO stage's counts and optimizer, its schedule over every update (`steps` x `updates_per_batch`), and
    the adapters it trains through (None: every weight)."""
    return RLSpec(rl.steps, rl.questions_per_step, rl.micro_batches, rl.beta, rl.max_nan_streak,
                  optimizer_config(rl, rl.steps * rl.updates_per_batch, "rl"), rl.lr_on_oscillation, lora)


def check_positions(settings: Settings, max_positions: int) -> None:
    """Every padded batch a stage builds (the largest prompt bucket plus the largest response bucket) fits
    the model's `max_positions`; else one line naming the response key that overflows (a batch padded past
    the positions fails mid-run, or exhausts device memory, after minutes of start-up)."""
    prompt = max(settings.train_rollout.prompt_buckets)
    train, evaluation = settings.train_rollout, settings.eval_rollout
    budgets = [("sft.max_response_len", settings.config.sft.max_response_len, settings.sft_response_buckets)
               ] if "sft" in settings.config.stages else []
    if "grpo" in settings.config.stages:
        budgets += [("rl.max_new_tokens", train.max_new_tokens, train.response_buckets),
                    ("eval.max_new_tokens", evaluation.max_new_tokens, evaluation.response_buckets)]
    for key, value, buckets in budgets:
        if prompt + max(buckets) > max_positions:
            _fail(key, value, f"responses pad to {max(buckets)} tokens after prompts of up to {prompt} "
                  f"(config.data.max_prompt_len's bucket): {prompt + max(buckets)} positions, more than the model's "
                  f"max_position_embeddings ({max_positions})")

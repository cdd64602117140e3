"""The experiment config checked once, before anything is written or run, and the typed specs the stages read.

`validate(config)` checks every value `experiments.run` uses (counts, enum-like strings, samplers, dtypes,
optimizer and GRPO settings) and returns `Settings`; a bad value is one line naming `config.<key>` and
the value. Per-step code reads the typed specs (`RolloutSpec`, `GRPOConfig`) instead of the config, so
the train rollout and the eval rollout cannot silently share a field (eval has its own max_new_tokens).
`experiments.sweep` calls `validate` on every variant before running any.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any

import ml_collections

from rubric_jax import counts, data, files, grpo, padding, sampling, sharding
from rubric_jax.judges.reward_model import RewardModelConfig
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.loader import ATTENTION_CHOICES, resolve_attention
from rubric_jax.models.config import REMAT_POLICIES, ModelConfig
from rubric_jax.train import rollout, state as train_state
from rubric_jax.train.audit import AuditSettings
from rubric_jax.train.dynamic import DynamicSampling
from rubric_jax.train.off_policy import OffPolicy, off_policy
from rubric_jax.train.oscillation import OscillationRule

STAGES = ("sft", "grpo")
REWARD_SOURCES = ("rubric", "reward_model")  # config.reward.source
EXPORT_WHICH = ("latest", "best")  # config.export.which, experiments.export/evaluate config.which
ROLLOUT_DTYPES = ("compute", "float32", "bfloat16")  # mesh.rollout.param_dtype
COMPUTE_DTYPES = ("float32", "bfloat16")  # model.compute_dtype
# Every integer count of an experiment's blocks: (smallest, largest) allowed (rubric_jax/counts.py). The smallest
# keeps a zero or negative count from silently skipping a stage; the largest, a typo from hours of work or an
# exhausted memory. The judge blocks' counts are judges/spec.py's COUNT_BOUNDS, config.qurl's qurl/config.py's.
COUNT_BOUNDS = {
    "seed": (0, counts.SEED),
    "sft.batch_size": (1, 1 << 16), "sft.epochs": (1, 10**4), "sft.max_response_len": (1, counts.TOKENS),
    "sft.warmup_steps": (0, counts.STEPS),
    "rl.steps": (1, counts.STEPS), "rl.questions_per_step": (1, 1 << 16), "rl.group_size": (2, 1024),
    "rl.max_new_tokens": (1, counts.TOKENS), "rl.updates_per_batch": (1, 64), "rl.micro_batches": (1, 1 << 16),
    "rl.warmup_steps": (0, counts.STEPS), "rl.max_nan_streak": (1, 10**4), "rl.rollout_chunks": (1, 1 << 16),
    "rl.dynamic_weights_window": (1, 10**6), "rl.dynamic_sampling_max_rounds": (1, 100),
    "rl.oscillation_window": (3, 10**6), "rl.overlong_buffer": (0, counts.TOKENS),
    "eval.every_steps": (1, counts.STEPS), "eval.max_questions": (1, 10**6), "eval.max_new_tokens": (1, counts.TOKENS),
    "checkpoint.every_steps": (1, counts.STEPS), "checkpoint.keep": (1, 1000),
    "data.max_prompt_len": (1, counts.TOKENS), "data.length_buckets": (1, 16),
    "reward.model_max_len": (1, counts.TOKENS), "reward.model_batch_size": (1, 1 << 16),
    "monitor.window_steps": (1, 10**6), "audit.sample_size": (3, 10**5), "audit.window": (1, 10**4),
    "log.samples_per_step": (0, 10**4),
    "mesh.data": (1, counts.DEVICES), "mesh.tensor": (1, counts.DEVICES), "mesh.rollout.tensor": (1, counts.DEVICES),
}
# Input files a run reads (a tfds:NAME data set is a directory of its own, checked where it is read).
INPUT_FILES = ("data.train", "data.eval", "data.sft", "data.rubric", "data.golden", "data.rubric_correction",
               "model.config_json", "audit.rubric")
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
    rollout_param_dtype: str  # mesh.rollout.param_dtype: one of ROLLOUT_DTYPES


@dataclasses.dataclass(frozen=True)
class SFTSpec:
    """The cold-start SFT stage (config.sft, config.data.sft); its schedule's length comes from the data."""

    data: str  # config.data.sft
    batch_size: int
    epochs: int
    optimizer: train_state.OptimizerConfig  # total_steps: a placeholder until `optimizer_for` knows it

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
    micro_batches: int
    beta: float  # KL coefficient: a reference is loaded iff > 0
    max_nan_streak: int
    optimizer: train_state.OptimizerConfig  # over every update: steps x updates_per_batch
    adjustable_lr: bool  # rl.lr_on_oscillation: a learning-rate factor in the optimizer state


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    """config.checkpoint: save cadence and retention."""

    every_steps: int
    keep: int
    keep_best: bool  # every eval step saves, and the best-ranked checkpoint outlives `keep`


@dataclasses.dataclass(frozen=True)
class ExportSpec:
    """config.export: the HF export at the end of a run."""

    at_end: bool
    which: str  # one of EXPORT_WHICH


@dataclasses.dataclass(frozen=True)
class Settings:
    """The validated pieces of a config that the stages use (built once at start-up)."""

    stages: tuple[str, ...]
    grpo: grpo.GRPOConfig | None  # None when "grpo" is not a stage
    train_rollout: RolloutSpec  # GRPO rollouts (rl.*)
    eval_rollout: RolloutSpec  # held-out evals (eval.*): its own sampler and max_new_tokens
    sft_response_buckets: tuple[int, ...]
    missing_scores: str  # rl.missing_scores
    shaping: rollout.Shaping  # rl.advantage, rl.overlong_*, rl.mask_truncated
    oscillation: OscillationRule | None  # rl.lr_on_oscillation and its rule, None when off
    dynamic_sampling: DynamicSampling | None  # rl.dynamic_sampling and its settings, None when off
    rollout_chunks: int  # rl.rollout_chunks: sampler calls per rollout, each judged while the next samples
    off_policy: OffPolicy  # rl.off_policy_steps (train/off_policy.py)
    recompute_old_logprobs: bool  # rl.recompute_old_logprobs
    updates_per_batch: int  # rl.updates_per_batch
    samples_per_step: int  # log.samples_per_step
    eval_every: int  # eval.every_steps
    reward_model: RewardModelConfig | None  # config.reward, when a reward model scores the rollouts
    judge: JudgeSpec  # config.judge
    audit: AuditSettings | None  # config.audit, None when it has no judge (train/audit.py)
    seed: int  # config.seed: parameter init, data order, sampling and judging
    mesh: MeshSpec
    sft: SFTSpec | None  # None when "sft" is not a stage
    rl: RLSpec | None  # None when "grpo" is not a stage
    checkpoint: CheckpointSpec
    export: ExportSpec


def _get(config: ml_collections.ConfigDict, key: str):
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def _fail(key: str, value, why: str) -> None:
    raise ValueError(f"config.{key}={value!r}: {why}")


def _choice(config: ml_collections.ConfigDict, key: str, choices) -> str:
    value = _get(config, key)
    if value not in choices:
        _fail(key, value, f"expected one of {tuple(choices)}")
    return value


def _sampler(config: ml_collections.ConfigDict, key: str) -> sampling.Sampler:
    try:
        return sampling.parse_sampler(_get(config, key))
    except (ValueError, TypeError) as e:
        raise ValueError(f"config.{key}: {e}") from None


def grpo_config(rl: ml_collections.ConfigDict) -> grpo.GRPOConfig:
    """The objective's settings from the config's rl block, validated with the rest of the rl block's
    GRPO choices (rollout sampler, missing_scores)."""
    if rl.missing_scores not in rollout.MISSING_SCORES:
        raise ValueError(f"config.rl.missing_scores={rl.missing_scores!r}: must be one of {rollout.MISSING_SCORES}")
    norm_length = rl.max_new_tokens if rl.loss_aggregation == "seq_mean_token_sum_norm" else None
    try:
        return grpo.GRPOConfig(group_size=rl.group_size, kl_coef=rl.beta, kl_estimator=rl.kl_estimator,
                               clip_low=rl.clip_low, clip_high=rl.clip_high, advantage_scaling=rl.advantage_scaling,
                               advantage_eps=rl.advantage_eps, loss_aggregation=rl.loss_aggregation,
                               loss_norm_length=norm_length, temperature=rollout.rollout_temperature(rl.sampler),
                               importance_level=rl.importance_level, clip_ratio_c=_off_if_zero(rl.clip_ratio_c),
                               kl_cap=_off_if_zero(rl.kl_cap),
                               behaviour_correction_cap=_off_if_zero(rl.behaviour_correction_cap))
    except ValueError as e:
        field = re.match(r"GRPOConfig\.(\w+)=", str(e))
        if field is None:
            raise
        raise ValueError(f"config.rl.{_GRPO_KEYS.get(field.group(1), field.group(1))}: {e}") from None


def _off_if_zero(value: float) -> float | None:
    """A config number whose 0 means "off" (ml-collections keys keep one type, so not None)."""
    return None if value == 0 else value


def shaping(rl: ml_collections.ConfigDict) -> rollout.Shaping:
    """The rl block's reward-shaping options (advantage mode, DAPO overlong shaping and filtering)."""
    fields = {"advantage": rl.advantage, "overlong_buffer": rl.overlong_buffer,
              "overlong_penalty": rl.overlong_penalty, "mask_truncated": rl.mask_truncated}
    try:
        return rollout.Shaping(**fields, max_new_tokens=rl.max_new_tokens)
    except ValueError as e:
        field = str(e).split("=", 1)[0]
        raise ValueError(f"config.rl.{e}" if field in fields else f"config.rl: {e}") from None


def dynamic_sampling(rl: ml_collections.ConfigDict) -> DynamicSampling | None:
    """DAPO's dynamic sampling settings (rl.dynamic_sampling_*), or None when rl.dynamic_sampling is off."""
    if not isinstance(rl.dynamic_sampling, bool):
        _fail("rl.dynamic_sampling", rl.dynamic_sampling, "expected True or False")
    if not rl.dynamic_sampling:
        return None
    try:
        return DynamicSampling(rl.dynamic_sampling_min_spread, rl.dynamic_sampling_max_rounds)
    except ValueError as e:
        raise ValueError(f"config.rl.dynamic_sampling_{e}") from None


def rollout_chunks(rl: ml_collections.ConfigDict) -> int:
    """rl.rollout_chunks (an integer >= 1, checked with the counts): it splits the step's questions into whole
    groups (train/collect.py; the decode layout's split is checked by `experiment.build`)."""
    if rl.questions_per_step % rl.rollout_chunks:
        _fail("rl.rollout_chunks", rl.rollout_chunks, f"must divide rl.questions_per_step={rl.questions_per_step}: "
              "a chunk holds whole groups")
    return rl.rollout_chunks


def oscillation_rule(rl: ml_collections.ConfigDict) -> OscillationRule | None:
    """The learning-rate drop's rule (rl.oscillation_*), or None when rl.lr_on_oscillation is off."""
    if not isinstance(rl.lr_on_oscillation, bool):
        _fail("rl.lr_on_oscillation", rl.lr_on_oscillation, "expected True or False")
    if not rl.lr_on_oscillation:
        return None
    fields = {"window": "oscillation_window", "ratio": "oscillation_ratio", "min_swing": "oscillation_min_swing",
              "factor": "lr_drop_factor", "min_factor": "min_lr_factor"}
    try:
        return OscillationRule(**{field: rl[key] for field, key in fields.items()})
    except ValueError as e:
        field = str(e).split("=", 1)[0]
        raise ValueError(f"config.rl.{fields[field]}{str(e)[len(field):]}") from None


def optimizer_config(stage_cfg: ml_collections.ConfigDict, total_steps: int | None, block: str
                     ) -> train_state.OptimizerConfig:
    """AdamW settings of one stage (the sft and rl blocks carry the same optimizer fields)."""
    try:
        return train_state.OptimizerConfig(
            learning_rate=stage_cfg.lr, warmup_steps=stage_cfg.warmup_steps, schedule=stage_cfg.schedule,
            total_steps=total_steps if stage_cfg.schedule == "cosine" else None,
            weight_decay=stage_cfg.weight_decay, max_grad_norm=stage_cfg.grad_clip)
    except ValueError as e:
        raise ValueError(f"config.{block}: {e}") from None


def model_overrides(config: ml_collections.ConfigDict, backend: str | None = None) -> dict[str, Any]:
    """The ModelConfig fields the experiment config sets on top of the HF config.json, for a model that runs
    on `backend` (default: jax's; see `loader.resolve_attention`)."""
    m = config.model
    return dict(param_dtype=m.param_dtype, compute_dtype=m.compute_dtype, remat=m.remat,
                remat_policy=m.get("remat_policy", "full"), scan_layers=m.scan_layers,  # older runs: "full"
                attention=resolve_attention(m.attention, m.compute_dtype, "config.model.attention", backend))


def model_config(config: ml_collections.ConfigDict, backend: str | None = None) -> ModelConfig:
    """The policy's ModelConfig: the checkpoint's config.json (or `config_json` for a random init) plus overrides."""
    overrides = model_overrides(config, backend)
    if config.model.checkpoint:
        return ModelConfig.from_hf_dir(config.model.checkpoint, **overrides)
    if not config.model.config_json:
        raise ValueError("config.model: give `checkpoint` (a HF directory) or `config_json` (for a random init)")
    return ModelConfig.from_hf_dict(json.loads(files.read_text(config.model.config_json, "model config")), **overrides)


def reward_model_config(config: ml_collections.ConfigDict) -> RewardModelConfig | None:
    """`config.reward` checked before anything loads: None when rubrics score the rollouts, else the reward
    model's settings. A key that the chosen source would ignore is an error, not a silent no-op."""
    r = config.reward
    if r.source not in REWARD_SOURCES:
        raise ValueError(f"config.reward.source={r.source!r}: expected one of {REWARD_SOURCES}")
    if r.source == "rubric":
        if r.model_checkpoint:
            raise ValueError("config.reward.model_checkpoint is set but config.reward.source='rubric' never reads "
                             "it; add --config.reward.source=reward_model or drop the checkpoint")
        return None
    if not r.model_checkpoint:
        raise ValueError("config.reward.source='reward_model' needs config.reward.model_checkpoint=DIR (a local "
                         "HF *ForSequenceClassification directory with one label)")
    if config.judge.checkpoint:
        raise ValueError("config.judge.checkpoint is set but config.reward.source='reward_model' scores with the "
                         "reward model alone; drop the judge")
    if config.rl.dynamic_weights:
        raise ValueError("config.rl.dynamic_weights re-weights rubric dimensions; a reward model has none")
    if config.rl.advantage == "per_dimension":
        raise ValueError("config.rl.advantage='per_dimension' normalises each rubric dimension; a reward model has "
                         "none (use 'sum_then_normalise')")
    if config.data.rubric_correction:
        raise ValueError("config.data.rubric_correction corrects judge scores; a reward model has none")
    if r.model_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"config.reward.model_dtype={r.model_dtype!r}: expected 'float32' or 'bfloat16'")
    return RewardModelConfig(max_len=r.model_max_len, batch_size=r.model_batch_size, center=r.model_center,
                             scale=r.model_scale)


def audit_settings(config: ml_collections.ConfigDict) -> AuditSettings | None:
    """config.audit checked (train/audit.py; its counts by COUNT_BOUNDS, sample_size >= 3: the fewest pairs a rank
    correlation needs): None when its judge has no checkpoint or endpoint (no audit)."""
    a = config.audit
    spec = JudgeSpec.from_config(a.judge, "config.audit.judge")
    if not isinstance(a.rubric, str):
        _fail("audit.rubric", a.rubric, "expected a rubric file, or '' for each row's own")
    if not spec.has_judge:
        if a.rubric:
            _fail("audit.rubric", a.rubric, "there is no audit judge to read it: set config.audit.judge.checkpoint")
        return None
    if config.reward.source != "rubric":
        _fail("audit.judge.checkpoint", a.judge.checkpoint, "the audit compares LLM-judged rubric dimensions; "
              f"config.reward.source={config.reward.source!r} has none")
    return AuditSettings(spec, a.rubric, a.sample_size, a.window)


def _check_input_files(config: ml_collections.ConfigDict) -> None:
    """Every input file of INPUT_FILES that exists must be a regular file (a FIFO would block the run forever,
    /dev/zero fill memory); a missing one is the loader's error."""
    for key in INPUT_FILES:
        value = _get(config, key)
        if value and not str(value).startswith(data.TFDS_PREFIX) and os.path.lexists(value):
            try:
                files.check_input_file(value, key.split(".")[-1])
            except files.PathError as e:
                raise ValueError(f"config.{key}={value!r}: {e}") from None


def validate(config: ml_collections.ConfigDict) -> Settings:
    """Checks every value a run reads; raises ValueError naming `config.<key>` and the bad value."""
    _check_input_files(config)
    stages = tuple(config.stages)
    if not stages or sorted(set(stages), key=stages.index) != list(stages) or not set(stages) <= set(STAGES):
        _fail("stages", stages, f"expected a non-empty subset of {STAGES} without repeats")
    for key, (smallest, largest) in COUNT_BOUNDS.items():
        why = counts.problem(_get(config, key), smallest, largest)
        if why is not None:
            _fail(key, _get(config, key), why)
    if config.mesh.fsdp != -1 and counts.problem(config.mesh.fsdp, 1, counts.DEVICES) is not None:
        _fail("mesh.fsdp", config.mesh.fsdp, f"expected an integer in [1, {counts.DEVICES}], or -1 for every device left")
    for key in ("sft.lr", "rl.lr"):
        if not (isinstance(_get(config, key), (int, float)) and math.isfinite(_get(config, key))):
            _fail(key, _get(config, key), "expected a finite number")
    if config.model.param_dtype != "float32":
        _fail("model.param_dtype", config.model.param_dtype,
              "training keeps float32 master weights; set model.compute_dtype='bfloat16' for bf16 compute")
    for key in ("checkpoint.keep_best", "export.at_end", "reward.gates_first"):
        if not isinstance(_get(config, key), bool):
            _fail(key, _get(config, key), "expected True or False")
    _choice(config, "export.which", EXPORT_WHICH)
    if config.export.which == "best" and "grpo" not in stages:
        _fail("export.which", "best", "the best checkpoint is the best-evaluated GRPO one; this run has no GRPO stage")
    _choice(config, "model.compute_dtype", COMPUTE_DTYPES)
    _choice(config, "model.remat_policy", REMAT_POLICIES)
    if _choice(config, "model.attention", ATTENTION_CHOICES) == "cudnn" and config.model.compute_dtype == "float32":
        _fail("model.attention", "cudnn", "cuDNN flash attention runs in bfloat16: set model.compute_dtype='bfloat16'")
    _choice(config, "mesh.rollout.param_dtype", ROLLOUT_DTYPES)
    judge = JudgeSpec.from_config(config.judge, "config.judge")
    _sampler(config, "eval.sampler")
    for block in ("sft", "rl"):  # the schedule total is known later (cosine needs it): any valid length here
        optimizer_config(config[block], _get(config, f"{block}.warmup_steps") + 1, block)
    _sampler(config, "rl.sampler")  # before the GRPO objective, which reads its temperature
    grpo_cfg = grpo_config(config.rl) if "grpo" in stages else None
    buckets = lambda max_len: padding.length_buckets(max_len, config.data.length_buckets)  # noqa: E731
    prompts = buckets(config.data.max_prompt_len)
    train = RolloutSpec(config.rl.sampler, config.rl.group_size, config.rl.max_new_tokens, prompts,
                        buckets(config.rl.max_new_tokens))
    evaluation = RolloutSpec(config.eval.sampler, 1, config.eval.max_new_tokens, prompts,
                             buckets(config.eval.max_new_tokens))
    if grpo_cfg is not None and grpo_cfg.behaviour_correction_cap is not None and not config.rl.recompute_old_logprobs:
        _fail("rl.behaviour_correction_cap", config.rl.behaviour_correction_cap, "the correction weighs the trainer's "
              "recomputed log-probs against the sampler's: set rl.recompute_old_logprobs=True")
    return Settings(stages, grpo_cfg, train, evaluation, buckets(config.sft.max_response_len),
                    config.rl.missing_scores, shaping(config.rl), oscillation_rule(config.rl), dynamic_sampling(config.rl),
                    rollout_chunks(config.rl), off_policy(config.rl),
                    config.rl.recompute_old_logprobs, config.rl.updates_per_batch, config.log.samples_per_step,
                    config.eval.every_steps, reward_model_config(config), judge, audit_settings(config), config.seed,
                    mesh_spec(config.mesh),
                    sft_spec(config) if "sft" in stages else None, rl_spec(config.rl) if "grpo" in stages else None,
                    CheckpointSpec(config.checkpoint.every_steps, config.checkpoint.keep, config.checkpoint.keep_best),
                    ExportSpec(config.export.at_end, config.export.which))


def mesh_spec(mesh: ml_collections.ConfigDict) -> MeshSpec:
    """config.mesh as a MeshSpec (its values checked by `validate`)."""
    return MeshSpec(sharding.MeshConfig(mesh.data, mesh.fsdp, mesh.tensor), mesh.rollout.tensor,
                    mesh.rollout.param_dtype)


def sft_spec(config: ml_collections.ConfigDict) -> SFTSpec:
    """The SFT stage's settings; the optimizer's placeholder length is any valid one (cosine needs one)."""
    sft = config.sft
    return SFTSpec(config.data.sft, sft.batch_size, sft.epochs, optimizer_config(sft, sft.warmup_steps + 1, "sft"))


def rl_spec(rl: ml_collections.ConfigDict) -> RLSpec:
    """The GRPO stage's counts and optimizer, its schedule over every update (`steps` x `updates_per_batch`)."""
    return RLSpec(rl.steps, rl.questions_per_step, rl.micro_batches, rl.beta, rl.max_nan_streak,
                  optimizer_config(rl, rl.steps * rl.updates_per_batch, "rl"), rl.lr_on_oscillation)


def check_positions(config: ml_collections.ConfigDict, settings: Settings, max_positions: int) -> None:
    """Every padded batch a stage builds (the largest prompt bucket plus the largest response bucket) fits
    the model's `max_positions`; else one line naming the response key that overflows (a batch padded past
    the positions fails mid-run, or exhausts device memory, after minutes of start-up)."""
    prompt = max(settings.train_rollout.prompt_buckets)
    budgets = [("sft.max_response_len", settings.sft_response_buckets)] if "sft" in settings.stages else []
    if "grpo" in settings.stages:
        budgets += [("rl.max_new_tokens", settings.train_rollout.response_buckets),
                    ("eval.max_new_tokens", settings.eval_rollout.response_buckets)]
    for key, buckets in budgets:
        if prompt + max(buckets) > max_positions:
            _fail(key, _get(config, key), f"responses pad to {max(buckets)} tokens after prompts of up to {prompt} "
                  f"(config.data.max_prompt_len's bucket): {prompt + max(buckets)} positions, more than the model's "
                  f"max_position_embeddings ({max_positions})")

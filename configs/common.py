"""Config blocks: small functions each returning one ConfigDict block (model, judge, mesh, data, rl, ...) that the
experiment files (configs/tiny.py, ...) and the command configs (configs/commands/*.py) compose.

The experiment's blocks come from their typed blocks (rubric_jax/train/blocks.py: every key's type, default, bounds
and one-line meaning with its source); the judge, qurl and command blocks are written here, every field with a
one-line comment giving its meaning and, where it comes from a paper, the source. Dependent values are derived in
code after command-line overrides, never here.
"""

from __future__ import annotations

import ml_collections

from rubric_jax import command_blocks
from rubric_jax.config_boundary import config_dict
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.qurl.config import BuildConfig
from rubric_jax.train import blocks


def judge_block() -> ml_collections.ConfigDict:
    """The LLM judge: generated from its block, rubric_jax/judges/spec.py JudgeSpec (each field's type, default,
    bounds and meaning, [hash] marking those that change verdicts and enter the judge hash)."""
    return config_dict(JudgeSpec)


def benchmark_judge_block() -> ml_collections.ConfigDict:
    """The judge of a public benchmark in experiments.evaluate (configs/judges/<benchmark>.py): the benchmark's own
    prompt, one verdict per item as its grader gives, and a budget for its graders' written justifications."""
    j = judge_block()
    j.mode = "benchmark"  # HelloBench, LongBench-Write: all criteria in one prompt; HealthBench, BiGGen: one per criterion.
    j.samples = 1  # The benchmarks report one grader verdict per item.
    j.max_retries = 3  # Re-prompt rounds for an unparseable verdict (LongBench-Write retries its grader too).
    j.max_new_tokens = 512  # Room for a justification per criterion before the verdict lines.
    return j


def model_block() -> ml_collections.ConfigDict:
    """config.model: train/blocks.py ModelBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.ModelBlock)


def reward_block() -> ml_collections.ConfigDict:
    """config.reward: train/blocks.py RewardBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.RewardBlock)


def mesh_block() -> ml_collections.ConfigDict:
    """A command's mesh axis sizes (rubric_jax/sharding.py MeshConfig: experiments.evaluate's policy); an experiment's
    mesh is train/blocks.py ExperimentMeshBlock."""
    b = ml_collections.ConfigDict()
    b.data = 1  # Data-parallel axis size.
    b.fsdp = -1  # Fully-sharded axis size (-1: all devices left).
    b.tensor = 1  # Tensor-parallel axis size.
    return b


def rollout_block() -> ml_collections.ConfigDict:
    """config.mesh.rollout: train/blocks.py RolloutMeshBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.RolloutMeshBlock)


def data_block() -> ml_collections.ConfigDict:
    """config.data: train/blocks.py DataBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.DataBlock)


def sft_block() -> ml_collections.ConfigDict:
    """config.sft: train/blocks.py SFTBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.SFTBlock)


def rl_block() -> ml_collections.ConfigDict:
    """config.rl: train/blocks.py RLBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.RLBlock)


def eval_block() -> ml_collections.ConfigDict:
    """config.eval: train/blocks.py EvalBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.EvalBlock)


def monitor_block() -> ml_collections.ConfigDict:
    """config.monitor: train/blocks.py MonitorBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.MonitorBlock)


def audit_block() -> ml_collections.ConfigDict:
    """config.audit: train/blocks.py AuditBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.AuditBlock)


def checkpoint_block() -> ml_collections.ConfigDict:
    """config.checkpoint: train/blocks.py CheckpointBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.CheckpointBlock)


def export_block() -> ml_collections.ConfigDict:
    """config.export: train/blocks.py ExportBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.ExportBlock)


def qurl_block() -> ml_collections.ConfigDict:
    """experiments.build_rubrics' QuRL case-wise rubric construction: generated from its block, rubric_jax/qurl/config.py
    BuildConfig (each key's default, bounds and meaning with its source)."""
    return config_dict(BuildConfig)


def log_block() -> ml_collections.ConfigDict:
    """config.log: train/blocks.py LogBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.LogBlock)


def sampler_block(sampler: str = "greedy", max_new_tokens: int = 256) -> ml_collections.ConfigDict:
    """How a command's model answers (experiments.generate, evaluate's policy, distill_judge's measurement):
    generated from its block, rubric_jax/command_blocks.py Sampler."""
    return config_dict(command_blocks.Sampler(sampler=sampler, max_new_tokens=max_new_tokens))


def decode_block() -> ml_collections.ConfigDict:
    """A model loaded for decoding only (experiments.generate): generated from its block, rubric_jax/command_blocks.py
    Decode (its decode layout over every local device, and dtypes)."""
    return config_dict(command_blocks.Decode)


def base_config() -> ml_collections.ConfigDict:
    """An experiment's full set of keys (experiments.run, sweep, build_rubrics; train/blocks.py ExperimentConfig):
    experiment files change values, never add keys (the config is locked)."""
    return config_dict(blocks.ExperimentConfig)
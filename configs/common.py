"""The ConfigDicts that config files start from, each generated from its typed block (rubric_jax/schema.py): an
experiment's keys (`base_config`, train/blocks.py ExperimentConfig), the judge's (`judge_block`, judges/spec.py
JudgeSpec; configs/judges/*.py start from it), qurl's, and the blocks the command configs (configs/commands/*.py)
share. A key's type, default, bounds and one-line meaning with its source live on its block's field, nowhere else;
dependent values are derived in code after command-line overrides, never here.
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


def qurl_block() -> ml_collections.ConfigDict:
    """experiments.build_rubrics' QuRL case-wise rubric construction: generated from its block, rubric_jax/qurl/config.py
    BuildConfig (each key's default, bounds and meaning with its source)."""
    return config_dict(BuildConfig)


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
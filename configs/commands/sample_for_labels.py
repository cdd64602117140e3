"""experiments.sample_for_labels's settings, generated from their block: rubric_jax/command_blocks.py SampleForLabels.

  ./launch.sh experiments.sample_for_labels --workdir=RUN --out=FILE.jsonl --config.n=300
"""

import ml_collections

from rubric_jax.command_blocks import SampleForLabels
from rubric_jax.config_boundary import config_dict


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant). Generated from the block: each key's type, default, bounds and meaning."""
    del arg
    return config_dict(SampleForLabels)

"""experiments.prepare_data's settings, generated from their block: rubric_jax/command_blocks.py PrepareData.

  ./launch.sh experiments.prepare_data --input=questions:Q.jsonl --out=runs/tfds --name=NAME --config.eval_size=16
"""

import ml_collections

from rubric_jax.command_blocks import PrepareData
from rubric_jax.config_boundary import config_dict


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant). Generated from the block: each key's type, default, bounds and meaning."""
    del arg
    return config_dict(PrepareData)

"""experiments.score's settings, generated from their block: rubric_jax/command_blocks.py Score.

  ./launch.sh experiments.score --rubric=R.yaml --responses=IN.jsonl --out=OUT.jsonl --config.batch_size=16
"""

import ml_collections

from rubric_jax.command_blocks import Score
from rubric_jax.config_boundary import config_dict


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant). Generated from the block: each key's type, default, bounds and meaning."""
    del arg
    return config_dict(Score)

"""experiments.calibrate's settings, generated from their block: rubric_jax/command_blocks.py Calibrate.

  ./launch.sh experiments.calibrate --rubric=R.yaml --labels=L.jsonl --out=DIR --config.against=judge
"""

import ml_collections

from rubric_jax.command_blocks import Calibrate
from rubric_jax.config_boundary import config_dict


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant). Generated from the block: each key's type, default, bounds and meaning."""
    del arg
    return config_dict(Calibrate)

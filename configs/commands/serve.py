"""experiments.serve's settings, generated from their block: rubric_jax/command_blocks.py Serve.

  ./launch.sh experiments.serve --checkpoint=rubric_jax/assets/tiny_judge --judge=configs/judges/tiny.py --config.port=8000
"""

import ml_collections

from rubric_jax.command_blocks import Serve
from rubric_jax.config_boundary import config_dict


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant). Generated from the block: each key's type, default, bounds and meaning."""
    del arg
    return config_dict(Serve)

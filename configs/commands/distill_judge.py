"""experiments.distill_judge's settings, generated from their block: rubric_jax/command_blocks.py DistillJudge.

  ./launch.sh experiments.distill_judge --out=DIR --rubric=R.yaml --config.dimensions=template --config.teacher=rules ...
"""

import ml_collections

from rubric_jax.command_blocks import DistillJudge
from rubric_jax.config_boundary import config_dict


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant). Generated from the block: each key's type, default, bounds and meaning."""
    del arg
    return config_dict(DistillJudge)

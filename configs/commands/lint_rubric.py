"""experiments.lint_rubric's settings, generated from their block: rubric_jax/command_blocks.py LintRubric.

  ./launch.sh experiments.lint_rubric --rubric=R.yaml --config.max_new_tokens=256
"""

import ml_collections

from rubric_jax.command_blocks import LintRubric
from rubric_jax.config_boundary import config_dict


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant). Generated from the block: each key's type, default, bounds and meaning."""
    del arg
    return config_dict(LintRubric)

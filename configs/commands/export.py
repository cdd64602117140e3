"""experiments.export's settings.

  ./launch.sh experiments.export --workdir=RUN --out=DIR --config.which=best
"""

import ml_collections

# Every integer setting: (smallest, largest), checked by experiments/cli.py before any work (rubric_jax/counts.py).
COUNT_BOUNDS = {}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant)."""
    del arg
    c = ml_collections.ConfigDict()
    c.which = "latest"  # latest, or best (highest logged eval/reward_mean).
    return c

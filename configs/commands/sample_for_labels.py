"""experiments.sample_for_labels's settings.

  ./launch.sh experiments.sample_for_labels --workdir=RUN --out=FILE.jsonl --config.n=300
"""

import ml_collections

from rubric_jax import counts

# Every integer setting: (smallest, largest), checked by experiments/cli.py before any work (rubric_jax/counts.py).
COUNT_BOUNDS = {"seed": (0, counts.SEED), "n": (1, 10**6)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant)."""
    del arg
    c = ml_collections.ConfigDict()
    c.seed = 0  # Seeds the stratified draw and the output order.
    c.n = 300  # Responses to label (RubricRL 3.2: 200-500).
    return c

"""experiments.score's settings. The judge is --judge.

  ./launch.sh experiments.score --rubric=R.yaml --responses=IN.jsonl --out=OUT.jsonl --config.batch_size=16
"""

import ml_collections

from rubric_jax import counts

# Every integer setting: (smallest, largest), checked by experiments/cli.py before any work (rubric_jax/counts.py).
COUNT_BOUNDS = {"seed": (0, counts.SEED), "batch_size": (1, 1 << 16)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant)."""
    del arg
    c = ml_collections.ConfigDict()
    c.seed = 0  # PRNG seed for judge sampling.
    c.batch_size = 64  # Rows per reward call (one batched judge call each).
    return c

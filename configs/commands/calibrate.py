"""experiments.calibrate's settings (rubric_jax/calibration/run.py Settings). The judge is --judge.

  ./launch.sh experiments.calibrate --rubric=R.yaml --labels=L.jsonl --out=DIR --config.against=judge
"""

import ml_collections

from rubric_jax import counts

# Every integer setting: (smallest, largest), checked by experiments/cli.py before any work (rubric_jax/counts.py).
COUNT_BOUNDS = {"seed": (0, counts.SEED), "bootstrap": (1, 100_000), "batch_size": (1, 1 << 16), "worst": (0, 10**4)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant)."""
    del arg
    c = ml_collections.ConfigDict()
    c.seed = 0  # Seeds judge sampling and the bootstrap.
    c.against = "labels"  # Judges vs labels, or judges vs judges (judge).
    # Red team (calibration/red_team.py): inject the payload suite into the responses labelled bad and report how often
    # a score rises by a level, per LLM dimension, instead of calibrating (against labels, no --compare).
    c.red_team = False
    c.threshold = 0.6  # Flag a dimension whose Spearman is below this (RubricRL 3.2).
    c.bootstrap = 1000  # Bootstrap resamples per 95% interval.
    c.batch_size = 64  # Rows per reward call (one batched judge call each).
    c.position_probe = True  # Score LLM dimensions again, anchors as written and reversed.
    c.worst = 5  # Disagreements listed per dimension.
    c.redundancy_threshold = 0.9  # Flag two dimensions whose Spearman reaches this (RubricRL 2.1, MECE).
    return c

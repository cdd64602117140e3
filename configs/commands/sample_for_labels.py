"""experiments.sample_for_labels's settings.

  ./launch.sh experiments.sample_for_labels --workdir=RUN --out=FILE.jsonl --config.n=300
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant)."""
    del arg
    c = ml_collections.ConfigDict()
    c.seed = 0  # Seeds the stratified draw and the output order.
    c.n = 300  # Responses to label (RubricRL 3.2: 200-500).
    return c

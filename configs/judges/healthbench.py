"""The judge experiments.evaluate uses for --config.benchmark=healthbench when --judge is not given.

HealthBench (Arora et al. 2025): each rubric criterion of a conversation judged on its own (mode
benchmark = per_dimension), met or not; the score is the points met over the positive points.
  ./launch.sh experiments.evaluate --config.benchmark=healthbench --judge.checkpoint=DIR ...
"""

from configs.common import benchmark_judge_block


def get_config(arg: str | None = None):
    """`arg` is unused (one variant)."""
    del arg
    return benchmark_judge_block()

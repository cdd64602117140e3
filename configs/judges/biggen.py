"""The judge experiments.evaluate uses for --config.benchmark=biggen when --judge is not given.

BiGGen Bench (Kim et al. 2024): a Prometheus-style 1-5 rubric per instance judged with its reference
answer in view (mode benchmark = per_dimension).
  ./launch.sh experiments.evaluate --config.benchmark=biggen --judge.checkpoint=DIR ...
"""

from configs.common import benchmark_judge_block


def get_config(arg: str | None = None):
    """`arg` is unused (one variant)."""
    del arg
    return benchmark_judge_block()

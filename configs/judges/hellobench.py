"""The judge experiments.evaluate uses for --config.benchmark=hellobench when --judge is not given.

HelloBench (Que et al. 2024): a checklist per task, every item judged in one prompt per answer
(mode benchmark = all_criteria), then HelloBench's weighted checklist score.
  ./launch.sh experiments.evaluate --config.benchmark=hellobench --judge.checkpoint=DIR ...
"""

from configs.common import benchmark_judge_block


def get_config(arg: str | None = None):
    """`arg` is unused (one variant)."""
    del arg
    return benchmark_judge_block()

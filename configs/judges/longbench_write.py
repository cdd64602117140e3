"""The judge experiments.evaluate uses for --config.benchmark=longbench_write when --judge is not given.

LongBench-Write (Bai et al. 2024): six quality dimensions judged in one prompt per answer (mode
benchmark = all_criteria); its length score needs no judge.
  ./launch.sh experiments.evaluate --config.benchmark=longbench_write --judge.checkpoint=DIR ...
"""

from configs.common import benchmark_judge_block


def get_config(arg: str | None = None):
    """`arg` is unused (one variant)."""
    del arg
    return benchmark_judge_block()

"""The judge block's defaults (configs/common.judge_block): no checkpoint, so rule dimensions only; give one with
--judge.checkpoint=DIR. experiments.score, calibrate and distill_judge use it when --judge is not given."""

from configs.common import judge_block


def get_config(arg: str | None = None):
    """`arg` is unused (one variant)."""
    del arg
    return judge_block()

"""The tiny default's judge (configs/tiny.py): the distilled 2-layer judge in rubric_jax/assets/tiny_judge/ (made by
rubric_jax/assets/build_tiny_judges.py), run as it was distilled and measured.

  ./launch.sh experiments.score --judge=configs/judges/tiny.py --rubric=rubric_jax/assets/tiny/rubric.yaml ...
"""

from configs.common import judge_block


def get_config(arg: str | None = None):
    """`arg` is unused (one variant)."""
    del arg
    j = judge_block()
    j.checkpoint = "rubric_jax/assets/tiny_judge"
    # One greedy verdict per item: the tiny judge's answers barely vary with temperature, so three samples
    # would triple the judge's CPU time for the same median (retries still re-prompt with a new nonce and order).
    j.samples = 1
    j.sampler = "greedy"
    j.max_new_tokens = 16  # its verdicts (anchor description, `SCORE: k`, eos) are under 10 tokens
    j.prompt = "compact"  # the prompt it was distilled on (build_tiny_judges: the full one is 2.5x as long)
    # The layout it was distilled and calibrated on; shared_prefix agrees on 88 of 90 politeness verdicts and judges
    # 512-token answers 3x as fast (docs/judges.md, "Shared-prefix judging"): a judge of its own, to calibrate first.
    j.layout = "criteria_first"
    return j

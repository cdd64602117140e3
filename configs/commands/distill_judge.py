"""experiments.distill_judge's settings: the teacher, the student's training and its held-out measurement.

  ./launch.sh experiments.distill_judge --out=DIR --rubric=R.yaml --config.dimensions=template --config.teacher=rules ...
"""

import ml_collections

from configs.common import sampler_block
from rubric_jax import counts


def distill_block() -> ml_collections.ConfigDict:
    """How the student is trained (rubric_jax/train/distill_judge.py DistillConfig)."""
    b = ml_collections.ConfigDict()
    b.steps = 400  # Optimizer updates.
    b.batch_size = 32  # Items per update.
    b.lr = 2e-3  # Peak learning rate (warmup, then cosine decay; a randomly initialised tiny judge needs a high one).
    b.warmup_steps = 20  # Linear warmup steps.
    b.prompt = "full"  # The judge prompt the student learns: full, or compact (criterion, fenced response, SCORE line).
    return b

# Every integer setting: (smallest, largest), checked by experiments/cli.py before any work (rubric_jax/counts.py).
COUNT_BOUNDS = {"seed": (0, counts.SEED), "train.steps": (1, counts.STEPS), "train.batch_size": (1, 1 << 16),
                "train.warmup_steps": (0, counts.STEPS), "measure.max_new_tokens": (1, counts.TOKENS)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant)."""
    del arg
    c = ml_collections.ConfigDict()
    c.seed = 0  # Seeds the student init, batch order, prompts and judge sampling.
    c.teacher = "rules"  # Who scores the training items: rules, judge (the --judge spec) or labels (--labels).
    c.dimensions = ""  # Comma-separated dimension ids the judge learns ("" = every labelled one; rules/judge need them).
    c.heldout = 0.15  # Fraction of the questions held out (with all their responses) to measure the student.
    c.train = distill_block()
    c.measure = sampler_block(sampler="greedy", max_new_tokens=32)  # The student's held-out measurement.
    return c

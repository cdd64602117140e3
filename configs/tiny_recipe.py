"""The multi-dimension RL recipe compared on the tiny default (issue 21): the baseline and each option alone,
3 seeds each, through `experiments.sweep` (30 runs of the tiny default: 2-3.5 minutes each on a quiet 2-core
machine, about 80 minutes in all; measured 2026-12-01, docs/training.md).

Variants (`--config=configs/tiny_recipe.py:option=NAME` runs one; the sweep runs all of them):
  baseline        the tiny default, unchanged
  per_dimension   rl.advantage=per_dimension (GDPO)
  overlong        rl.overlong_buffer=32 (DAPO soft overlong punishment over the last 32 of 96 tokens)
  mask_truncated  rl.mask_truncated=True (DAPO overlong filtering)
  sequence        rl.importance_level=sequence (GSPO; its clip range 3e-4 / 4e-4 as in the GSPO paper)
  dual_clip       rl.clip_ratio_c=3 (verl's default)
  behaviour       rl.behaviour_correction_cap=2 with recomputed behaviour log-probs (truncated IS)
  dynamic         rl.dynamic_sampling with a 0.05 reward spread (DAPO dynamic sampling)
  lr_on_oscillation  rl.lr_on_oscillation (RubricRL §4.3's learning-rate drop)
  hints           rl.rubric_hints=1 with recomputed behaviour log-probs (RuscaRL rubric scaffolding, issue 37)

Sweep:  ./launch.sh experiments.sweep --config=configs/tiny_recipe.py --workdir=runs/tiny_recipe
"""

import itertools

from configs import tiny

SEEDS = (0, 1, 2)
OPTIONS = {
    "baseline": {},
    "per_dimension": {"rl.advantage": "per_dimension"},
    "overlong": {"rl.overlong_buffer": 32},
    "mask_truncated": {"rl.mask_truncated": True},
    "sequence": {"rl.importance_level": "sequence", "rl.clip_low": 3e-4, "rl.clip_high": 4e-4},
    "dual_clip": {"rl.clip_ratio_c": 3.0},
    "behaviour": {"rl.behaviour_correction_cap": 2.0, "rl.recompute_old_logprobs": True},
    "dynamic": {"rl.dynamic_sampling": True, "rl.dynamic_sampling_min_spread": 0.05},
    "lr_on_oscillation": {"rl.lr_on_oscillation": True},
    "hints": {"rl.rubric_hints": 1.0, "rl.recompute_old_logprobs": True},
}


def get_config(arg: str | None = None):
    """`arg` is "option=NAME" (default baseline): the tiny default with that option of OPTIONS set."""
    return with_option(tiny.get_config(), OPTIONS, arg, "baseline", "configs/tiny_recipe.py")


def with_option(c, options: dict, arg: str | None, default: str, where: str):
    """`c` with the option "option=NAME" of `arg` (default `default`) set from `options`; a name not in `options`
    raises, naming the file `where`."""
    name = dict(part.split("=", 1) for part in (arg or f"option={default}").split(",") if part).get("option", default)
    if name not in options:
        raise ValueError(f"{where}: option={name!r} is not one of {sorted(options)}")
    for key, value in options[name].items():
        block, field = key.split(".")
        c[block][field] = value
    return c


def sweep(add, arg=None):
    """Every option alone (the baseline included) x 3 seeds, seed by seed: a sweep stopped part-way has every
    option at the same number of seeds."""
    del arg
    for seed, (name, overrides) in itertools.product(SEEDS, OPTIONS.items()):
        add(**overrides, seed=seed)

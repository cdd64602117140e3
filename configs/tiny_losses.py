"""The policy losses and ratio options where the ratio can act (issue 36): the tiny default with two optimizer updates
per rollout batch (`rl.updates_per_batch = 2`: the second update's ratio π/π_old leaves 1), GRPO's clipped loss
against GSPO's sequence ratio, CISPO, SAPO and dual-clip PPO, 3 seeds each, through `experiments.sweep`. The SFT
stage is the same for every variant of a seed, so benchmarks/sft_start.py runs it once per seed and seeds each
variant's directory with it (docs/training.md, "Losses where the ratio acts").

Variants (`--config=configs/tiny_losses.py:option=NAME` runs one; the sweep runs all of them):
  grpo       rl.loss=grpo (PPO's clipped surrogate, the default)
  gspo       rl.importance_level=sequence with GSPO's clip range 3e-4 / 4e-4
  cispo      rl.loss=cispo (its defaults: no floor, weight cap 5)
  sapo       rl.loss=sapo (its defaults: tau_pos 1, tau_neg 1.05)
  dual_clip  rl.clip_ratio_c=3 (verl's default)

Sweep:  PYTHONPATH=. .venv/bin/python -m benchmarks.sft_start --config=configs/tiny_losses.py --sft_dir=runs/tiny_sft --sweep_dir=runs/tiny_losses
        ./launch.sh experiments.sweep --config=configs/tiny_losses.py --workdir=runs/tiny_losses
"""

import itertools

from configs import tiny, tiny_recipe

SEEDS = (0, 1, 2)
UPDATES_PER_BATCH = 2
OPTIONS = {
    "grpo": {},
    "gspo": {"rl.importance_level": "sequence", "rl.clip_low": 3e-4, "rl.clip_high": 4e-4},
    "cispo": {"rl.loss": "cispo"},
    "sapo": {"rl.loss": "sapo"},
    "dual_clip": {"rl.clip_ratio_c": 3.0},
}


def get_config(arg: str | None = None):
    """`arg` is "option=NAME" (default grpo): the tiny default at two updates per batch with that option set."""
    c = tiny.get_config()
    c.rl.updates_per_batch = UPDATES_PER_BATCH
    return tiny_recipe.with_option(c, OPTIONS, arg, "grpo", "configs/tiny_losses.py")


def sweep(add, arg=None):
    """Every option x 3 seeds, seed by seed: a sweep stopped part-way has every option at the same number of seeds."""
    del arg
    for seed, (name, overrides) in itertools.product(SEEDS, OPTIONS.items()):
        add(**overrides, seed=seed)

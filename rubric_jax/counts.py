"""Integer counts of the config blocks (configs/common.py) are bounded on both sides: each block's validator holds
one table {field: (smallest, largest)} (judges/spec.py COUNT_BOUNDS for the judge block, train/settings.py
COUNT_BOUNDS for an experiment's blocks, qurl/config.py COUNT_BOUNDS for config.qurl, and each command's settings
file configs/commands/<command>.py its COUNT_BOUNDS, checked by experiments/cli.py), checked with `problem`.
An upper bound keeps a typo (`judge.samples=1000000`) from turning into hours of work or an exhausted memory
before anything fails; each is far above any sensible setting."""

from __future__ import annotations

TOKENS = 1 << 17  # the most tokens of any one budget (a prompt, a response, a verdict): a 128K context
DEVICES = 1 << 16  # the most devices along one mesh axis
STEPS = 10**7  # the most steps of a stage, or steps between two events
SEED = 2**32 - 1  # the largest seed (jax.random.key takes a uint32's worth without loss)


def problem(value: object, smallest: int, largest: int) -> str | None:
    """Why `value` is not an integer in [smallest, largest] (the bound it breaks), or None when it is."""
    if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
        return f"expected an integer >= {smallest}"
    if value > largest:
        return f"expected an integer <= {largest}"
    return None

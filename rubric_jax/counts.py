"""Integer counts of the config blocks are bounded on both sides: each count's (smallest, largest) is its field's
`bounds` (rubric_jax/schema.py `setting`: judges/spec.py JudgeSpec, qurl/config.py BuildConfig, the commands' blocks
of rubric_jax/command_blocks.py; train/settings.py COUNT_BOUNDS for an experiment's blocks), checked with `problem`.
An upper bound keeps a typo (`judge.samples=1000000`) from turning into hours of work or an exhausted memory
before anything fails; each is far above any sensible setting."""

from __future__ import annotations

TOKENS = 1 << 17  # the most tokens of any one budget (a prompt, a response, a verdict): a 128K context
DEVICES = 1 << 16  # the most devices along one mesh axis
STEPS = 10**7  # the most steps of a stage, or steps between two events
SEED = 2**32 - 1  # the largest seed (jax.random.key takes a uint32's worth without loss)
# What a user may ask a loaded model's dtypes to be (rubric_jax/loader.py; here, without jax, for the blocks' choices).
DTYPE_CHOICES = ("auto", "float32", "bfloat16")


def problem(value: object, smallest: int, largest: int) -> str | None:
    """Why `value` is not an integer in [smallest, largest] (the bound it breaks), or None when it is."""
    if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
        return f"expected an integer >= {smallest}"
    if value > largest:
        return f"expected an integer <= {largest}"
    return None

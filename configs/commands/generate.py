"""experiments.generate's settings: how the model is loaded for decoding and how it answers.

  ./launch.sh experiments.generate --checkpoint=DIR --prompt="Hello" --config.sampling.max_new_tokens=32
"""

import ml_collections

from configs.common import decode_block, sampler_block
from rubric_jax import counts


# Every integer setting: (smallest, largest), checked by experiments/cli.py before any work (rubric_jax/counts.py).
COUNT_BOUNDS = {"seed": (0, counts.SEED), "model.tensor": (1, counts.DEVICES),
                "sampling.max_new_tokens": (1, counts.TOKENS)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant)."""
    del arg
    c = ml_collections.ConfigDict()
    c.seed = 0  # PRNG seed for sampling.
    c.format = "text"  # Print the text, or one JSON object (json).
    c.model = decode_block()
    c.sampling = sampler_block(sampler="greedy", max_new_tokens=128)
    return c

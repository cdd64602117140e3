"""experiments.serve's settings: where it listens and how it batches requests. The served judge's layout, dtypes and
default max_tokens come from --judge.

  ./launch.sh experiments.serve --checkpoint=rubric_jax/assets/tiny_judge --judge=configs/judges/tiny.py --config.port=8000
"""

import ml_collections

from rubric_jax import counts

# Every integer setting: (smallest, largest), checked by experiments/cli.py before any work (rubric_jax/counts.py).
COUNT_BOUNDS = {"seed": (0, counts.SEED), "port": (1, 65535), "max_batch": (1, 1 << 12),
                "warmup_prompt_tokens": (0, counts.TOKENS), "max_body_bytes": (1024, 64 << 20)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant)."""
    del arg
    c = ml_collections.ConfigDict()
    c.seed = 0  # PRNG seed of sampled (temperature > 0) answers.
    c.served_model_name = ""  # The model name clients send ("" = the checkpoint directory's name).
    c.host = "127.0.0.1"  # Address to listen on (0.0.0.0: every interface).
    c.port = 8000  # Port to listen on.
    c.api_key_env = ""  # Environment variable holding the API key clients must send ("" = none; warned off loopback).
    c.batch_window_ms = 20.0  # Requests arriving this long after the first waiting one share its generate call (<= 10000).
    c.max_batch = 64  # Most prompts per generate call (judge.batch_size wins if set).
    c.warmup_prompt_tokens = 0  # Compile every batch bucket for prompts of this many tokens first (0: on first use).
    c.max_body_bytes = 2 * 1024 * 1024  # Largest request body (413 beyond it); at most 64 MiB.
    return c

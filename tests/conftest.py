"""Test-wide settings: 8 simulated CPU devices (set before jax is imported) and strict rank promotion."""
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_numpy_rank_promotion", "raise")

"""Test-wide settings: 8 simulated CPU devices and XLA's cheapest CPU optimisation (set before jax is
imported), strict rank promotion, and one persistent XLA compilation cache for the session."""
import atexit
import os
import shutil
import tempfile

from xla_flags import FAST_COMPILE  # noqa: E402  (tests/ is on sys.path for its conftest)

os.environ["XLA_FLAGS"] = (
    f"{FAST_COMPILE} {os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_numpy_rank_promotion", "raise")

# The end-to-end tests start many runs of the same tiny programs (`./launch.sh`, sweeps, resumes): with one
# compilation cache for the session, in this process and in the subprocesses (they inherit the variables),
# each program compiles once. jax keys entries on the program, flags and devices, so no result changes.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="rubric_jax_test_xla_cache_")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))

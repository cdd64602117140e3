"""Test-wide settings: 8 simulated CPU devices and XLA's cheapest CPU optimisation (set before jax is
imported), strict rank promotion, one persistent XLA compilation cache for the session, and the slowest files
first (so that the two xdist workers finish together)."""
import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

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

# The slowest test files (end-to-end runs, multi-device compiles, CLI subprocesses), heaviest first, by their
# durations in a 2-worker run of the suite (2026-12-01; test_off_policy, test_lora_run and test_train_step by their
# CPU-seconds, 69, 46 and 40, on 2026-12-05: unlisted, they were among the last files handed out). launch.sh runs
# `--dist loadfile --no-loadscope-reorder`: xdist hands whole files to the two workers in collection order, so these
# start first and the workers finish together. xdist's own order (most tests first) left one-test files such as
# test_multihost.py (minutes) to the end, run by one worker while the other idled.
SLOW_FILES_FIRST = (
    "tests/train/test_loop.py",
    "tests/test_multihost.py",
    "tests/train/test_off_policy.py",
    "tests/train/test_train_step_multidevice.py",
    "tests/test_aot.py",
    "tests/train/test_distill_judge.py",
    "tests/train/test_lora_run.py",
    "tests/test_configs.py",
    "tests/test_sweeps.py",
    "tests/train/test_train_step.py",
    "tests/judges/test_judge_http.py",
    "tests/test_sampling.py",
    "tests/experiments/test_evaluate_cli.py",
    "tests/experiments/test_score_cli.py",
    "tests/test_gpu_benchmark.py",
    "tests/prepare/test_prepare_data.py",
    "tests/train/test_export.py",
    "tests/experiments/test_calibration_cli.py",
    "tests/judges/test_reward.py",
    "tests/test_grpo.py",
    "tests/train/test_lora_step.py",
)
ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """Runs SLOW_FILES_FIRST's files first, in its order; every other file keeps its place after them."""
    missing = [path for path in SLOW_FILES_FIRST if not (ROOT / path).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: SLOW_FILES_FIRST names files that do not exist: {missing}")
    rank = {path: i for i, path in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


@pytest.fixture(scope="session")
def command_server():
    """`command_server(MODULE, **ENV).run(*args)`: `python -m MODULE *args` in the environment of a command under
    test (xla_flags.command_env(**ENV)), forked from one process per MODULE and ENV that imported it once
    (tests/command_server.py): for the bad-input cases of a command, which each paid 2-4 CPU-seconds of imports as a
    fresh process."""
    from command_server import CommandServer
    from xla_flags import command_env

    servers: dict[tuple, CommandServer] = {}

    def get(module: str, **env: str) -> CommandServer:
        key = (module, *sorted(env.items()))
        if key not in servers:
            servers[key] = CommandServer(module, command_env(**env))
        return servers[key]

    yield get
    for server in servers.values():
        server.close()

#!/usr/bin/env bash
# rubric_jax entry point.
#   ./launch.sh [--FLAG=V ...]       set up .venv, then run the tiny default end to end on CPU
#                                    (extra flags go to experiments.run, e.g. --config.rl.steps=10)
#   ./launch.sh test [PYTEST ARGS]   set up .venv, then run the whole test suite on RUBRIC_JAX_TEST_WORKERS
#                                    processes (default 2; pytest-xdist, one test file per worker at a time,
#                                    the slowest files first: tests/conftest.py)
#   ./launch.sh MODULE [ARGS]        set up .venv, then `python -m MODULE ARGS` (e.g. experiments.run)
#   ./launch.sh aot                  set up .venv-aot (requirements-aot.txt: XLA's GPU compiler, no GPU needed)
# A command with --dry_run_target=<a GPU> runs in .venv-aot (set up on first use).
# On a cluster the same script is the per-host entry point: with SLURM (SLURM_NTASKS > 1), a TPU pod,
# or explicit JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, the experiments call
# jax.distributed.initialize() before anything else (rubric_jax/distributed.py).
set -euo pipefail
cd "$(dirname "$0")"

venv="${RUBRIC_JAX_VENV:-.venv}"
requirements=(requirements.txt requirements-test.txt)  # what is installed (and hashed, to reinstall on a change)
python="${PYTHON:-python3}"
for arg in "$@"; do
  case "$arg" in
    --dry_run_target=cpu) ;;
    --dry_run_target=*) venv="${RUBRIC_JAX_AOT_VENV:-.venv-aot}"; requirements=(requirements-aot.txt requirements.txt) ;;
  esac
done
if [ "${1:-}" = aot ]; then
  venv="${RUBRIC_JAX_AOT_VENV:-.venv-aot}"; requirements=(requirements-aot.txt requirements.txt)
fi

ensure_venv() {
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  local want stamp="$venv/.rubric_jax_requirements"
  want=$(cat "${requirements[@]}" | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "launch.sh: installing requirements into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${requirements[@]/#/-r}"
    echo "$want" > "$stamp"
  fi
}

ensure_venv
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-}" in
  test)
    shift
    exec "$venv/bin/python" -m pytest tests -n "${RUBRIC_JAX_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
    ;;
  aot)
    echo "launch.sh: $venv is ready (tests/test_aot.py uses it for the GPU dry run)"
    ;;
  ""|--*)
    exec "$venv/bin/python" -m experiments.run --config=configs/tiny.py --workdir=runs/tiny "$@"
    ;;
  *)
    module="$1"; shift
    exec "$venv/bin/python" -m "$module" "$@"
    ;;
esac

"""Multi-host start-up: initialise `jax.distributed` when the environment describes a multi-process job.

Recognised environments (checked in this order):
  * explicit variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID;
  * SLURM with more than one task (SLURM_NTASKS > 1): jax reads the SLURM variables itself;
  * a Cloud TPU pod slice (TPU_WORKER_HOSTNAMES lists more than one host): jax detects it itself.
Anything else is a single-process run and nothing is initialised.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax


def describe_environment(env: Mapping[str, str]) -> dict[str, object] | None:
    """The keyword arguments for `jax.distributed.initialize`, or None for a single-process run."""
    if "JAX_COORDINATOR_ADDRESS" in env:
        missing = [k for k in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if k not in env]
        if missing:
            raise ValueError(f"JAX_COORDINATOR_ADDRESS is set but {', '.join(missing)} is not")
        return {
            "coordinator_address": env["JAX_COORDINATOR_ADDRESS"],
            "num_processes": int(env["JAX_NUM_PROCESSES"]),
            "process_id": int(env["JAX_PROCESS_ID"]),
        }
    if int(env.get("SLURM_NTASKS", "1")) > 1:
        return {}
    if len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1:
        return {}
    return None


def maybe_initialize(env: Mapping[str, str] | None = None) -> bool:
    """Initialises jax.distributed for a multi-process job; returns whether it did."""
    kwargs = describe_environment(os.environ if env is None else env)
    if kwargs is None:
        return False
    jax.distributed.initialize(**kwargs)
    return True

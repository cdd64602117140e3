"""Multi-host: start-up of `jax.distributed` when the environment describes a multi-process job, and
the host-side helpers that work whichever process holds an array's shards.

Recognised environments (checked in this order):
  * explicit variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID;
  * SLURM with more than one task (SLURM_NTASKS > 1): jax reads the SLURM variables itself;
  * a Cloud TPU pod slice (TPU_WORKER_HOSTNAMES lists more than one host): jax detects it itself.
Anything else is a single-process run and nothing is initialised.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


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


def host_array(x: jax.Array) -> np.ndarray:
    """The whole value of `x` as a numpy array on this host, whichever processes hold its shards.

    A plain fetch when this process holds every shard (or a full replica); otherwise an all-gather
    across processes, which every process must call, in the same order (`jax.device_get` would fail
    on an array that spans hosts).
    """
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def host_tree(tree: Any) -> Any:
    """`host_array` of every array of a pytree (metrics, sampler results); other leaves pass through."""
    return jax.tree.map(lambda x: host_array(x) if isinstance(x, jax.Array) else x, tree)


def is_writer() -> bool:
    """Whether this process writes shared files (exports, logs): process 0 of a multi-process job."""
    return jax.process_index() == 0


def wait_for_everyone(name: str) -> None:
    """A barrier across processes (no-op in a single-process run), e.g. until process 0 has written a file."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)

"""Multi-host: start-up of `jax.distributed` when the environment describes a multi-process job, and
the host-side helpers that work whichever process holds an array's shards.

Recognised environments (checked in this order):
  * explicit variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID;
  * SLURM with more than one task (SLURM_NTASKS > 1): jax reads the SLURM variables itself;
  * a Cloud TPU pod slice (TPU_WORKER_HOSTNAMES lists more than one host): jax detects it itself.
Anything else is a single-process run and nothing is initialised.

Data in a multi-process job: every process walks the same (seeded) order of rows and keeps its own
contiguous block of each global batch (`process_block`), which `global_batch` places on its devices;
host-side results that every process needs (rewards, metrics) come back through `all_gather_objects`.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

T = TypeVar("T")


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


def local_rows(x: jax.Array) -> np.ndarray:
    """The rows (leading axis) of a batch-sharded `x` that this process's devices hold, in order, with no
    transfer between hosts (replicas of a row block, e.g. over tensor groups, are read once). With one
    process: the whole array. The inverse of `global_batch`."""
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    blocks: dict[int, jax.Shard] = {}
    for shard in x.addressable_shards:
        if any(s != slice(None) and (s.start, s.stop) != (0, n) for s, n in zip(shard.index[1:], x.shape[1:])):
            raise ValueError(f"local_rows: shard index {shard.index} splits more than the leading axis")
        blocks.setdefault(shard.index[0].start or 0, shard)
    starts = sorted(blocks)
    stops = [blocks[s].index[0].stop for s in starts]
    if starts[1:] != stops[:-1]:
        raise ValueError(f"local_rows: this process's rows are not one contiguous block ({list(zip(starts, stops))})")
    return np.concatenate([np.asarray(blocks[s].data) for s in starts])


def global_batch(local: Any, batch_sharding: jax.sharding.Sharding) -> Any:
    """A pytree of this process's rows (numpy, leading axis = rows) as global arrays in `batch_sharding`:
    every process passes its own, equally many rows, and process p's rows become block p (the rows its
    devices hold). With one process this is `jax.device_put`."""
    if jax.process_count() == 1:
        return jax.device_put(local, batch_sharding)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(batch_sharding, np.asarray(x)), local)


def replicate(tree: Any, replicated_sharding: jax.sharding.Sharding) -> Any:
    """A pytree of host values that every process holds identically (scalars, stop ids, PRNG keys) as
    global arrays in `replicated_sharding`. With one process this is `jax.device_put`."""
    if jax.process_count() == 1:
        return jax.device_put(tree, replicated_sharding)

    def place(x: Any) -> jax.Array:
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(place(jax.random.key_data(x)), impl=jax.random.key_impl(x))
        host = host_array(x) if isinstance(x, jax.Array) else np.asarray(x)
        return jax.make_array_from_callback(host.shape, replicated_sharding, lambda index: host[index])

    return jax.tree.map(place, tree)


def max_over_processes(*values: int) -> tuple[int, ...]:
    """The element-wise maximum of `values` over all processes (e.g. a padding width every process must
    agree on); every process must call it."""
    if jax.process_count() == 1:
        return tuple(int(v) for v in values)
    gathered_PxK = multihost_utils.process_allgather(np.asarray(values, np.int64))
    return tuple(int(v) for v in np.asarray(gathered_PxK).reshape(jax.process_count(), -1).max(axis=0))


def check_divides(count: int, field: str) -> None:
    """Refuses (one line naming the config `field`) a per-step row count that does not split into equal
    blocks over the processes; checked at start-up."""
    processes = jax.process_count()
    if count % processes:
        raise ValueError(f"config.{field}={count}: must be a multiple of the number of processes ({processes}): "
                         "each process takes an equal block of every batch")


def block_bounds(count: int) -> tuple[int, int]:
    """[start, stop) of this process's contiguous block of `count` rows: process p takes block p; blocks
    differ by at most one row when `count` does not divide (host-side work such as rule scoring)."""
    process, processes = jax.process_index(), jax.process_count()
    return count * process // processes, count * (process + 1) // processes


def split_keys(keys: Sequence[str], processes: int) -> list[str]:
    """The keys whose rows fall in more than one process's contiguous block of `keys` (`block_bounds` with
    `processes` processes), in order of first appearance: rows that one process alone would handle together."""
    count = len(keys)
    owners: dict[str, set[int]] = {}
    for p in range(processes):
        for key in keys[count * p // processes : count * (p + 1) // processes]:
            owners.setdefault(key, set()).add(p)
    return [key for key, procs in owners.items() if len(procs) > 1]


def process_block(rows: Sequence[T]) -> list[T]:
    """This process's block of a global batch `rows` (the rows `global_batch` puts on its devices): disjoint
    and equally many on every process (see `check_divides`); with one process, all of them."""
    if len(rows) % jax.process_count():
        raise ValueError(f"process_block: {len(rows)} rows do not split over {jax.process_count()} processes")
    start, stop = block_bounds(len(rows))
    return list(rows[start:stop])


def all_gather_objects(value: Any) -> list[Any]:
    """Every process's `value` (any picklable host object: numpy arrays, lists, dicts), in process order;
    every process must call it. With one process: `[value]`, nothing serialised."""
    if jax.process_count() == 1:
        return [value]
    payload = np.frombuffer(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    (longest,) = max_over_processes(payload.size)
    padded = np.zeros((longest + 8,), np.uint8)  # a length prefix, then the bytes
    padded[:8] = np.frombuffer(np.int64(payload.size).tobytes(), np.uint8)
    padded[8:8 + payload.size] = payload
    gathered_PxL = np.asarray(multihost_utils.process_allgather(padded))
    sizes = [int(np.frombuffer(row[:8].tobytes(), np.int64)[0]) for row in gathered_PxL]
    return [pickle.loads(row[8:8 + size].tobytes()) for row, size in zip(gathered_PxL, sizes)]

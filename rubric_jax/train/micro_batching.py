"""`rl.micro_batches = 0` ("auto"): the fewest micro-batches whose compiled GRPO update fits the device's memory.

The counts a batch allows (`candidates`) divide the rows each device holds and split the groups as train/step.py
does (whole groups, or equal parts of groups). Each count tried is compiled with abstract inputs, as the dry run
compiles it (train/programs.py), and its per-device peak read from the compiler's memory analysis
(`peak_bytes`: arguments + outputs + temporaries - aliased). The budget (`Memory`) is the device's bytes limit
(`memory_stats()["bytes_limit"]` on a GPU/TPU; for a dry run's GPU target, what jax's allocator would get of it)
less `HEADROOM` of it and the long-lived arrays that live beside the update (the reference, judges). The search
(`search`) doubles the count until one fits, then bisects between it and the last that did not: it assumes the
peak does not grow with the count (more micro-batches hold fewer activations at once). A device that reports no
limit (the CPU) gets 1, said in the log line.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils


AUTO = 0  # the rl.micro_batches value that asks for the count to be chosen
HEADROOM = 0.1  # the share of the bytes limit left free: allocator fragmentation, library workspaces
# jax's GPU allocator takes this share of the device's memory (XLA_PYTHON_CLIENT_MEM_FRACTION's default); a dry
# run's GPU target budgets what `memory_stats()["bytes_limit"]` would report on that GPU.
JAX_MEMORY_FRACTION = 0.75
_GIB = 1 << 30
_MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Memory:
    """Per-device memory the GRPO update's peak is held against: `limit` (None where the device reports none),
    of which `HEADROOM` stays free and `beside` is taken by long-lived arrays the update does not hold."""

    limit: int | None
    beside: int = 0
    source: str = ""  # where the limit comes from, in words, for the log line

    @property
    def budget(self) -> int | None:
        """Bytes per device the update's peak may take (None: no limit known)."""
        return None if self.limit is None else int(self.limit * (1 - HEADROOM)) - self.beside


@dataclasses.dataclass(frozen=True)
class AutoSettings:
    """What choosing the count needs beyond the GRPO objective and layouts: the memory, the batch the update is
    compiled for (its largest buckets, as the dry run) and the compiler options of the compiles."""

    memory: Memory
    prompts: int  # rl.questions_per_step
    prompt_len: int  # the largest prompt bucket
    response_len: int  # the largest response bucket
    compiler_options: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class Choice:
    """The chosen count, its compiled update's peak (None when no compile was needed) and every count tried with
    its peak; `compiled` (and its `compile_seconds`) is the chosen count's compile, for the dry run to report."""

    count: int
    peak: int | None
    memory: Memory
    tried: tuple[tuple[int, int], ...] = ()
    compiled: Any = dataclasses.field(default=None, compare=False, repr=False)
    compile_seconds: float = dataclasses.field(default=0.0, compare=False)

    def line(self) -> str:
        """The start-up log line: the count, and the estimate it was chosen by."""
        head = f"config.rl.micro_batches=0 (auto): {self.count} micro-batch{'es' if self.count > 1 else ''}"
        if self.peak is None:
            return f"{head} ({self.memory.source})"
        tried = ", ".join(f"{m}: {size(p)}" for m, p in self.tried)
        return (f"{head}, the GRPO update's peak {size(self.peak)} per device within the budget of "
                f"{size(self.memory.budget)} ({_limit_words(self.memory)}); peaks tried: {tried}")

    def record(self) -> dict[str, Any]:
        """What run_info records of the choice."""
        return {"auto": True, "count": self.count, "peak_bytes": self.peak, "budget_bytes": self.memory.budget,
                "limit_bytes": self.memory.limit, "beside_bytes": self.memory.beside,
                "limit_source": self.memory.source, "tried": {str(m): p for m, p in self.tried}}


def size(n: int) -> str:
    """Bytes in GiB, or in MiB under 1 GiB (a tiny model's peaks would read 0.00 GiB)."""
    return f"{n / _GIB:.2f} GiB" if abs(n) >= _GIB else f"{n / _MIB:.2f} MiB"


def _limit_words(memory: Memory) -> str:
    return (f"{size(memory.limit)} from {memory.source}, less {HEADROOM:.0%} headroom and {size(memory.beside)} of "
            "long-lived arrays beside the update")


def candidates(rows: int, shards: int) -> tuple[int, ...]:
    """The micro-batch counts a batch of `rows` over `shards` batch shards allows: the divisors of each shard's rows.
    Each splits the groups as train/step.py does (whole groups, or equal parts of groups): a count m that divides
    U x G rows of U groups of G divides G x gcd(m, U), so the m / gcd(m, U) parts of a group divide G."""
    if rows % shards:
        return ()
    per_shard = rows // shards
    return tuple(m for m in range(1, per_shard + 1) if per_shard % m == 0)


def search(counts: Sequence[int], peak_of: Callable[[int], int], budget: int
           ) -> tuple[int | None, tuple[tuple[int, int], ...]]:
    """The fewest of the ascending `counts` whose `peak_of` is within `budget` (None when none is), and every
    (count, peak) tried: doubling the count until one fits, then bisecting down to the last that did not (the peak
    is assumed not to grow with the count)."""
    tried: dict[int, int] = {}

    def fits(i: int) -> bool:
        if counts[i] not in tried:
            tried[counts[i]] = peak_of(counts[i])
        return tried[counts[i]] <= budget

    low, high = -1, 0  # counts[low] does not fit (-1: none tried); counts[high] is the one being tried
    while not fits(high):
        if high == len(counts) - 1:
            return None, tuple(sorted(tried.items()))
        low, high = high, next((j for j in range(high + 1, len(counts)) if counts[j] >= 2 * counts[high]),
                               len(counts) - 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return counts[high], tuple(sorted(tried.items()))


def choose(memory: Memory, counts: Sequence[int], peak_of: Callable[[int], int]) -> Choice:
    """The fewest of `counts` that fits `memory` (`search`), or 1 without compiling where no limit is known; a
    ValueError naming rl.micro_batches and the smallest peak when none fits."""
    if not counts:
        raise ValueError("config.rl.micro_batches=0 (auto): the batch allows no micro-batch count (its rows do not "
                         "split evenly over the mesh's batch shards)")
    if memory.budget is None:
        return Choice(1, None, memory)
    count, tried = search(counts, peak_of, memory.budget)
    if count is None:
        smallest, peak = min(tried, key=lambda t: t[1])
        raise ValueError(
            f"config.rl.micro_batches=0 (auto): no micro-batch count fits the GRPO update in {size(memory.budget)} "
            f"per device ({_limit_words(memory)}): the smallest peak is {size(peak)}, with {smallest} micro-batches "
            f"(the batch allows {list(counts)}); shard over more devices (config.mesh), shorten the batch "
            "(config.rl.questions_per_step, config.rl.max_new_tokens), or set config.rl.micro_batches")
    return Choice(count, dict(tried)[count], memory, tried)


def peak_bytes(memory: Any) -> int:
    """A compiled program's per-device peak from its `memory_analysis()`: arguments + outputs + temporaries -
    aliased (the GPU compiler's own peak equals it; the CPU backend's leaves temporaries out)."""
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
            - memory.alias_size_in_bytes)


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded arrays or ShapeDtypeStructs (the largest shard of each)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shard = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shard) * jnp.dtype(x.dtype).itemsize
    return total


def device_memory(devices: Sequence[jax.Device], beside: int) -> Memory:
    """The run's devices' memory: the smallest `bytes_limit` of `memory_stats()`, with the bytes already in use
    on the fullest device (judges, a reward model) added to `beside`; no limit where a device reports none. Over
    every process of a multi-process run alike, so that all of them choose the same count."""
    stats = [device.memory_stats() or {} for device in devices if device.process_index == jax.process_index()]
    if any("bytes_limit" not in s for s in stats):
        return Memory(None, source=f"the {devices[0].platform} device reports no memory limit")
    limit, in_use = min(s["bytes_limit"] for s in stats), max(s.get("bytes_in_use", 0) for s in stats)
    if jax.process_count() > 1:
        limits, uses = multihost_utils.process_allgather(np.array([limit, in_use], np.int64)).reshape(-1, 2).T
        limit, in_use = int(limits.min()), int(uses.max())
    return Memory(limit, beside + in_use,
                  f"memory_stats() bytes_limit, {size(in_use)} of it in use at start-up")


def target_memory(device_bytes: int, beside: int, name: str) -> Memory:
    """A dry run's GPU target: the share of its `device_bytes` that jax's allocator takes
    (XLA_PYTHON_CLIENT_MEM_FRACTION, default `JAX_MEMORY_FRACTION`), what memory_stats() would report on it."""
    fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", JAX_MEMORY_FRACTION))
    return Memory(int(device_bytes * fraction), beside, f"{fraction:g} of the {name}'s {size(device_bytes)}")

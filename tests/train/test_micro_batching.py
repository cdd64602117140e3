"""rl.micro_batches=0 (train/micro_batching.py): the counts a batch allows, the fewest whose peak fits (fake memory
analyses with hand-computed peaks), the error when none fits, 1 where no limit is known, and the limits read from
devices and GPU targets."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from rubric_jax import aot_targets
from rubric_jax.train import micro_batching, step as train_step

GIB = 1 << 30


def _analysis(arguments: int, outputs: int, temporaries: int, aliased: int) -> types.SimpleNamespace:
    """What `compiled.memory_analysis()` gives, in GiB."""
    return types.SimpleNamespace(argument_size_in_bytes=arguments * GIB, output_size_in_bytes=outputs * GIB,
                                 temp_size_in_bytes=temporaries * GIB, alias_size_in_bytes=aliased * GIB)


# A 12-row shard: every divisor of 12. The state (10 GiB) is donated, so arguments + outputs - aliased = 10 + 2 (the
# batch); the activations (120 GiB at one micro-batch) shrink with the count: peaks 132, 72, 52, 42, 32, 22 GiB.
ANALYSES = {m: _analysis(12, 10, 120 // m, 10) for m in (1, 2, 3, 4, 6, 12)}


def _peaks(calls: list[int]):
    def peak_of(count: int) -> int:
        calls.append(count)
        return micro_batching.peak_bytes(ANALYSES[count])
    return peak_of


def test_the_counts_a_batch_allows_are_the_step_s_counts_that_divide_each_shard():
    assert micro_batching.candidates(64, 8) == (1, 2, 4, 8)  # the tiny default over 8 devices: 8 rows each
    assert micro_batching.candidates(12, 1) == (1, 2, 3, 4, 6, 12)
    assert micro_batching.candidates(12, 8) == ()  # rows that do not split over the shards
    for groups, group_size, shards in ((3, 4, 1), (3, 4, 2), (2, 6, 3), (8, 8, 8), (5, 2, 5)):
        rows = groups * group_size
        allowed = []
        for m in range(1, rows + 1):
            try:
                train_step._check_micro_batches(rows, m, group_size)  # the step's own check: whole or equal parts
            except ValueError:
                continue
            if rows % (shards * m) == 0:
                allowed.append(m)
        assert micro_batching.candidates(rows, shards) == tuple(allowed), (groups, group_size, shards)


@pytest.mark.parametrize("budget, count, tried", [
    (200, 1, (1,)),  # one micro-batch fits: nothing else is compiled
    (75, 2, (1, 2)),  # 1 (132) over, 2 (72) within
    (60, 3, (1, 2, 4, 3)),  # doubling: 1, 2 over, 4 (42) within; bisecting: 3 (52) within too
    (50, 4, (1, 2, 4, 3)),  # 3 (52) over: 4
    (40, 6, (1, 2, 4, 12, 6)),  # 4 over, the next double (8) is past 6: 12 within; bisecting: 6 (32) within
    (22, 12, (1, 2, 4, 12, 6)),
])
def test_the_fewest_micro_batches_within_the_budget(budget, count, tried):
    calls: list[int] = []
    choice = micro_batching.choose(micro_batching.Memory(int((budget + 8) * GIB / 0.9) + 1, 8 * GIB, "a test"),
                                   tuple(ANALYSES), _peaks(calls))
    assert choice.memory.budget // GIB == budget  # 90% of the limit, less the 8 GiB beside the update
    assert choice.count == count and choice.peak == micro_batching.peak_bytes(ANALYSES[count])
    assert tuple(calls) == tried and [m for m, _ in choice.tried] == sorted(tried)
    assert choice.line().startswith(f"config.rl.micro_batches=0 (auto): {count} micro-batch")
    assert f"peak {choice.peak / GIB:.2f} GiB per device within the budget of {budget}." in choice.line()
    record = choice.record()
    assert record["count"] == count and record["peak_bytes"] == choice.peak and record["beside_bytes"] == 8 * GIB


def test_no_count_that_fits_is_an_error_naming_the_key_and_the_smallest_peak():
    calls: list[int] = []
    with pytest.raises(ValueError, match=r"config\.rl\.micro_batches=0 \(auto\): no micro-batch count fits the GRPO "
                                         r"update in 20\.00 GiB per device \(.*\): the smallest peak is 22\.00 GiB, "
                                         r"with 12 micro-batches \(the batch allows \[1, 2, 3, 4, 6, 12\]\)"):
        micro_batching.choose(micro_batching.Memory(int(20 * GIB / 0.9) + 1, 0, "a test"), tuple(ANALYSES),
                              _peaks(calls))
    assert calls == [1, 2, 4, 12]  # doubling up to the largest count, no more
    with pytest.raises(ValueError, match=r"rl\.micro_batches=0 \(auto\): the batch allows no micro-batch count"):
        micro_batching.choose(micro_batching.Memory(GIB), (), _peaks(calls))


def test_no_limit_is_one_micro_batch_without_compiling():
    """The CPU reports no memory limit: auto = 1, said in the line, nothing compiled."""
    memory = micro_batching.device_memory(jax.devices("cpu"), 0)
    assert memory.limit is None and memory.budget is None
    calls: list[int] = []
    choice = micro_batching.choose(memory, tuple(ANALYSES), _peaks(calls))
    assert (choice.count, choice.peak, calls) == (1, None, [])
    assert choice.line() == "config.rl.micro_batches=0 (auto): 1 micro-batch (the cpu device reports no memory limit)"


def test_device_and_target_limits():
    """A GPU's limit is the smallest bytes_limit, the fullest device's bytes in use beside the update; a dry run's
    GPU target gets what jax's allocator would (XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set)."""
    def device(limit: int, in_use: int, process: int = 0) -> types.SimpleNamespace:
        return types.SimpleNamespace(platform="gpu", process_index=process,
                                     memory_stats=lambda: {"bytes_limit": limit, "bytes_in_use": in_use})

    devices = [device(100 * GIB, 3 * GIB), device(90 * GIB, 5 * GIB), device(10 * GIB, 9 * GIB, process=1)]
    memory = micro_batching.device_memory(devices, 2 * GIB)  # another process's device is not asked
    assert (memory.limit, memory.beside, memory.budget) == (90 * GIB, 7 * GIB, int(90 * GIB * 0.9) - 7 * GIB)
    with pytest.MonkeyPatch.context() as patch:  # two processes: the smallest limit and the most in use of both
        patch.setattr(jax, "process_count", lambda: 2)
        patch.setattr(micro_batching.multihost_utils, "process_allgather",
                      lambda x: np.stack([x, np.array([80 * GIB, 4 * GIB])]))
        memory = micro_batching.device_memory(devices, 2 * GIB)
    assert (memory.limit, memory.beside) == (80 * GIB, 7 * GIB)
    h200 = aot_targets.get_target("h200")
    memory = micro_batching.target_memory(h200.memory_bytes, GIB, h200.description)
    assert memory.limit == int(143771 * (1 << 20) * 0.75) and memory.source == "0.75 of the NVIDIA H200's 140.40 GiB"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
        assert micro_batching.target_memory(100 * GIB, 0, "x").limit == int(100 * GIB * 0.9)

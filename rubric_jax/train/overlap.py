"""What judging overlapped with sampling buys (rl.rollout_chunks > 1, train/collect.py): a rollout sampled in chunks of
whole groups, chunk j + 1 queued on the devices (JAX dispatches asynchronously) before chunk j is fetched and judged
on the host, so an HTTP judge or the rule judges work while the devices sample.

`Timeline` records when each chunk's samples were ready on the devices (a watcher thread blocks on them; the overlap
itself needs no thread) and when the host judged each chunk. Judge time is hidden while the next chunk was still
sampling: per chunk j, the part of its judging before chunk j + 1 was ready. An in-process LLM judge's generate calls
run on the same devices, so they queue behind the next chunk's sampling: only its host side (prompts, tokenizing,
parsing) and the rule judges overlap.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import jax


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of one rollout (or the sum of several rounds'): host time judging, the part of it hidden behind the
    next chunk's sampling, and the wall time from the first chunk's dispatch to the last chunk's scores."""

    judge_s: float
    hidden_s: float
    rollout_s: float

    def __add__(self, other: Timing) -> Timing:
        return Timing(self.judge_s + other.judge_s, self.hidden_s + other.hidden_s, self.rollout_s + other.rollout_s)

    def metrics(self) -> dict[str, float]:
        """The step's `overlap/*` metrics (docs/training.md, "Judging overlapped with sampling")."""
        return {"overlap/judge_s": self.judge_s, "overlap/judge_hidden_s": self.hidden_s,
                "overlap/judge_hidden_frac": self.hidden_s / self.judge_s if self.judge_s > 0 else 0.0,
                "overlap/rollout_s": self.rollout_s}


def _ready_at(samples: Any) -> float:
    """The host clock once every array of `samples` is computed."""
    jax.block_until_ready(samples)
    return time.perf_counter()


class Timeline:
    """When each dispatched chunk was ready and when each chunk was judged (in order); `timing()` ends it."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._watcher = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunk-ready")
        self._ready: list[concurrent.futures.Future[float]] = []
        self._judged: list[tuple[float, float]] = []

    def dispatched(self, samples: Any) -> None:
        """Watches a chunk just dispatched (chunks finish in dispatch order: the watcher waits for each in turn)."""
        self._ready.append(self._watcher.submit(_ready_at, samples))

    @contextlib.contextmanager
    def judging(self) -> Iterator[None]:
        """Times the host's judging of the next chunk."""
        start = time.perf_counter()
        yield
        self._judged.append((start, time.perf_counter()))

    def timing(self) -> Timing:
        """The rollout's Timing (waits for the watcher)."""
        ready = [future.result() for future in self._ready]
        self._watcher.shutdown()
        return Timing(sum(end - start for start, end in self._judged), hidden_seconds(self._judged, ready),
                      self._judged[-1][1] - self._start)


def hidden_seconds(judged: list[tuple[float, float]], ready: list[float]) -> float:
    """Judge time spent while the devices sampled: for each chunk j but the last, the part of its judging
    (start, end) before chunk j + 1's samples were ready (`ready[j + 1]`; chunk j + 1 was queued before chunk j was
    fetched, so the devices sampled it from the start of j's judging until then)."""
    return sum(max(0.0, min(end, ready[j + 1]) - start) for j, (start, end) in enumerate(judged[:-1]))

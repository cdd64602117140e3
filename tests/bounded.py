"""Hostile-input tests that must fail rather than hang: `deadline` interrupts a blocked call (a FIFO open)
in this process; `run_bounded` runs a snippet in a child with a wall-clock and memory limit (reading
/dev/zero grows memory inside one C call, which no signal interrupts)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Raises TimeoutError inside the block after `seconds` (SIGALRM; the main thread only)."""
    def expire(signum, frame):
        raise TimeoutError(f"still blocked after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


_LIMIT = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"  # in the child: no fork hook


def run_bounded(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -c code` from the repository root with 2 GiB of address space; a hang fails the test."""
    try:
        return subprocess.run([sys.executable, "-c", _LIMIT + code], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after {timeout} s: {code}") from None

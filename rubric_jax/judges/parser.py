"""Deterministic parser of a judge's verdict: reads only the text the judge generated.

Required format (stated in every judge prompt, see prompts.py): free reasoning, then a final block of
exactly one line per criterion, in the order the prompt lists them, each `<key>: <integer>`; a
single-dimension prompt uses the one key `SCORE`. The integer must lie in the criterion's range. Any
other ending (missing/extra/reordered lines, decimals, fractions, out-of-range values, a verdict line
repeated earlier in the text) makes the whole verdict invalid: scores NaN plus a reason, never a
default score. The caller decides on retries (llm_judge.py).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

SINGLE_KEY = "SCORE"
_LINE_RE = re.compile(r"^\s*([^:\n]+?)\s*:\s*(\S.*?)\s*$")
_INT_RE = re.compile(r"[0-9]{1,6}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Parsed scores [K] (NaN everywhere when invalid), validity, and the reason when invalid."""

    scores: np.ndarray
    valid: bool
    reason: str


def _invalid(num_keys: int, reason: str) -> Verdict:
    return Verdict(np.full((num_keys,), np.nan), False, reason)


def parse_verdict(text: str, keys: Sequence[str], ranges: Sequence[tuple[int, int]]) -> Verdict:
    """Scores for `keys` from the last len(keys) non-empty lines of the judge's text, or invalid + reason."""
    if len(keys) != len(ranges) or not keys:
        raise ValueError(f"parse_verdict: need one (low, high) range per key, got {len(keys)} keys, {len(ranges)} ranges")
    lines = [line for line in text.splitlines() if line.strip()]
    k = len(keys)
    if len(lines) < k:
        return _invalid(k, f"expected {k} verdict line(s), judge wrote {len(lines)} non-empty line(s)")
    key_set = set(keys)
    for line in lines[:-k]:
        m = _LINE_RE.match(line)
        if m and m.group(1) in key_set:
            return _invalid(k, f"verdict key {m.group(1)!r} also appears before the final block")
    scores = np.empty((k,), dtype=np.float64)
    for i, (line, key, (low, high)) in enumerate(zip(lines[-k:], keys, ranges)):
        m = _LINE_RE.match(line)
        if m is None or m.group(1) != key:
            return _invalid(k, f"line {i + 1} of the verdict block should be '{key}: <int>', got {line.strip()[:80]!r}")
        if not _INT_RE.fullmatch(m.group(2)):
            return _invalid(k, f"{key}: expected an integer, got {m.group(2)[:40]!r}")
        value = int(m.group(2))
        if not low <= value <= high:
            return _invalid(k, f"{key}: {value} outside [{low}, {high}]")
        scores[i] = value
    return Verdict(scores, True, "")


def parse_single(text: str, low: int, high: int) -> Verdict:
    """One-dimension verdict: the final line must be `SCORE: <int>` with the int in [low, high]."""
    return parse_verdict(text, (SINGLE_KEY,), ((low, high),))

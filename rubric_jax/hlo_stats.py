"""Collectives in a compiled XLA program: what crosses the interconnect, where, and how often.

The proof that a sharded step does what its layout promises is in the compiled HLO, not in a timing:
`collectives(compiled.as_text())` lists every all-gather, all-reduce, reduce-scatter, all-to-all and
collective-permute with its per-device result bytes, the computation it sits in, and how many times a
run of the program executes it:
  * computations are linked by the call graph (`calls=`, `to_apply=`, `body=`, `condition=`,
    `branch_computations=`); a while body executes `known_trip_count` times per execution of its
    caller, or an unknown number of times (a `lax.while_loop` with a data-dependent exit, such as the
    sampler's decode loop): then `executions` is None and `in_loop` is True;
  * asynchronous collectives are counted once, at their `-done` op (whose result is the data moved),
    never at `-start`.
Bytes are the result of the op on one device (all-gather: the gathered array; reduce-scatter: the
scattered shard; all-reduce: the reduced array).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Iterable, Sequence

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16, "bf16": 16,
         "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128,
         "f8e4m3fn": 8, "f8e5m2": 8, "f8e4m3": 8, "f8e4m3fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3b11fnuz": 8,
         "token": 0}
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_CALLEE = re.compile(r"\b(calls|to_apply|body|condition)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective op of a compiled program."""

    kind: str  # one of KINDS
    bytes: int  # per-device result bytes of one execution
    shape: str  # the result type as HLO prints it
    computation: str  # the HLO computation it belongs to
    executions: int | None  # executions per program run; None inside a loop of unknown trip count
    in_loop: bool  # inside a while body (at any depth)
    op_name: str  # the JAX source op (metadata op_name), "" when absent

    @property
    def total_bytes(self) -> int | None:
        """Bytes moved per program run (None when the trip count is unknown)."""
        return None if self.executions is None else self.bytes * self.executions


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO type string: an array `bf16[32,128]{1,0}` or a tuple of them."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        if dtype not in _BITS:
            raise ValueError(f"unknown HLO element type {dtype!r} in {shape!r}")
        count = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += count * _BITS[dtype] // 8
    return total


@dataclasses.dataclass
class _Computation:
    name: str
    instructions: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)  # name, type, op, rest


def _parse(hlo_text: str) -> tuple[dict[str, _Computation], str]:
    """Computations by name, and the entry computation's name."""
    computations: dict[str, _Computation] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = computations.setdefault(header.group(1), _Computation(header.group(1)))
            if line.lstrip().startswith("ENTRY"):
                entry = current.name
            continue
        if line.strip() == "}":
            current = None
            continue
        match = _INSTRUCTION.match(line) if current is not None else None
        if match:
            current.instructions.append(match.groups())
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text (pass compiled.as_text() of a jitted function)")
    return computations, entry


def _call_edges(computations: dict[str, _Computation]) -> dict[str, list[tuple[str, int | None, bool]]]:
    """callee -> [(caller, executions per caller execution (None: unknown), is a while loop edge)]."""
    edges: dict[str, list[tuple[str, int | None, bool]]] = collections.defaultdict(list)
    for caller, computation in computations.items():
        for _, _, op, rest in computation.instructions:
            callees = [(kind, name) for kind, name in _CALLEE.findall(rest)]
            for branches in _BRANCHES.findall(rest):
                callees += [("branch", b.strip().lstrip("%")) for b in branches.split(",") if b.strip()]
            trip = _TRIP_COUNT.search(rest)
            for kind, name in callees:
                looped = op == "while" and kind in ("body", "condition")
                factor = (int(trip.group(1)) if trip else None) if looped else 1
                edges[name].append((caller, factor, looped))
    return edges


def _executions(computations: dict[str, _Computation], entry: str) -> tuple[dict[str, int | None], set[str]]:
    """Executions per run of each computation reachable from `entry` (None: unknown), and the set of
    computations inside a while body at any depth."""
    edges = _call_edges(computations)
    executions: dict[str, int | None] = {}
    looped: dict[str, bool] = {}

    def visit(name: str, stack: frozenset[str]) -> tuple[int | None, bool] | None:
        if name == entry:
            return 1, False
        if name in executions:
            return executions[name], looped[name]
        total: int | None = 0
        inside, reached = False, False
        for caller, factor, is_loop in edges.get(name, []):
            if caller in stack:
                continue
            got = visit(caller, stack | {name})
            if got is None:
                continue
            runs, caller_looped = got
            reached = True
            inside |= is_loop or caller_looped
            total = None if total is None or runs is None or factor is None else total + runs * factor
        if not reached:
            return None
        executions[name], looped[name] = total, inside
        return total, inside

    for name in computations:
        visit(name, frozenset())
    executions[entry], looped[entry] = 1, False
    return executions, {name for name, inside in looped.items() if inside}


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective of a compiled program (see the module docstring for how they are counted)."""
    computations, entry = _parse(hlo_text)
    executions, in_loop = _executions(computations, entry)
    found = []
    for name, computation in computations.items():
        if name not in executions:
            continue
        for _, shape, op, rest in computation.instructions:
            kind = op[: -len("-done")] if op.endswith("-done") else op
            if kind not in KINDS:
                continue
            op_name = _OP_NAME.search(rest)
            found.append(Collective(kind, shape_bytes(shape), shape, name, executions[name], name in in_loop,
                                    op_name.group(1) if op_name else ""))
    return found


@dataclasses.dataclass(frozen=True)
class KindSummary:
    """Totals for one collective kind: ops and bytes per run outside loops of unknown length, and per
    iteration of such loops (e.g. per generated token of a decode loop)."""

    count: int
    bytes: int
    per_iteration_count: int
    per_iteration_bytes: int


def summarize(found: Iterable[Collective], kinds: Sequence[str] = KINDS) -> dict[str, KindSummary]:
    """Per kind: executions and bytes per run (known trip counts multiplied in), and the per-iteration
    counts of collectives inside loops whose trip count is unknown."""
    totals = collections.defaultdict(lambda: [0, 0, 0, 0])
    for c in found:
        entry = totals[c.kind]
        if c.executions is None:
            entry[2] += 1
            entry[3] += c.bytes
        else:
            entry[0] += c.executions
            entry[1] += c.bytes * c.executions
    return {kind: KindSummary(*totals[kind]) for kind in kinds}


def format_table(summary: dict[str, KindSummary]) -> str:
    """A plain-text table of `summarize`'s result in GiB."""
    gib = 1 << 30
    lines = [f"{'collective':<20}{'ops/run':>10}{'GiB/run':>12}{'ops/iter':>10}{'GiB/iter':>12}"]
    for kind, s in summary.items():
        lines.append(f"{kind:<20}{s.count:>10}{s.bytes / gib:>12.3f}{s.per_iteration_count:>10}"
                     f"{s.per_iteration_bytes / gib:>12.3f}")
    return "\n".join(lines)

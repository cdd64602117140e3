"""Collectives in a compiled XLA program: what crosses the interconnect, where, and how often.

The proof that a sharded step does what its layout promises is in the compiled HLO, not in a timing:
`collectives(compiled.as_text())` lists every all-gather, all-reduce, reduce-scatter, all-to-all and
collective-permute with its per-device result bytes, the computation it sits in, and how many times a
run of the program executes it:
  * computations are linked by the call graph (`calls=`, `to_apply=`, `body=`, `condition=`,
    `branch_computations=`); a while body executes `known_trip_count` times per execution of its
    caller, or an unknown number of times (a `lax.while_loop` with a data-dependent exit, such as the
    sampler's decode loop): then `executions` is None, `in_loop` is True and `per_iteration` counts
    its executions per iteration of that loop (times the trip counts of known loops nested inside it,
    e.g. a scan over layers inside the decode loop); a loop's condition counts with its body (once per
    iteration: a decode loop's stop test, an all-reduce of `all(done)` over the replicas, is a per-token
    collective); `summarize` reports the busiest such loop;
  * asynchronous collectives are counted once, at their `-done` op (whose result is the data moved),
    never at `-start`.
Bytes are the result of the op on one device (all-gather: the gathered array; reduce-scatter: the
scattered shard; all-reduce: the reduced array).

`kernels(text)` lists what a compiled (GPU) program launches, with executions counted the same way and the
bytes each execution reads and writes; `non_matmul_bytes` sums those of the kernels without a matmul (the
traffic an update should keep small beside its GEMMs) and `float32_dots` names the dots with float32 operands.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

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
_CUSTOM_CALL_TARGET = re.compile(r'custom_call_target="([^"]*)"')
# How XLA's custom-call targets of cuDNN attention start ("__cudnn$fmhaScaleBiasSoftmax" with a mask as bias,
# "__cudnn$fmhaSoftmax" without); the backward's end in "Backward".
CUDNN_ATTENTION = "__cudnn$fmha"


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective op of a compiled program."""

    kind: str  # one of KINDS
    bytes: int  # per-device result bytes of one execution
    shape: str  # the result type as HLO prints it
    computation: str  # the HLO computation it belongs to
    executions: int | None  # executions per program run; None inside a loop of unknown trip count
    per_iteration: int  # executions per iteration of the innermost loop of unknown trip count (0: none)
    in_loop: bool  # inside a while body (at any depth)
    op_name: str  # the JAX source op (metadata op_name), "" when absent
    loop: str = ""  # body computation of that innermost loop of unknown trip count (also for its condition)

    @property
    def total_bytes(self) -> int | None:
        """Bytes moved per program run (None when the trip count is unknown)."""
        return None if self.executions is None else self.bytes * self.executions


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """(element type, dims) of each array of an HLO type string: an array `bf16[32,128]{1,0}` or a tuple."""
    return [(dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in _ARRAY.findall(shape)]


def array_dims(shape: str) -> list[tuple[int, ...]]:
    """The dims of each array of an HLO type string (`arrays` without the element types)."""
    return [dims for _, dims in arrays(shape)]


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO type string: an array `bf16[32,128]{1,0}` or a tuple of them."""
    total = 0
    for dtype, dims in arrays(shape):
        if dtype not in _BITS:
            raise ValueError(f"unknown HLO element type {dtype!r} in {shape!r}")
        total += math.prod(dims) * _BITS[dtype] // 8
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


def _call_edges(computations: dict[str, _Computation]) -> dict[str, list[tuple[str, int | None, bool, str]]]:
    """callee -> [(caller, executions per caller execution (None: unknown), is a while loop edge, the loop's
    body: the same name for the body and the condition of one while, so that they count as one loop)]."""
    edges: dict[str, list[tuple[str, int | None, bool, str]]] = collections.defaultdict(list)
    for caller, computation in computations.items():
        for _, _, op, rest in computation.instructions:
            callees = [(kind, name) for kind, name in _CALLEE.findall(rest)]
            for branches in _BRANCHES.findall(rest):
                callees += [("branch", b.strip().lstrip("%")) for b in branches.split(",") if b.strip()]
            trip = _TRIP_COUNT.search(rest)
            body = next((name for kind, name in callees if kind == "body"), "")
            for kind, name in callees:
                looped = op == "while" and kind in ("body", "condition")
                factor = (int(trip.group(1)) if trip else None) if looped else 1
                edges[name].append((caller, factor, looped, body if looped else ""))
    return edges


@dataclasses.dataclass(frozen=True)
class _Runs:
    """How often a computation executes: per program run (None when reached through a loop of unknown
    trip count), per iteration of the innermost such loop (0 outside one) and that loop's computation,
    and whether it sits in a while body at any depth."""

    per_run: int | None
    per_iteration: int
    in_loop: bool
    loop: str = ""


def _executions(computations: dict[str, _Computation], entry: str) -> dict[str, _Runs]:
    """`_Runs` of each computation reachable from `entry`. A while body of unknown trip count runs once
    per iteration of its own loop; known trip counts of loops nested inside it multiply in (a layer scan
    inside a decode loop: the scan body runs L times per generated token)."""
    edges = _call_edges(computations)
    found: dict[str, _Runs] = {entry: _Runs(1, 0, False)}

    def visit(name: str, stack: frozenset[str]) -> _Runs | None:
        if name in found:
            return found[name]
        per_run: int | None = 0
        per_iteration, inside, reached, loop = 0, False, False, ""
        for caller, factor, is_loop, body in edges.get(name, []):
            if caller in stack:
                continue
            runs = visit(caller, stack | {name})
            if runs is None:
                continue
            reached = True
            inside |= is_loop or runs.in_loop
            if factor is None:  # this computation is the body (or condition) of a loop of unknown length
                per_run, per_iteration, loop = None, per_iteration + 1, body
            else:
                per_run = None if per_run is None or runs.per_run is None else per_run + runs.per_run * factor
                per_iteration += runs.per_iteration * factor
                loop = loop or runs.loop
        if not reached:
            return None
        found[name] = _Runs(per_run, per_iteration, inside, loop)
        return found[name]

    for name in computations:
        visit(name, frozenset())
    return found


def collectives(hlo_text: str, kinds: Sequence[str] = KINDS) -> list[Collective]:
    """Every collective of a compiled program (see the module docstring for how they are counted); other
    `kinds` of op (e.g. "dynamic-slice": what a decode loop copies per token) are counted the same way."""
    computations, entry = _parse(hlo_text)
    runs_of = _executions(computations, entry)
    found = []
    for name, computation in computations.items():
        runs = runs_of.get(name)
        if runs is None:
            continue
        for _, shape, op, rest in computation.instructions:
            kind = op[: -len("-done")] if op.endswith("-done") else op
            if kind not in kinds:
                continue
            op_name = _OP_NAME.search(rest)
            found.append(Collective(kind, shape_bytes(shape), shape, name, runs.per_run, runs.per_iteration,
                                    runs.in_loop, op_name.group(1) if op_name else "", runs.loop))
    return found


def compile_partitioned(lowered: Any) -> tuple[Any, str]:
    """Compiles a `jax.stages.Lowered` and returns it with the HLO text right after XLA's SPMD partitioner
    (dumped to a temporary directory): the collectives as the partitioner placed them, in their element
    types. Why: a backend may rewrite them later (the CPU backend widens every bf16 collective to f32), so
    only this text shows a CPU test which dtype a gather of a GPU program would move."""
    with tempfile.TemporaryDirectory() as tmp:
        compiled = lowered.compile(compiler_options={"xla_dump_to": tmp, "xla_dump_hlo_pass_re": "spmd-partitioning"})
        dumped = sorted(Path(tmp).glob("*after_spmd-partitioning*.txt"))
        if not dumped:
            raise ValueError("XLA dumped no SPMD-partitioned HLO (a compilation cache hit, or no partitioning)")
        return compiled, dumped[0].read_text()


def custom_calls(hlo_text: str) -> dict[str, int]:
    """Executions per run of each custom-call target of a compiled program (e.g. "__cudnn$fmhaSoftmax",
    cuDNN flash attention's forward), known trip counts multiplied in; a call inside a loop of unknown
    length counts its executions per iteration of that loop."""
    computations, entry = _parse(hlo_text)
    runs_of = _executions(computations, entry)
    counts: dict[str, int] = collections.Counter()
    for name, computation in computations.items():
        runs = runs_of.get(name)
        if runs is None:
            continue
        for _, _, op, rest in computation.instructions:
            target = _CUSTOM_CALL_TARGET.search(rest) if op == "custom-call" else None
            if target:
                counts[target.group(1)] += runs.per_run if runs.per_run is not None else runs.per_iteration
    return dict(counts)


@dataclasses.dataclass(frozen=True)
class KindSummary:
    """Totals for one collective kind: ops and bytes per run outside loops of unknown length, and per
    iteration of such loops (e.g. per generated token of a decode loop; of the busiest one when there
    are several, such as the sampler's decode segments, which run one after another)."""

    count: int
    bytes: int
    per_iteration_count: int
    per_iteration_bytes: int


def summarize(found: Iterable[Collective], kinds: Sequence[str] = KINDS) -> dict[str, KindSummary]:
    """Per kind: executions and bytes per run (known trip counts multiplied in), and executions and bytes
    per iteration of loops whose trip count is unknown (known trip counts inside them multiplied in),
    taken from the loop with the most executions per iteration: the sampler's decode segments are
    sequential loops over different tokens, so adding their counts would over-count per token."""
    per_run = collections.defaultdict(lambda: [0, 0])
    per_loop = collections.defaultdict(lambda: [0, 0])  # (kind, loop) -> per-iteration executions, bytes
    for c in found:
        if c.executions is None:
            entry = per_loop[c.kind, c.loop]
            entry[0] += c.per_iteration
            entry[1] += c.bytes * c.per_iteration
        else:
            per_run[c.kind][0] += c.executions
            per_run[c.kind][1] += c.bytes * c.executions
    busiest = {kind: max((v for (k, _), v in per_loop.items() if k == kind), default=[0, 0]) for kind in kinds}
    return {kind: KindSummary(*per_run[kind], *busiest[kind]) for kind in kinds}


def format_table(summary: dict[str, KindSummary]) -> str:
    """A plain-text table of `summarize`'s result in GiB."""
    gib = 1 << 30
    lines = [f"{'collective':<20}{'ops/run':>10}{'GiB/run':>12}{'ops/iter':>10}{'GiB/iter':>12}"]
    for kind, s in summary.items():
        lines.append(f"{kind:<20}{s.count:>10}{s.bytes / gib:>12.3f}{s.per_iteration_count:>10}"
                     f"{s.per_iteration_bytes / gib:>12.3f}")
    return "\n".join(lines)


# Kernels: what a compiled GPU program launches, and what its non-matmul kernels read and write.
# Ops that launch nothing (they name, alias or sequence buffers) or that only end an asynchronous op.
_NOT_KERNELS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional",
                          "call", "after-all", "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain"})
_SLICES = frozenset({"dynamic-slice", "slice", "gather"})  # read only their result's elements of operand 0
_OPERAND = re.compile(r"%([\w.\-]+)\s*$")
_FUSION_KIND = re.compile(r"\bkind=(k\w+)")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel launch site of a compiled program: a fusion, custom call or unfused op of a computation that
    runs on the host's control flow (the entry, a while loop's body or condition, a conditional's branch)."""

    name: str
    op: str  # "fusion:kLoop", "custom-call:__cublas$gemm", "copy", ...
    computation: str
    executions: int  # per program run, known trip counts multiplied in (per iteration in a loop of unknown length)
    bytes: int  # bytes one execution reads and writes (`_traffic`)
    matmul: bool  # a dot or convolution runs in it, or a custom call (cuBLAS, cuDNN)
    op_name: str  # the JAX source op (metadata op_name), "" when absent

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.executions


def _operand_names(rest: str) -> list[str]:
    """The operand names of an instruction: the `%name`s of its top-level argument list (`rest` starts after
    the op's opening parenthesis), operand types printed or not."""
    depth, current, names = 0, "", []
    for ch in rest:
        if ch in "([{" or ch == ")" and depth > 0:
            depth += 1 if ch in "([{" else -1
        elif ch in "]}":
            depth -= 1
        elif ch == ")" or ch == "," and depth == 0:
            found = _OPERAND.search(current.strip())
            if found:
                names.append(found.group(1))
            if ch == ")":
                break
            current = ""
            continue
        current += ch
    return names


def _control_computations(computations: dict[str, _Computation], entry: str) -> set[str]:
    """The entry and the computations it reaches through while loops, conditionals and calls (not fusions or
    reducers): where each instruction is a kernel launch or none."""
    found, todo = {entry}, [entry]
    while todo:
        for _, _, op, rest in computations[todo.pop()].instructions:
            if op not in ("while", "conditional", "call"):
                continue
            callees = [name for kind, name in _CALLEE.findall(rest) if kind != "to_apply" or op == "call"]
            callees += [b.strip().lstrip("%") for branches in _BRANCHES.findall(rest) for b in branches.split(",")]
            for name in callees:
                if name and name in computations and name not in found:
                    found.add(name)
                    todo.append(name)
    return found


def _traffic(instructions: list[tuple[str, str, str, str]], outer_types: list[str]) -> int:
    """Bytes a kernel reads and writes: its operands (`outer_types`, for the parameters of its fused
    `instructions`; a lone op is its own one-instruction body) and its result. A parameter that only feeds
    slices (dynamic-slice, slice, gather) counts the slices' bytes; a dynamic-update-slice into a parameter
    (in place: XLA aliases the buffer) reads nothing of it and writes the update only."""
    types = {name: shape for name, shape, _, _ in instructions}
    users: dict[str, list[tuple[str, int, str]]] = collections.defaultdict(list)  # name -> (user op, index, user)
    for name, _, op, rest in instructions:
        for index, operand in enumerate(_operand_names(rest)):
            users[operand].append((op, index, name))

    def through_bitcasts(name: str) -> list[tuple[str, int, str]]:
        return [u for op, i, user in users[name] for u in (through_bitcasts(user) if op == "bitcast" else [(op, i, user)])]

    params = [(name, rest) for name, _, op, rest in instructions if op == "parameter"]
    read = 0
    for name, rest in params:
        index = int(re.match(r"\s*(\d+)", rest).group(1))
        uses = through_bitcasts(name)
        if uses and all((op in _SLICES or op == "dynamic-update-slice") and i == 0 for op, i, _ in uses):
            read += sum(shape_bytes(types[user]) for op, _, user in uses if op in _SLICES)
        else:
            read += shape_bytes(outer_types[index]) if index < len(outer_types) else 0
    root = instructions[-1]
    by_name = {name: (op, rest) for name, _, op, rest in instructions}

    def written(name: str) -> int:
        op, rest = by_name[name]
        operands = _operand_names(rest)
        if op == "tuple":
            return sum(written(o) for o in operands)
        if op == "bitcast":
            return written(operands[0])
        if op == "dynamic-update-slice" and _is_parameter(operands[0], by_name):
            return shape_bytes(types[operands[1]])
        return shape_bytes(types[name])

    return read + written(root[0])


def _is_parameter(name: str, by_name: dict[str, tuple[str, str]]) -> bool:
    """Whether `name` is a parameter, seen through bitcasts."""
    op, rest = by_name[name]
    return op == "parameter" or op == "bitcast" and _is_parameter(_operand_names(rest)[0], by_name)


def _has_matmul(computations: dict[str, _Computation], name: str) -> bool:
    """Whether a dot or convolution runs in computation `name` or the computations it calls."""
    computation = computations.get(name)
    if computation is None:
        return False
    return any(op in ("dot", "convolution") or any(_has_matmul(computations, callee)
                                                   for kind, callee in _CALLEE.findall(rest) if kind == "calls")
               for _, _, op, rest in computation.instructions)


def kernels(hlo_text: str) -> list[Kernel]:
    """Every kernel launch site of a compiled program with its executions per run and bytes per execution
    (`_traffic`); collectives are left to `collectives`. A kernel in a loop of unknown length counts its
    executions per iteration."""
    computations, entry = _parse(hlo_text)
    runs_of = _executions(computations, entry)
    found = []
    for name in _control_computations(computations, entry):
        runs = runs_of.get(name)
        if runs is None:
            continue
        types = {i: shape for i, shape, _, _ in computations[name].instructions}
        for instruction in computations[name].instructions:
            iname, shape, op, rest = instruction
            base = op[: -len("-start")] if op.endswith("-start") else op
            if op in _NOT_KERNELS or op.endswith("-done") or base in KINDS:
                continue
            outer = [types.get(o, "") for o in _operand_names(rest)]
            callee = next((c for kind, c in _CALLEE.findall(rest) if kind == "calls"), None)
            if op == "fusion" and callee in computations:
                body = computations[callee].instructions
                matmul = _has_matmul(computations, callee)
                kind = _FUSION_KIND.search(rest)
                label = f"fusion:{kind.group(1) if kind else ''}"
            else:
                params = [(f"p{i}", t, "parameter", f"{i})") for i, t in enumerate(outer)]
                body = params + [(iname, shape, op, ", ".join(f"%p{i}" for i in range(len(outer))) + ")")]
                target = _CUSTOM_CALL_TARGET.search(rest)
                matmul = op in ("dot", "convolution", "custom-call")
                label = f"{op}:{target.group(1)}" if op == "custom-call" and target else op
            op_name = _OP_NAME.search(rest)
            executions = runs.per_run if runs.per_run is not None else runs.per_iteration
            found.append(Kernel(iname, label, name, executions, _traffic(body, outer), matmul,
                                op_name.group(1) if op_name else ""))
    return found


def non_matmul_bytes(found: Iterable[Kernel]) -> int:
    """Bytes per run that kernels without a matmul read and write (elementwise maps, reductions, copies, casts,
    slices): the traffic beside the GEMMs and attention calls, loop trip counts multiplied in."""
    return sum(k.total_bytes for k in found if not k.matmul)


def float32_dots(hlo_text: str) -> list[str]:
    """The dots (in kernels or fused into them) whose operands are float32 (`name: type (op_name)`): each runs
    at float32 (or TF32) speed on a GPU, where a bf16 dot with float32 accumulation runs at bf16 speed."""
    computations, _ = _parse(hlo_text)
    found = []
    for computation in computations.values():
        types = {name: shape for name, shape, _, _ in computation.instructions}
        for name, shape, op, rest in computation.instructions:
            operands = _operand_names(rest) if op == "dot" else []
            if operands and all(types.get(o, "").startswith("f32[") for o in operands):
                op_name = _OP_NAME.search(rest)
                found.append(f"{name}: {shape} ({op_name.group(1) if op_name else ''})")
    return found


def _executed(computations: dict[str, _Computation], entry: str) -> dict[str, bool]:
    """The computations whose top-level ops run as launches (entry, while bodies and conditions, branches, calls; not
    fusion bodies or reducers), each with whether it runs: False for the condition of a loop with a known trip count,
    which XLA's GPU runtime never evaluates (it runs the body that many times)."""
    found = {entry: True}
    stack = [entry]
    while stack:
        for _, _, op, rest in computations[stack.pop()].instructions:
            callees = []
            if op == "while":
                known = _TRIP_COUNT.search(rest) is not None
                callees = [(name, kind != "condition" or not known) for kind, name in _CALLEE.findall(rest)
                           if kind in ("body", "condition")]
            elif op == "call":
                callees = [(name, True) for kind, name in _CALLEE.findall(rest) if kind == "to_apply"]
            elif op == "conditional":
                callees = [(b.strip().lstrip("%"), True) for branches in _BRANCHES.findall(rest)
                           for b in branches.split(",") if b.strip()]
            for name, runs in callees:
                if name in computations and name not in found:
                    found[name] = runs
                    stack.append(name)
    return found


def _is_launch(op: str) -> bool:
    """Whether a top-level op launches a kernel (an asynchronous pair once, at its start)."""
    return op not in _NOT_KERNELS and not op.endswith("-done")


@dataclasses.dataclass(frozen=True)
class LoopKernels:
    """Kernel launches per iteration of one loop of unknown trip count (a decode loop's segment: one per generated
    token), known trip counts inside it multiplied in, by kind of op (a fusion's kind, a custom call's target)."""

    loop: str  # the loop's body computation
    launches: int
    by_kind: dict[str, int]


def loop_kernels(hlo_text: str) -> list[LoopKernels]:
    """Kernel launches per iteration of every loop of unknown trip count in a program compiled by XLA's GPU compiler,
    busiest first: fusions, custom calls (cuBLAS, cuDNN, Triton), copies and other unfused ops in the loop's body and
    condition and in what they call, each counted once per execution. Why: a decode step is a few hundred small
    kernels, so their number, not the bytes, bounds its time (issue 33)."""
    computations, entry = _parse(hlo_text)
    runs_of = _executions(computations, entry)
    per_loop: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for name, executes in _executed(computations, entry).items():
        runs = runs_of.get(name)
        if not executes or runs is None or runs.per_run is not None:
            continue
        for _, _, op, rest in computations[name].instructions:
            if _is_launch(op):
                detail = _FUSION_KIND.search(rest) if op == "fusion" else _CUSTOM_CALL_TARGET.search(rest)
                per_loop[runs.loop][f"{op}:{detail.group(1)}" if detail else op] += runs.per_iteration
    found = [LoopKernels(loop, sum(kinds.values()), dict(kinds)) for loop, kinds in per_loop.items()]
    return sorted(found, key=lambda k: -k.launches)


def float32_outputs(hlo_text: str, dims: tuple[int, ...]) -> list[str]:
    """The ops of a compiled program's executed computations (not inside fusions) that write a float32 array of
    exactly `dims`, by name: e.g. a decode step's [B, V] float32 logits, a round trip through memory."""
    computations, entry = _parse(hlo_text)
    return [f"{name} ({op}, in {computation})" for computation in _executed(computations, entry)
            for name, shape, op, _ in computations[computation].instructions
            if _is_launch(op) and ("f32", dims) in arrays(shape)]

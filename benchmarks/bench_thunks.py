"""Does XLA's CPU runtime run independent ops concurrently? One decode-like chain of B rows vs k independent chains
of B / k rows in the same `fori_loop` body, alternated in one process: wall and process CPU per call, and from a
`jax.profiler` trace of one call how long XLA's two busiest worker threads ran ops at the same time.

Each chain is a decode step at the GRPO benchmark's shapes (B = 64, hidden 96, 3 residual MLP blocks 96 -> 256 -> 96,
vocab 512 logits, a Gumbel-argmax draw feeding the next step's embedding lookup). If the runtime ran the k chains'
ops on different cores, k > 1 would lower the wall time at similar CPU (benchmarks/RESULTS.md, "two independent
decode chains").
  PYTHONPATH=. .venv/bin/python -m benchmarks.bench_thunks --chains=1,2,4
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

_CHAINS = flags.DEFINE_list("chains", ["1", "2", "4"], "Independent chains the batch is split into, per variant.")
_ROUNDS = flags.DEFINE_integer("rounds", 9, "Timed calls per variant (alternated); the median is printed.")
_STEPS = flags.DEFINE_integer("steps", 128, "Decode steps per call.")
BATCH, HIDDEN, MLP, VOCAB, LAYERS = 64, 96, 256, 512, 3


def _decode_step(params: dict, token_B: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One step of a chain: the next token of each row and its log-prob."""
    h_BxD = params["embed"][token_B]
    for up, down in zip(params["up"], params["down"]):
        x_BxD = h_BxD * jax.lax.rsqrt(jnp.mean(h_BxD * h_BxD, -1, keepdims=True) + 1e-6)
        h_BxD = h_BxD + jax.nn.silu(x_BxD @ up) @ down
    logits_BxV = h_BxD @ params["embed"].T
    token_B = jnp.argmax(logits_BxV + jax.random.gumbel(key, logits_BxV.shape), -1).astype(jnp.int32)
    logp_B = jnp.take_along_axis(jax.nn.log_softmax(logits_BxV), token_B[:, None], -1)[:, 0]
    return token_B, logp_B


def _decode(params: dict, token_B: jax.Array, key: jax.Array, chains: int, steps: int) -> tuple:
    """`steps` decode steps of `chains` independent chains, each over its own block of rows (no data shared)."""
    def body(t, carry):
        out = []
        for c, (token, total) in enumerate(carry):
            token, logp = _decode_step(params, token, jax.random.fold_in(jax.random.fold_in(key, t), c))
            out.append((token, total + logp))
        return tuple(out)

    carry = tuple((rows, jnp.zeros(rows.shape)) for rows in jnp.split(token_B, chains))
    return jax.lax.fori_loop(0, steps, body, carry)


def _overlap_ms(trace_dir: str) -> tuple[float, float]:
    """(busy, concurrent) ms of the two busiest XLA worker threads in a perfetto trace: the time each ran ops
    (summed), and the time both did at once."""
    path = next(Path(trace_dir).rglob("*.trace.json.gz"))
    events = json.load(gzip.open(path))["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "Eigen" in names.get((e.get("pid"), e.get("tid")), ""):
            spans[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    busiest = sorted(spans.values(), key=len)[-2:]
    merged = [_union(s) for s in busiest]
    busy = sum(b - a for m in merged for a, b in m)
    union = sum(b - a for a, b in _union([x for m in merged for x in m]))
    return busy / 1e3, (busy - union) / 1e3


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint intervals covering `spans`."""
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def main(argv: list[str]) -> None:
    del argv
    load_before = os.getloadavg()
    keys = jax.random.split(jax.random.key(0), 2 * LAYERS + 1)
    params = {"embed": jax.random.normal(keys[0], (VOCAB, HIDDEN)) * 0.1,
              "up": [jax.random.normal(k, (HIDDEN, MLP)) * 0.1 for k in keys[1:LAYERS + 1]],
              "down": [jax.random.normal(k, (MLP, HIDDEN)) * 0.1 for k in keys[LAYERS + 1:]]}
    token_B, key = jnp.arange(BATCH, dtype=jnp.int32) % VOCAB, jax.random.key(1)
    calls = {int(k): jax.jit(lambda p, t, s, k=int(k): _decode(p, t, s, k, _STEPS.value)) for k in _CHAINS.value}
    for call in calls.values():
        jax.block_until_ready(call(params, token_B, key))
    times = {k: [] for k in calls}
    for _ in range(_ROUNDS.value):
        for k, call in calls.items():
            wall, cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(call(params, token_B, key))
            times[k].append((time.perf_counter() - wall, time.process_time() - cpu))
    for k, call in calls.items():
        with tempfile.TemporaryDirectory() as trace_dir:
            with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
                jax.block_until_ready(call(params, token_B, key))
            busy, both = _overlap_ms(trace_dir)
        wall, cpu = np.median(np.array(times[k]), axis=0) * 1e3
        print(f"{k} chain(s) of {BATCH // k} rows: wall {wall:6.1f} ms, CPU {cpu:6.1f} ms (median of "
              f"{_ROUNDS.value}); traced call: ops {busy:6.1f} ms on XLA's two busiest threads, {both:5.1f} ms "
              "of it concurrent")
    print(f"jax {jax.__version__} ({jax.default_backend()}, {jax.device_count()} device), {os.cpu_count()} CPU cores; "
          f"load avg before {' '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    app.run(main)

"""Judge server load: many concurrent requests from several client processes against one request at a time, in
the same run, on the same experiments.serve (the shipped tiny judge, greedy, 127.0.0.1).

  PYTHONPATH=. .venv/bin/python benchmarks/bench_serve.py [--requests=200] [--clients=4] [--sequential=40]

The server starts with --config.warmup_prompt_tokens set to the longest request's prompt (the tiny judge's chat
template), so every batch bucket the phases use is compiled before any timing and no round is compile-bound.

Checks while it measures: every concurrent request is answered exactly once (unique ids, one reply per request)
with the answer its prompt gets alone (greedy), and the server batched (mean prompts per generate call > 1, from
/health). Prints one JSON line: requests/s and latency percentiles of both phases, their ratio, the mean batch,
and the server's CPU seconds per phase (wall time on a machine shared with other jobs: give `uptime` with it).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from absl import app, flags

REPO = Path(__file__).resolve().parents[1]
TINY_JUDGE = REPO / "rubric_jax" / "assets" / "tiny_judge"
_REQUESTS = flags.DEFINE_integer("requests", 200, "Concurrent-phase requests, split over --clients processes.")
_CLIENTS = flags.DEFINE_integer("clients", 4, "Client processes of the concurrent phase (each sends its share "
                                "at once).")
_SEQUENTIAL = flags.DEFINE_integer("sequential", 40, "Requests of the one-at-a-time phase.")
_PROMPTS = flags.DEFINE_integer("prompts", 40, "Distinct prompts (request i asks prompt i mod prompts).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed concurrent rounds (each reported; the ratio uses the fastest "
                               "one that compiled nothing).")
_WARMUPS = flags.DEFINE_integer("warmups", 3, "Most untimed concurrent rounds (stops at one that compiles nothing).")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 16, "max_tokens of every request (the tiny judge's budget).")


def prompt(i: int) -> list[dict[str, str]]:
    """The tiny judge's kind of question: does this customer reply thank or apologise?"""
    reply = ("Thank you for waiting, your parcel ships today." if i % 3 else "Your parcel ships today.")
    return [{"role": "user", "content": f"Criterion: The response thanks or apologises.\nResponse #{i}: {reply}"}]


def ask(base: str, i: int, prompts: int, max_tokens: int) -> tuple[int, str, str, float]:
    """(request index, answer id, answer text, latency in seconds) of request i (prompt i mod `prompts`)."""
    body = json.dumps({"model": "tiny_judge", "messages": prompt(i % prompts), "max_tokens": max_tokens}).encode()
    start = time.perf_counter()
    request = urllib.request.Request(f"{base}/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        reply = json.loads(r.read())
    return i, reply["id"], reply["choices"][0]["message"]["content"], time.perf_counter() - start


def client(args: tuple[str, list[int], int, int]) -> list[tuple[int, str, str, float]]:
    """One client process: all its requests at once (one thread each); args: base URL, request indices,
    distinct prompts, max_tokens (passed: a spawned process has no parsed flags)."""
    base, indices, prompts, max_tokens = args
    with ThreadPoolExecutor(len(indices)) as pool:
        return list(pool.map(lambda i: ask(base, i, prompts, max_tokens), indices))


def longest_prompt_tokens(prompts: int) -> int:
    """Tokens of the longest of the first `prompts` requests as the server renders them (the judge's chat template):
    what --config.warmup_prompt_tokens compiles every batch bucket for."""
    from rubric_jax import data
    from rubric_jax.models.checkpoint import load_tokenizer

    return max(map(len, data.encode_chats(load_tokenizer(str(TINY_JUDGE)), [prompt(i) for i in range(prompts)])))


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def health(base: str) -> dict:
    return json.loads(urllib.request.urlopen(f"{base}/health", timeout=60).read())


def percentiles(latencies: list[float]) -> dict[str, float]:
    return {f"p{q}_s": round(float(np.percentile(latencies, q)), 4) for q in (50, 90, 99)}


def start_server(*flags: str) -> tuple[subprocess.Popen, str]:
    """experiments.serve on the shipped tiny judge at a free 127.0.0.1 port, and its base URL once /health answers
    (at most 300 s: a warm-up compiles first)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "experiments.serve", f"--checkpoint={TINY_JUDGE}",
                               "--judge=configs/judges/tiny.py", f"--config.port={port}", *flags],
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            health(base)
            return server, base
        except OSError:
            if server.poll() is not None:
                raise RuntimeError(f"experiments.serve exited {server.returncode}") from None
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("experiments.serve did not answer /health in 300 s")


def main(argv: list[str]) -> None:
    del argv
    server, base = start_server(f"--config.warmup_prompt_tokens={longest_prompt_tokens(_PROMPTS.value)}")
    pool = multiprocessing.get_context("spawn").Pool(_CLIENTS.value)  # started before any timing
    try:
        # Warm-up, untimed: the server compiled every batch bucket of the prompts' length bucket before it answered
        # /health; these rounds compile anything left (a new bucket compiles for seconds: "compiles" says if one
        # still did while timed).
        settings = (_PROMPTS.value, _MAX_TOKENS.value)
        alone = {i: ask(base, i, *settings)[2] for i in range(_PROMPTS.value)}
        shares = [(base, list(range(c, _REQUESTS.value, _CLIENTS.value)), *settings) for c in range(_CLIENTS.value)]
        for _ in range(_WARMUPS.value):  # until a round compiles nothing new
            before = health(base)["traces"]
            pool.map(client, shares)
            if health(base)["traces"] == before:
                break

        cpu0, h0, t0 = server_cpu_s(server.pid), health(base), time.perf_counter()
        sequential = [ask(base, i, *settings) for i in range(_SEQUENTIAL.value)]
        seq_wall, cpu_seq, h_seq = time.perf_counter() - t0, server_cpu_s(server.pid) - cpu0, health(base)

        rounds = []  # the concurrent phase, timed _ROUNDS times
        for _ in range(_ROUNDS.value):
            cpu1, h1, t1 = server_cpu_s(server.pid), health(base), time.perf_counter()
            replies = [r for share in pool.map(client, shares) for r in share]
            rounds.append((replies, time.perf_counter() - t1, server_cpu_s(server.pid) - cpu1, h1, health(base)))
    finally:
        pool.terminate()
        server.terminate()
        server.wait(timeout=60)

    seq_rps = _SEQUENTIAL.value / seq_wall
    summaries = []
    for replies, wall, cpu, h1, h2 in rounds:
        assert sorted(i for i, _, _, _ in replies) == list(range(_REQUESTS.value)), "a request lost or answered twice"
        assert len({rid for _, rid, _, _ in replies}) == _REQUESTS.value, "an answer id repeats"
        wrong = [i for i, _, text, _ in replies if text != alone[i % _PROMPTS.value]]
        assert not wrong, f"requests {wrong[:5]} got another answer than their prompt alone"
        calls, prompts = h2["generate_calls"] - h1["generate_calls"], h2["prompts"] - h1["prompts"]
        assert prompts == _REQUESTS.value and prompts / calls > 1, "the server did not batch"
        summaries.append({"requests_per_s": round(_REQUESTS.value / wall, 2), **percentiles([r[3] for r in replies]),
                          "server_cpu_s": round(cpu, 2), "generate_calls": calls,
                          "mean_batch": round(prompts / calls, 2), "compiles": h2["traces"] - h1["traces"]})
    best = max(summaries, key=lambda r: (r["compiles"] == 0, r["requests_per_s"]))
    print(json.dumps({
        "one_at_a_time": {"requests": _SEQUENTIAL.value, "requests_per_s": round(seq_rps, 2),
                          **percentiles([r[3] for r in sequential]), "server_cpu_s": round(cpu_seq, 2),
                          "generate_calls": h_seq["generate_calls"] - h0["generate_calls"]},
        "concurrent": {"requests": _REQUESTS.value, "clients": _CLIENTS.value, "rounds": summaries},
        "throughput_ratio_best_round": round(best["requests_per_s"] / seq_rps, 2), "answers_match_alone": True,
    }))


if __name__ == "__main__":
    app.run(main)

"""Judging overlapped with sampling (rl.rollout_chunks; docs/training.md): GRPO steps of the tiny default whose
politeness judge is served by experiments.serve (the shipped tiny judge, 127.0.0.1), sampled in one call then judged
(sequential) against in --chunks calls, each judged while the next samples (chunked), interleaved in one run (ABBA
order) on the same server, questions and parameters.

  PYTHONPATH=. .venv/bin/python -m benchmarks.bench_overlap [--steps=4] [--chunks=2]

The policy is the untrained (random) tiny model, which fails the format gate on every row, so reward.gates_first is
off here: every row's politeness goes to the judge, as for a policy past SFT. Each step starts from the same
parameters (the update is timed, not applied). Prints one JSON line: per path the median s/step, the judge's host
seconds (the reward calls, timed the same way for both paths) and, chunked, the judge time hidden behind sampling
and its share (the step's overlap/* metrics); the CPU seconds of this process and of the server (a machine shared
with other jobs: give `uptime` with it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
from absl import app, flags

from benchmarks.bench_serve import health, server_cpu_s, start_server
from configs import tiny
from rubric_jax.train import grpo_stage, loop

_STEPS = flags.DEFINE_integer("steps", 4, "Timed GRPO steps per path (after one untimed warm-up step each).")
_CHUNKS = flags.DEFINE_integer("chunks", 2, "rl.rollout_chunks of the chunked path (must divide 8 questions).")


@dataclasses.dataclass
class TimedReward:
    """The experiment's reward, with the host seconds its calls took added up (the judge time of either path)."""

    reward: Any
    seconds: float = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.reward(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def timed_step(exp: Any, questions: list, key: jax.Array) -> tuple[float, float, dict[str, Any]]:
    """(wall s, judge s, metrics row) of one GRPO iteration from the initial parameters, read back to the host."""
    state = exp.programs.grpo_state.init(exp.initial_params())
    reference = jax.tree.map(jnp.copy, state.params)
    jax.block_until_ready((state, reference))
    judge_before = exp.reward.seconds
    start = time.perf_counter()
    _, out = grpo_stage.grpo_iteration(exp, exp.programs.grpo, state, reference, questions, key)
    row = grpo_stage.grpo_row(out)
    return time.perf_counter() - start, exp.reward.seconds - judge_before, row


def main(argv: list[str]) -> None:
    del argv
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per judge request
    server, base = start_server()
    try:
        config = tiny.get_config()
        with config.unlocked():
            config.judge.backend, config.judge.base_url, config.judge.model = "openai", f"{base}/v1", "tiny_judge"
            config.reward.gates_first = False
            config.rl.rollout_chunks = _CHUNKS.value
        built = loop.build(config, tempfile.mkdtemp(prefix="bench_overlap_"))
        built = dataclasses.replace(built, reward=TimedReward(built.reward))
        paths = {"sequential": dataclasses.replace(built, settings=dataclasses.replace(built.settings,
                                                                                         rollout_chunks=1)),
                 "chunked": built}
        per_step = built.settings.rl.questions_per_step
        for name, exp in paths.items():  # untimed: compiles, the server's buckets
            timed_step(exp, built.train_questions[:per_step], jax.random.key(0))
        runs: dict[str, list[tuple[float, float, dict[str, Any]]]] = {name: [] for name in paths}
        cpu0, server_cpu0, traces0 = time.process_time(), server_cpu_s(server.pid), health(base)["traces"]
        for step in range(_STEPS.value):
            questions = built.train_questions[(step + 1) * per_step:(step + 2) * per_step]
            for name in (list(paths) if step % 2 == 0 else list(paths)[::-1]):
                runs[name].append(timed_step(paths[name], questions, jax.random.key(step + 1)))
        cpu, server_cpu = time.process_time() - cpu0, server_cpu_s(server.pid) - server_cpu0
        traces = health(base)["traces"] - traces0
    finally:
        server.terminate()
        server.wait(timeout=60)

    summary = {}
    for name, steps in runs.items():
        summary[name] = {"s_per_step": round(statistics.median(s for s, _, _ in steps), 3),
                         "steps_s": [round(s, 3) for s, _, _ in steps],
                         "judge_s": round(statistics.median(j for _, j, _ in steps), 3)}
        if name == "chunked":
            hidden = [row["overlap/judge_hidden_s"] for _, _, row in steps]
            judged = [row["overlap/judge_s"] for _, _, row in steps]
            summary[name].update(judge_hidden_s=round(statistics.median(hidden), 3),
                                 judge_hidden_share=round(sum(hidden) / sum(judged), 3))
    sequential, chunked = summary["sequential"]["s_per_step"], summary["chunked"]["s_per_step"]
    print(json.dumps({"chunks": _CHUNKS.value, "steps": _STEPS.value, **summary,
                      "speedup": round(sequential / chunked, 3), "process_cpu_s": round(cpu, 1),
                      "server_cpu_s": round(server_cpu, 1), "server_compiles_while_timed": traces}))


if __name__ == "__main__":
    app.run(main)

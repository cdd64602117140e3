"""One-step off-policy against on-policy with a slow judge (rl.off_policy_steps; docs/training.md, "One-step
off-policy"): GRPO runs of the tiny default whose politeness judge answers through benchmarks/latency_judge.py
(experiments.serve on the shipped tiny judge behind a loopback proxy that answers each request --delay_s after it
arrived), at rl.off_policy_steps 0 and 1, per seed in alternating order, in one process.

  PYTHONPATH=. .venv/bin/python -m benchmarks.bench_off_policy --delay_s=2 --steps=6 --seeds=3

GRPO only, from the untrained tiny model with reward.gates_first off (every row's politeness goes to the judge, as
for a policy past SFT), judge.max_concurrency = the rows of a step (one delay per batch). s/step is the median gap
between consecutive GRPO rows' times (the first row's step compiles; evals run only before the first and after the
last step); off-policy adds rl.recompute_old_logprobs and rl.behaviour_correction_cap=2, which the option requires.
Prints one JSON line: per setting the s/step of each seed and their median, the held-out reward after the last step
per seed, the on/off-policy s/step ratio, and this process's CPU seconds (give `uptime` with it). --smoke shrinks
the run for the test; --upstream serves the judge from an endpoint already running instead of experiments.serve.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ml_collections
from absl import app, flags

from benchmarks.bench_serve import start_server
from benchmarks.latency_judge import LatencyJudge
from configs import tiny
from rubric_jax.train import loop

_DELAY = flags.DEFINE_float("delay_s", 2.0, "Seconds the latency judge waits before answering each request.")
_STEPS = flags.DEFINE_integer("steps", 6, "GRPO steps per run (s/step is taken over steps 2..N).")
_SEEDS = flags.DEFINE_integer("seeds", 1, "Seeds (config.seed 0..N-1) per setting.")
_SMOKE = flags.DEFINE_bool("smoke", False, "A toy run (2 questions of 2 samples, 8 tokens) for the test.")
_UPSTREAM = flags.DEFINE_string("upstream", "", "An OpenAI-compatible judge to delay ('': experiments.serve on the "
                                "tiny judge, started here).")
_MODEL = flags.DEFINE_string("model", "tiny_judge", "The upstream's model name.")

SETTINGS = {0: {}, 1: {"off_policy_steps": 1, "recompute_old_logprobs": True, "behaviour_correction_cap": 2.0}}


def run_config(base_url: str, off_policy_steps: int, seed: int) -> ml_collections.ConfigDict:
    """The tiny default as one benchmark run: GRPO only, the judge behind `base_url`, one delay per batch."""
    config = tiny.get_config()
    with config.unlocked():
        config.stages, config.seed = ("grpo",), seed
        config.judge.backend, config.judge.base_url, config.judge.model = "openai", f"{base_url}/v1", _MODEL.value
        config.reward.gates_first = False
        if _SMOKE.value:
            config.rl.update(questions_per_step=2, group_size=2, micro_batches=1, max_new_tokens=8)
            config.eval.update(max_questions=2, max_new_tokens=8)
        config.rl.steps = _STEPS.value
        config.eval.every_steps = config.checkpoint.every_steps = _STEPS.value
        config.judge.max_concurrency = min(config.rl.questions_per_step * config.rl.group_size, 1024)
        config.rl.update(SETTINGS[off_policy_steps])
    return config


def measured(workdir: Path) -> tuple[float, float]:
    """(median s/step over steps 2..N, the held-out reward after the last step) of a finished run's metrics."""
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    times = [r["time"] for r in rows if r.get("stage") == "grpo"]
    final = [r["eval/reward_mean"] for r in rows if r.get("stage") == "eval"][-1]
    return statistics.median(b - a for a, b in zip(times, times[1:])), final


def main(argv: list[str]) -> None:
    del argv
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per judge request
    server, upstream = (None, _UPSTREAM.value) if _UPSTREAM.value else start_server()
    judge = LatencyJudge(upstream, _DELAY.value)
    results: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
    cpu0 = time.process_time()
    try:
        for seed in range(_SEEDS.value):
            for steps in (0, 1) if seed % 2 == 0 else (1, 0):
                workdir = Path(tempfile.mkdtemp(prefix=f"bench_off_policy_{steps}_{seed}_"))
                loop.run(run_config(judge.base_url, steps, seed), workdir)
                results[steps].append(measured(workdir))
    finally:
        judge.close()
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    summary: dict[str, Any] = {f"off_policy_steps={k}": {
        "s_per_step": round(statistics.median(s for s, _ in v), 3), "seeds_s_per_step": [round(s, 3) for s, _ in v],
        "eval_reward": [round(r, 4) for _, r in v]} for k, v in results.items()}
    ratio = summary["off_policy_steps=0"]["s_per_step"] / summary["off_policy_steps=1"]["s_per_step"]
    print(json.dumps({"delay_s": _DELAY.value, "steps": _STEPS.value, "seeds": _SEEDS.value, **summary,
                      "speedup": round(ratio, 3), "process_cpu_s": round(time.process_time() - cpu0, 1)}))


if __name__ == "__main__":
    app.run(main)

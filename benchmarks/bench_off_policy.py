"""One-step off-policy against on-policy with a slow judge (rl.off_policy_steps; docs/training.md, "One-step
off-policy"): GRPO runs of the tiny default whose politeness judge answers through benchmarks/latency_judge.py
(experiments.serve on the shipped tiny judge behind a loopback proxy that answers each request --delay_s after it
arrived), at rl.off_policy_steps 0 and 1, per seed in alternating order, in one process.

  PYTHONPATH=. .venv/bin/python -m benchmarks.bench_off_policy --delay_s=2 --steps=6 --seeds=3 --sft_dir=runs/tiny_sft

With --sft_dir, GRPO starts from the tiny default's cold-start SFT, run once per seed into SFT_DIR/seed_<s> (or
reused from there) and copied into both settings' runs (benchmarks/sft_start.py): the held-out reward is then that
of a trained policy. Without it, GRPO only, from the untrained tiny model with reward.gates_first off (every row's
politeness goes to the judge, as for a policy past SFT). judge.max_concurrency = the rows of a step (one delay per
batch). s/step is the median gap between consecutive GRPO rows' times (the first row's step compiles; evals run only
before the first and after the last step); off-policy adds rl.recompute_old_logprobs and
rl.behaviour_correction_cap=2, which the option requires. Prints one JSON line: per setting the s/step of each seed
and their median, the held-out reward after the last step per seed, each run's CPU seconds (this process's and the
judge server's, when started here) and the load average (1, 5, 15 min) before and after it, the on/off-policy s/step
ratio, and this process's CPU seconds in all. --smoke shrinks the run for the test; --upstream serves the judge from
an endpoint already running instead of experiments.serve.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ml_collections
from absl import app, flags

from benchmarks import sft_start
from benchmarks.bench_serve import start_server
from benchmarks.latency_judge import LatencyJudge
from configs import tiny
from rubric_jax.train import loop

_DELAY = flags.DEFINE_float("delay_s", 2.0, "Seconds the latency judge waits before answering each request.")
_STEPS = flags.DEFINE_integer("steps", 6, "GRPO steps per run (s/step is taken over steps 2..N).")
_SEEDS = flags.DEFINE_integer("seeds", 1, "Seeds (config.seed 0..N-1) per setting.")
_SMOKE = flags.DEFINE_bool("smoke", False, "A toy run (2 questions of 2 samples, 8 tokens; one SFT epoch) for the test.")
_UPSTREAM = flags.DEFINE_string("upstream", "", "An OpenAI-compatible judge to delay ('': experiments.serve on the "
                                "tiny judge, started here).")
_MODEL = flags.DEFINE_string("model", "tiny_judge", "The upstream's model name.")
_SFT_DIR = flags.DEFINE_string("sft_dir", "", "Start GRPO from the tiny default's SFT of each seed, run once into (or "
                               "reused from) SFT_DIR/seed_<s> ('': GRPO only, from the untrained model).")

SETTINGS = {0: {}, 1: {"off_policy_steps": 1, "recompute_old_logprobs": True, "behaviour_correction_cap": 2.0}}


def run_config(base_url: str, off_policy_steps: int, seed: int) -> ml_collections.ConfigDict:
    """The tiny default as one benchmark run: the judge behind `base_url`, one delay per batch; SFT then GRPO with
    --sft_dir, else GRPO only with every row judged."""
    config = tiny.get_config()
    with config.unlocked():
        config.seed = seed
        if not _SFT_DIR.value:
            config.stages = ("grpo",)
            config.reward.gates_first = False
        config.judge.backend, config.judge.base_url, config.judge.model = "openai", f"{base_url}/v1", _MODEL.value
        if _SMOKE.value:
            config.rl.update(questions_per_step=2, group_size=2, micro_batches=1, max_new_tokens=8)
            config.eval.update(max_questions=2, max_new_tokens=8)
            config.sft.epochs = 1
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used (/proc/<pid>/stat; Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_run(config: ml_collections.ConfigDict, workdir: Path, server_pid: int | None) -> dict[str, Any]:
    """Runs one benchmark run; its s/step, held-out reward, CPU seconds (this process's, the judge server's) and
    the load average before and after it."""
    load, cpu = os.getloadavg(), time.process_time()
    judge_cpu = cpu_seconds(server_pid) if server_pid is not None else None
    loop.run(config, workdir)
    s_per_step, reward = measured(workdir)
    return {"s_per_step": s_per_step, "eval_reward": reward, "cpu_s": round(time.process_time() - cpu, 1),
            "judge_server_cpu_s": None if judge_cpu is None else round(cpu_seconds(server_pid) - judge_cpu, 1),
            "load_before": [round(x, 2) for x in load], "load_after": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str]) -> None:
    del argv
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per judge request
    server, upstream = (None, _UPSTREAM.value) if _UPSTREAM.value else start_server()
    judge = LatencyJudge(upstream, _DELAY.value)
    runs: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    cpu0 = time.process_time()
    try:
        for seed in range(_SEEDS.value):
            sft = sft_start.sft_run(run_config(judge.base_url, 0, seed), Path(_SFT_DIR.value)) if _SFT_DIR.value \
                else None
            for steps in (0, 1) if seed % 2 == 0 else (1, 0):
                workdir = Path(tempfile.mkdtemp(prefix=f"bench_off_policy_{steps}_{seed}_"))
                if sft is not None:
                    sft_start.start_from(sft, workdir)
                runs[steps].append(timed_run(run_config(judge.base_url, steps, seed), workdir,
                                             None if server is None else server.pid))
    finally:
        judge.close()
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    summary: dict[str, Any] = {f"off_policy_steps={k}": {
        "s_per_step": round(statistics.median(r["s_per_step"] for r in v), 3),
        "seeds_s_per_step": [round(r["s_per_step"], 3) for r in v], "eval_reward": [round(r["eval_reward"], 4) for r in v],
        "runs": [{key: r[key] for key in ("cpu_s", "judge_server_cpu_s", "load_before", "load_after")} for r in v]}
        for k, v in runs.items()}
    ratio = summary["off_policy_steps=0"]["s_per_step"] / summary["off_policy_steps=1"]["s_per_step"]
    print(json.dumps({"delay_s": _DELAY.value, "steps": _STEPS.value, "seeds": _SEEDS.value,
                      "sft_dir": _SFT_DIR.value, **summary, "speedup": round(ratio, 3),
                      "process_cpu_s": round(time.process_time() - cpu0, 1)}))


if __name__ == "__main__":
    app.run(main)

"""Multi-host on one machine: two CPU processes (4 devices each) joined by a local coordinator
(`jax.distributed.initialize`, gloo collectives) run a generate in the decode layout and an SFT step in
the training layout, each reading only its own rows, save and restore an orbax checkpoint from both
processes and export the policy; then both run the whole trainer loop in one shared workdir, each process
batching its own block of the questions: 1 SFT step, 2 GRPO steps with a KL reference (rl.beta > 0: the
reference saved once and loaded through the sharded loader, its log-probs computed every rollout), the
LLM judge (the shipped tiny judge batched through the sharded sampler in the decode layout, with
collective retry rounds whose prompt counts differ between the processes), evals at steps 0 and 2 with the
golden set (policy answers and reference answers judged), export at the end. The two-process loop is
stopped by a SIGTERM that reaches one process during GRPO step 1 and restarted on the same workdir
(orbax restore on every process, the data order, the reference, the log continuing). Everything equals
one uninterrupted 8-device process's run of the same worker (tests/multihost_worker.py): the generated
rows, the SFT step's metrics and parameters, the exported policies, and the loop's metrics.jsonl rows
(written by process 0 alone), samples and final exported policy."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "multihost_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(out: Path, processes: int) -> list[dict[str, np.ndarray]]:
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # the worker sets its own device count
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(out), str(p), str(processes), port], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for p in range(processes)]
    for p, proc in enumerate(procs):
        log, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"process {p}:\n{log[-4000:]}"
    return [dict(np.load(out / f"{p}.npz")) for p in range(processes)]


def test_two_processes_equal_one(tmp_path):
    import multihost_worker

    (tmp_path / "one").mkdir()
    multihost_worker.run(tmp_path / "one")  # this process: the same 8 devices, one process
    one = dict(np.load(tmp_path / "one" / "0.npz"))
    two = _run(tmp_path / "two", 2)
    # Generate: each process got back exactly the rows of its own prompts.
    for key in ("gen_tokens", "gen_logprobs", "gen_lengths"):
        assert two[0][key].shape[0] == one[key].shape[0] // 2
        np.testing.assert_allclose(np.concatenate([two[0][key], two[1][key]]), one[key], rtol=1e-6, atol=1e-6,
                                   err_msg=key)
    # SFT step: the same loss and the same updated parameters, on every process.
    for result in two:
        for key, value in one.items():
            if key.startswith(("metric/", "param/")):
                np.testing.assert_allclose(result[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
        assert result["restored_equal"]
    # Export: written once, by process 0, from arrays gathered across both processes; the trainer loop's too.
    # The loop trains with AdamW, whose g/sqrt(v) turns a gradient's last-bit differences (another reduction
    # order across processes) into parameter differences of a few 1e-6; a wrong data split moves them by
    # the learning rate (3e-3 for SFT), so atol 2e-5 there.
    for export, atol in (("export", 1e-6), ("loop/export", 2e-5)):
        exported_one, exported_two = (load_file(tmp_path / run / export / "model.safetensors") for run in ("one", "two"))
        assert exported_one.keys() == exported_two.keys()
        for name, w in exported_one.items():
            np.testing.assert_allclose(exported_two[name], w, rtol=1e-5, atol=atol, err_msg=f"{export} {name}")
    # The loop's log: the same rows (every step's reward mean is over all 4 questions, not process 0's 2).
    assert all(result["stopped_before_export"] for result in two)  # the first start stopped at GRPO step 1
    rows_one, rows_two = (_log_rows(tmp_path / run / "loop" / "metrics.jsonl") for run in ("one", "two"))
    assert [(r["stage"], r["step"]) for r in rows_two] == [(r["stage"], r["step"]) for r in rows_one] == [
        ("sft", 1), ("eval", 0), ("grpo", 1), ("grpo", 2), ("eval", 2)]
    for row_one, row_two in zip(rows_one, rows_two):
        assert row_two.keys() == row_one.keys()
        for key, value in row_one.items():
            if isinstance(value, float):
                np.testing.assert_allclose(row_two[key], value, rtol=1e-5, atol=1e-6, err_msg=f"{row_one['stage']} {key}")
            else:
                assert row_two[key] == value, key
    assert any(r["stage"] == "grpo" and 0 < r["zero_std_frac"] < 1 and r["grad_norm"] > 0 for r in rows_one)
    # What the comparison covers actually ran: the KL term, judged scores and retry rounds, the golden set.
    grpo = [r for r in rows_one if r["stage"] == "grpo"]
    assert grpo[-1]["kl"] > 0
    assert all(r["judge_retried"] > 0 for r in grpo)
    assert any(r["judge_failed_scores"] < r["judge_scores"] for r in grpo)  # some verdicts parse
    evals = [r for r in rows_one if r["stage"] == "eval"]
    assert all(isinstance(r["golden/reference/reward/politeness"], float) and "golden/reward_mean" in r for r in evals)
    samples_one, samples_two = ([json.loads(line) for line in (tmp_path / run / "loop" / "samples.jsonl").open()]
                                for run in ("one", "two"))
    assert [s["response"] for s in samples_two] == [s["response"] for s in samples_one]


def _log_rows(path: Path) -> list[dict]:
    """metrics.jsonl rows without the run_info header and wall-clock times."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "time"} for row in rows if "run_info" not in row]

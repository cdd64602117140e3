"""Multi-host on one machine: two CPU processes (4 devices each) joined by a local coordinator
(`jax.distributed.initialize`, gloo collectives) run a generate in the decode layout and an SFT step in
the training layout, each reading only its own rows, save and restore an orbax checkpoint from both
processes and export the policy; the results equal one 8-device process's (tests/multihost_worker.py).
The trainer loop, not multi-host yet, refuses to start on two processes."""

from __future__ import annotations

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
        assert "2 processes: the trainer loop does not yet give each host its own questions" in str(
            result["loop_refusal"])
    # Export: written once, by process 0, from arrays gathered across both processes.
    exported_one, exported_two = (load_file(tmp_path / run / "export" / "model.safetensors") for run in ("one", "two"))
    assert exported_one.keys() == exported_two.keys()
    for name, w in exported_one.items():
        np.testing.assert_allclose(exported_two[name], w, rtol=1e-5, atol=1e-6, err_msg=name)

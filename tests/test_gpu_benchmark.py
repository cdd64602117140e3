"""benchmarks/gpu.py: its FLOP count by hand, and `--smoke` (toy shapes, CPU) prints the whole table."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from rubric_jax import loader
from xla_flags import FAST_COMPILE

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"


def _gpu_module():
    spec = importlib.util.spec_from_file_location("benchmarks_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_matmul_params_are_every_weight_but_the_embedding_lookup_and_norms():
    gpu = _gpu_module()
    for size in ("toy", "1.5b", "7b"):
        cfg = gpu.model_config(size)
        leaves = {"/".join(str(k.key) for k in path): x
                  for path, x in jax.tree_util.tree_flatten_with_path(loader.abstract_weights(cfg).params)[0]}
        total = sum(int(np.prod(x.shape)) for x in leaves.values())
        norms = sum(int(np.prod(x.shape)) for name, x in leaves.items() if name.endswith("scale"))
        lookup = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
        assert gpu.matmul_params(cfg) == total - norms - lookup, size
    # Qwen2.5-7B: 7.62B parameters in all, of which 0.545B the input embedding (the model card's 6.53B
    # "non-embedding" also leaves out the head).
    assert round(gpu.matmul_params(gpu.model_config("7b")) / 1e9, 2) == 7.07


def test_smoke_prints_the_table():
    """The README command at toy size on one CPU device: every row of the table, a number in each cell
    that has one on CPU (MFU, MBU and the measured peak need a GPU's datasheet and allocator)."""
    env = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = {line.split("|")[1].strip(): line.split("|")[2].strip()
             for line in proc.stdout.splitlines() if line.startswith("| ") and not line.startswith("| metric")}
    assert list(cells) == ["GRPO update tokens/s", "GRPO update MFU", "GRPO compiled memory (GiB)",
                           "GRPO measured peak (GiB)", "GRPO compile (s)", "decode tokens/s (batch 4)", "decode step (ms)", "decode MBU",
                           "judge items/s (batched, 4 items)", "judge batched / per-item", "N (matmul params)"]
    assert {cells[k] for k in ("GRPO update MFU", "decode MBU", "GRPO measured peak (GiB)")} == {"n/a"}
    assert float(cells["GRPO update tokens/s"].replace(",", "")) > 0
    assert float(cells["judge items/s (batched, 4 items)"]) > 0 and cells["judge batched / per-item"].endswith("x")
    assert float(cells["GRPO compiled memory (GiB)"]) >= 0

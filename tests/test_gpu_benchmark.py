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
from tests.test_aot import _NEEDS_GPU_COMPILER, AOT_PYTHON
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


def _table(stdout: str) -> dict[str, dict[str, str]]:
    """The printed table as {column: {metric: cell}}."""
    lines = [line.split("|")[1:-1] for line in stdout.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0]]
    assert header[0] == "metric", header
    return {column: {row[0].strip(): row[i].strip() for row in lines[1:]} for i, column in enumerate(header) if i}


def test_smoke_prints_the_table():
    """The README commands at toy size on one CPU device (`--attention=einsum,fused`: fused is the XLA
    implementation of jax.nn.dot_product_attention on CPU): every row of the table, a number in each cell
    that has one on CPU (MFU, MBU and the measured peak need a GPU's datasheet and allocator), a GRPO
    column per attention, decode and the judge in the first."""
    env = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--attention=einsum,fused"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = _table(proc.stdout)
    assert list(table) == ["toy, einsum", "toy, fused"]
    cells = table["toy, einsum"]
    assert list(cells) == ["GRPO update tokens/s", "GRPO update MFU", "GRPO compiled memory (GiB)",
                           "GRPO measured peak (GiB)", "GRPO compile (s)", "decode tokens/s (batch 4)", "decode step (ms)", "decode MBU",
                           "judge items/s (batched, 4 items)", "judge batched / per-item", "N (matmul params)"]
    assert {cells[k] for k in ("GRPO update MFU", "decode MBU", "GRPO measured peak (GiB)")} == {"n/a"}
    assert float(cells["judge items/s (batched, 4 items)"]) > 0 and cells["judge batched / per-item"].endswith("x")
    for column in table.values():
        assert float(column["GRPO update tokens/s"].replace(",", "")) > 0
        assert float(column["GRPO compiled memory (GiB)"]) >= 0
    assert table["toy, fused"]["decode step (ms)"] == "-"


def test_bad_attention_is_a_usage_error():
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--attention=einsum,flash"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "--attention: unknown ['flash']" in proc.stderr, proc.stderr[-2000:]


@_NEEDS_GPU_COMPILER
def test_aot_target_compiles_cudnn_attention_in_place_of_the_einsums():
    """The README's no-GPU command at toy size: XLA's GPU compiler (on this CPU machine) compiles the GRPO
    update for an H200; "fused" lowers to cuDNN attention calls (2 layers x (prompt + responses) x 2
    micro-batches = 8 forward, as many again recomputed by remat, 8 backward), einsum to none."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(AOT_PYTHON), str(SCRIPT), "--smoke", "--attention=einsum,fused", "--aot_target=h200"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiling for NVIDIA H200 with XLA's GPU compiler" in proc.stdout
    table = _table(proc.stdout)
    assert {c: table[c]["attention"] for c in table} == {"toy, einsum": "einsum", "toy, fused": "cudnn"}
    assert table["toy, einsum"]["GRPO cuDNN attention calls (fwd / bwd)"] == "0 / 0"
    assert table["toy, fused"]["GRPO cuDNN attention calls (fwd / bwd)"] == "16 / 8"


@_NEEDS_GPU_COMPILER
def test_aot_1_5b_update_is_mostly_matmuls():
    """The 1.5B GRPO update (16 x (512 + 512) tokens, 4 micro-batches, cuDNN attention) compiled for an H200
    (issue 33): no float32 dot, and the kernels that are not matmuls read and write at most 410 GB per update
    (`hlo_stats.non_matmul_bytes`; 512 GB at b4346d0, where the weights were cast again in every micro-batch
    and the LM head's backward ran float32 dots; benchmarks/AOT_RESULTS.md has the figures and the way to 300)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(AOT_PYTHON), str(SCRIPT), "--sizes=1.5b", "--aot_target=h200"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    update = _table(proc.stdout)["1.5b"]
    assert update["attention"] == "cudnn" and update["GRPO float32 dots"] == "0", update
    assert float(update["GRPO non-matmul traffic (GB)"]) <= 410, update
    assert int(update["GRPO kernels executed"]) <= 17_000, update

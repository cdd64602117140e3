"""benchmarks/gpu.py: its FLOP count by hand, its flags, its budget, and `--smoke` (toy shapes, CPU) runs every part."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from rubric_jax import config_boundary, loader
from tests.test_aot import _NEEDS_GPU_COMPILER, AOT_PYTHON
from xla_flags import FAST_COMPILE

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"


_LOADED = []  # every module object _gpu_module made, kept alive for the process (below)


def _gpu_module():
    """A fresh benchmarks/gpu.py module. absl lets a module of the same name define its flags again only when the
    module object differs (by id): a freed earlier module's id can be reused by the next one, which then raised
    DuplicateFlagError now and then, so none is ever freed."""
    spec = importlib.util.spec_from_file_location("benchmarks_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    _LOADED.append(module)
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
    return {column: {row[0].strip(): row[i].strip() for row in lines[1:] if row[i].strip() != "-"}
            for i, column in enumerate(header) if i}


def _cells(out: Path) -> dict[str, dict[str, str]]:
    """OUT/gpu_cells.jsonl as {column: {metric: value}} (each line one cell, in the order measured)."""
    cells: dict[str, dict[str, str]] = {}
    for line in (out / "gpu_cells.jsonl").read_text().splitlines():
        row = json.loads(line)
        cells.setdefault(row["column"], {})[row["metric"]] = row["value"]
    return cells


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


def test_smoke_prints_the_table(tmp_path):
    """The README commands at toy size on one CPU device (`--attention=einsum,fused`: fused is the XLA
    implementation of jax.nn.dot_product_attention on CPU): every cell in the table is also a line of --out_dir's
    file, written as it was measured; a number in each cell that has one on CPU (MFU, MBU and the measured peak
    need a GPU's datasheet and allocator), a GRPO column per attention, decode, the anchor and the judge in the
    first. The judge compiles two generate programs (the batch, and one batch-1 program for its per-item calls;
    three on b4346d0 at 1.5B, where each per-item dimension had its own prompt bucket)."""
    proc = _run("--smoke", "--attention=einsum,fused", "--parts=grpo,decode,anchor,judge", f"--out_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = _table(proc.stdout)
    assert table == _cells(tmp_path)
    assert list(table) == ["device", "toy, einsum", "toy, fused"]
    cells, fused = table["toy, einsum"], table["toy, fused"]
    assert list(fused) == ["GRPO compile (s)", "GRPO compiled memory (GiB)", "GRPO update (s)", "GRPO update tokens/s",
                           "GRPO update MFU", "GRPO measured peak (GiB)"]
    assert {cells[k] for k in ("GRPO update MFU", "decode MBU", "GRPO measured peak (GiB)")} == {"n/a"}
    for column in (cells, fused):
        assert float(column["GRPO update tokens/s"].replace(",", "")) > 0
        assert float(column["GRPO compiled memory (GiB)"]) >= 0
    assert "decode step (ms)" in cells and "decode step (ms)" not in fused
    assert cells["judge compiled programs"] == "2"
    assert float(cells["judge items/s (batched, 4 items)"]) > 0 and cells["judge batched / per-item"].endswith("x")
    if importlib.util.find_spec("torch") is None:
        assert cells["torch anchor"].startswith("skipped: torch is not importable")
    else:
        assert cells["torch update / ours"].endswith("x") and cells["HF generate / ours (decode step)"].endswith("x")
    assert "wall" in proc.stdout and not [k for k in cells if k.endswith(("failed", "skipped"))]


def test_smoke_iteration_and_the_run_command(tmp_path):
    """`--parts=iteration,run` at toy size: one GRPO iteration end to end (rollout, judge, batch, reference
    log-probs, update) reports every phase of its warm run with shares summing to the whole and its tokens/s, and
    the command users run, experiments.run with configs/gpu_smoke.py (here its tiny size), runs its two GRPO steps."""
    proc = _run("--smoke", "--parts=iteration,run", f"--out_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = _cells(tmp_path)["toy"]
    phases = [f"iteration warm: {name} (s)" for name in
              ("rollout weights", "rollout", "judge", "advantages + batch", "reference log-probs", "update")]
    shares = [float(cells[p].split("(")[1].rstrip("%)")) for p in phases]
    assert abs(sum(shares) - 100) <= len(phases)  # each rounded to a percent
    assert float(cells["iteration tokens/s (2 x 2 x (64 + 8))"].replace(",", "")) > 0
    assert cells["run (configs/gpu_smoke.py:size=tiny) exit status"] == "0" and cells["run GRPO steps logged"] == "2"


def _forked(command_server, *args: str) -> subprocess.CompletedProcess:
    """`benchmarks/gpu.py ARGS` (as `python -m benchmarks.gpu`) on the CPU, forked from one process that imported it
    (tests/command_server.py): for the runs that stop within the command server's 300 s, before or instead of
    measuring, which paid 3-4 CPU-seconds of imports each as a fresh interpreter."""
    return command_server("benchmarks.gpu", JAX_PLATFORMS="cpu").run(*args)


def test_budget_skips_what_cannot_fit_and_says_why(tmp_path, command_server):
    """With a budget no part fits in, each part's cell says what it would need and what was left; the call still
    exits 0 and --out_dir holds those cells."""
    proc = _forked(command_server, "--smoke", "--budget_s=0.5", "--parts=grpo,decode,judge", f"--out_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = _cells(tmp_path)["toy"]
    skipped = {k: v for k, v in cells.items() if k.endswith(" skipped")}
    assert list(skipped) == ["grpo skipped", "decode skipped", "judge skipped"], cells
    for reason in skipped.values():
        assert re.fullmatch(r"needs ~\d+ s \(\d+\.\d update compiles of ~\d+ s \+ ~\d+ s of work\), \d+ s of "
                            r"the budget left", reason), reason


def test_the_budget_counts_the_unrolled_update_compile():
    """The parts' model has unrolled layers, whose update compiled 4.4x as long as a scanned one's: the estimate says
    so, or the first part's overrun would scale every later estimate up to the 4x cap and skip parts that fit."""
    gpu = _gpu_module()
    cfg, s, roofs = gpu.model_config("1.5b"), gpu.Settings(), (1e15, 4e12)
    assert not cfg.scan_layers
    scanned = gpu.dataclasses.replace(cfg, scan_layers=True)
    for part in ("grpo", "iteration", "run"):
        (unrolled_compiles, work), (scanned_compiles, scanned_work) = (gpu.estimate(part, c, s, roofs)
                                                                       for c in (cfg, scanned))
        assert work == scanned_work and unrolled_compiles > scanned_compiles, part
    assert gpu.estimate("grpo", cfg, s, roofs)[0] == gpu.UNROLLED_COMPILES


def test_micro_batches_split_the_same_workload():
    """--micro changes only the micro-batching: the GRPO batch (prompts, rows) and its FLOPs are the same at every
    micro-batch count (on b4346d0 the group size was rows / micro: 1 micro-batch meant one prompt of 16 rows)."""
    gpu = _gpu_module()
    cfg, s = gpu.model_config("1.5b"), gpu.Settings()
    batches = [gpu.grpo_batch(cfg, gpu.dataclasses.replace(s, micro=m)) for m in (1, 2, 4)]
    for batch in batches[1:]:
        assert {k: v.shape for k, v in batch.items()} == {k: v.shape for k, v in batches[0].items()}
        assert all(np.array_equal(batch[k], batches[0][k]) for k in batch)
    assert batches[0]["prompt_tokens"].shape == (4, 512) and batches[0]["response_tokens"].shape == (16, 512)
    assert len({gpu.update_flops(cfg, gpu.dataclasses.replace(s, micro=m)) for m in (1, 2, 4)}) == 1


def test_bad_flags_are_usage_errors(command_server):
    for flag, message in (("--attention=einsum,flash", "--attention: unknown ['flash']"),
                          ("--micro=3", "--micro=3: each must be a positive integer dividing the 2 GRPO groups"),
                          ("--parts=grpo,train", "--parts=grpo,train: must be some of")):
        proc = _forked(command_server, "--smoke", flag)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr[-2000:]


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


def test_the_run_parts_config_is_the_benchmarks_1p5b_model():
    """configs/gpu_smoke.py (the run part's config, default size) validates and random-inits the model the other
    parts measure at 1.5B: the shipped config.json has Qwen2.5-1.5B's shapes, float32 master weights, remat, scan."""
    from configs import gpu_smoke
    from rubric_jax.train import settings

    gpu = _gpu_module()
    config = gpu_smoke.get_config()
    checked = settings.validate(config_boundary.experiment(config))
    ours, measured = settings.model_config(checked.config.model), gpu.model_config("1.5b")
    assert ours.replace(compute_dtype=measured.compute_dtype, attention=measured.attention) == measured
    assert (config.rl.questions_per_step, config.rl.group_size, config.rl.max_new_tokens, config.rl.steps) == (8, 8, 512, 2)


def test_parts_run_in_order_of_value():
    """The update, then decode at every size (7B decode is in the table a short call must return), the anchor,
    the iteration, the judge and the run at 1.5B; the 7B update (it does not fit one device) and the rest of 7B last.
    GRPO variants keep their columns, the other parts go to the size's first."""
    gpu = _gpu_module()
    variants = [("einsum", 4), ("einsum", 1)]
    todo = gpu.plan(["1.5b", "7b"], list(gpu.PART_ORDER), variants, ["einsum"], [4, 1], "1.5b")
    assert [(p.name, p.column) for p in todo] == [
        ("grpo", "1.5b, 4 micro"), ("grpo", "1.5b, 1 micro"), ("decode", "1.5b, 4 micro"), ("decode", "7b, 4 micro"),
        ("anchor", "1.5b, 4 micro"), ("iteration", "1.5b, 4 micro"), ("judge", "1.5b, 4 micro"), ("run", "1.5b, 4 micro"),
        ("grpo", "7b, 4 micro"), ("grpo", "7b, 1 micro"), ("anchor", "7b, 4 micro"), ("judge", "7b, 4 micro")]
    assert [p.first for p in todo if p.name == "grpo"] == [True, False, True, False]


@_NEEDS_GPU_COMPILER
def test_aot_1_5b_update_is_mostly_matmuls():
    """The 1.5B GRPO update (16 x (512 + 512) tokens, 4 micro-batches, cuDNN attention) compiled for an H200
    (issue 33): no float32 dot, and the kernels that are not matmuls read and write at most 300 GB per update
    (`hlo_stats.non_matmul_bytes`; 512 GB at b4346d0, where the weights were cast again in every micro-batch
    and the LM head's backward ran float32 dots; 407.5 at 5ba1e88, where each micro-batch's layer gradients were
    stacked, then added, and the log-softmax's backward made three passes over the float32 logits; 352.1 at
    64fbcbf, where every micro-batch's forward and backward copied each layer's slice of the stacked bf16 weights
    and cast the LM head again; benchmarks/AOT_RESULTS.md has the figures)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(AOT_PYTHON), str(SCRIPT), "--sizes=1.5b", "--aot_target=h200"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    update = _table(proc.stdout)["1.5b"]
    assert update["attention"] == "cudnn" and update["GRPO float32 dots"] == "0", update
    assert float(update["GRPO non-matmul traffic (GB)"]) <= 300, update
    assert int(update["GRPO kernels executed"]) <= 13_000, update


# What the GPU image brings (benchmarks/RESULTS.md: jax, flax with orbax and etils, torch, transformers with its
# tokenizers and safetensors; jax brings numpy and scipy); every other distribution rubric_jax or a command imports
# at module level must travel in benchmarks/gpu_carry.txt. tensorflow-datasets is imported at module level only by
# modules that the GPU paths never import (data.py imports prepare.tfds_dataset inside the function that reads a
# tfds: set).
IN_THE_GPU_IMAGE = {"jax", "flax", "optax", "orbax-checkpoint", "etils", "transformers", "tokenizers", "safetensors",
                    "numpy", "scipy", "torch"}
NOT_ON_THE_GPU_PATHS = {"tensorflow-datasets"}


def _pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return {name.lower().replace("_", "-"): version
            for name, version in (line.split("==") for line in lines if "==" in line)}


def test_the_gpu_carry_list_holds_every_module_level_import_the_image_lacks():
    import ast
    import importlib.metadata

    distributions = importlib.metadata.packages_distributions()
    imported = set()
    for path in [*(ROOT / "rubric_jax").rglob("*.py"), *(ROOT / "experiments").glob("*.py")]:
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                root = name.split(".")[0]
                if root not in sys.stdlib_module_names and root not in ("rubric_jax", "experiments", "configs"):
                    imported |= {d.lower().replace("_", "-") for d in distributions[root]}
    carried = _pins(ROOT / "benchmarks" / "gpu_carry.txt")
    assert imported - IN_THE_GPU_IMAGE - NOT_ON_THE_GPU_PATHS - set(carried) == set()
    required = _pins(ROOT / "requirements.txt")
    assert {name: v for name, v in carried.items() if required.get(name, v) != v} == {}


def test_decode_measures_the_platform_kernel_then_xla_and_falls_back_when_the_kernel_fails(monkeypatch):
    """bench_decode with the decode kernel on (Pallas in interpret mode stands in for a GPU's): both steps and their
    ratio; a kernel that fails to compile is reported and XLA's attention measured in its place."""
    from rubric_jax import sampling
    from rubric_jax.models import attention

    gpu = _gpu_module()
    cfg = gpu.model_config("toy")
    monkeypatch.setattr(sampling, "DECODE_ATTENTION", {})
    gpu.flags.FLAGS(["gpu.py"])  # bench_decode reads --trace_dir
    kernel = "interpret"
    try:
        for failing in (False, True):
            if failing:  # as a Triton kernel the image's jax cannot compile would (traced anew: no cached program)
                monkeypatch.setattr(attention, "attend_in_kernel", _refuse)
                jax.clear_caches()
            sampling.DECODE_ATTENTION.update(cpu=kernel)
            cells = {}
            step_s = gpu.bench_decode(cfg, gpu.SMOKE, None, cells.__setitem__)
            assert np.isfinite(step_s) and sampling.DECODE_ATTENTION == {"cpu": kernel}  # restored after XLA's turn
            if failing:
                assert cells[f"decode {kernel} kernel"].startswith("failed: ") and "decode step (ms)" in cells
            else:
                assert {"decode step (ms)", "decode step, XLA attention (ms)",
                        f"decode step, XLA attention / {kernel}"} <= set(cells)
    finally:
        gpu.flags.FLAGS.unparse_flags()


def _refuse(*args, **kwargs):
    raise RuntimeError("ptxas fatal: the kernel does not compile here")

"""The tiny default with LoRA in its GRPO stage (after the full cold-start SFT; docs/training.md "LoRA") end to end on
the shortened runs of test_loop.py: it runs to the end through the adapters, the reference is the frozen base (no
reference checkpoint), the GRPO checkpoints hold the adapters (their size is the adapters', not the model's), the
export writes the merged policy and a PEFT adapter directory, and a SIGKILLed run resumes to what an uninterrupted one
writes."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from rubric_jax import config_boundary, loader, sharding
from rubric_jax.models import lora
from rubric_jax.train import checkpointing, programs as run_programs, runs, settings as run_settings
from tests.models.test_lora import ALL, CFG, logits_of, numpy_merge, with_random_b
from tests.random_model import random_weights
from test_loop import _flags, _rows, _wait_for_row, sft  # noqa: F401 (sft: the shortened SFT set, a fixture)
from tiny_config import absolute_tiny_config

# The documented variant (docs/training.md): config.lora.stages defaults to ("grpo",), after a full SFT, at 10x the
# full fine-tuning lr (the rate its table shows learning).
LORA = ["--config.lora.rank=8", "--config.rl.lr=2e-3"]


def _tree_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, sft, command_server) -> tuple[Path, str]:  # noqa: F811
    """An uninterrupted LoRA run of the shortened tiny default and its output."""
    workdir = tmp_path_factory.mktemp("lora")
    done = command_server("experiments.run").run("--config=configs/tiny.py", *_flags(workdir, sft), *LORA)
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir, done.stdout + done.stderr


def test_the_tiny_default_with_lora_grpo_runs_to_the_end_on_adapters(lora_run):
    workdir, out = lora_run
    assert "grpo: LoRA trains 38,912 parameters (5.60% of 695,424); 656,512 frozen" in out
    assert "sft: LoRA" not in out  # the cold-start SFT trains every weight
    assert (workdir / "done.json").is_file()
    assert not (workdir / "checkpoints" / "reference").exists()  # the reference is the frozen base
    grpo = [r for r in _rows(workdir) if r.get("stage") == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2, 3, 4, 5] and all(math.isfinite(r["loss"]) for r in grpo)
    assert grpo[0]["kl"] < 1e-6 < grpo[-1]["kl"]  # B = 0 at step 0: the policy starts as its base, then moves

    record = runs.run_record(workdir)
    assert record.stage_model("grpo").lora == lora.LoraConfig(rank=8) and record.stage_model("sft").lora is None
    steps = sorted(p for p in (workdir / "checkpoints" / "grpo").iterdir() if p.name.isdigit())
    model_bytes = 695_424 * 4
    for step in steps:  # adapters and their two Adam moments (3 x 38,912 float32), not the 695,424 model weights
        assert 3 * 38_912 * 4 <= _tree_bytes(step) < model_bytes / 2, step
    sft_step = next(p for p in (workdir / "checkpoints" / "sft").iterdir() if p.name.isdigit())
    assert _tree_bytes(sft_step) > 2 * model_bytes  # the full SFT's: weights and moments (compressed)
    with checkpointing.Checkpointer(workdir / "checkpoints" / "grpo", max_to_keep=1) as ckpt:
        meta = ckpt.read_meta(ckpt.latest_step())
    assert len(meta["base_identity"]) == 64


def test_the_lora_export_is_the_merged_policy_and_a_peft_adapter_for_its_base(lora_run, tmp_path):
    """export.which=best of a LoRA run: the merged HF directory equals the best checkpoint's adapters merged into
    the SFT result (what `experiments.export` restores offline), and the PEFT directory holds those adapters for
    the SFT result, written beside it (no HF directory holds it)."""
    workdir, _ = lora_run
    export = workdir / "export"
    record = runs.run_record(workdir)
    weights = runs.restore_run_params(workdir, record, runs.select_checkpoint(workdir, record, "best"),
                                      sharding.single_device_layout())
    merged = loader.to_layout(weights, sharding.single_device_layout())
    written = load_file(str(export / "model.safetensors"))
    np.testing.assert_array_equal(written["model.layers.0.mlp.down_proj.weight"],
                                  np.asarray(merged.params["layers"]["mlp"]["down_proj"]["kernel"][0]).T)
    adapter = json.loads((export / runs.PEFT_DIR / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["base_model_name_or_path"] == str(export / runs.PEFT_BASE_DIR)
    assert (export / runs.PEFT_BASE_DIR / "model.safetensors").is_file()
    offline = tmp_path / "offline"  # experiments.export: the same directories, the base rebuilt from the SFT checkpoint
    runs.export_run(workdir, "best", offline)
    for name in (f"{runs.PEFT_DIR}/adapter_model.safetensors", f"{runs.PEFT_BASE_DIR}/model.safetensors"):
        assert (offline / name).read_bytes() == (export / name).read_bytes(), name
    again = load_file(str(offline / "model.safetensors"))  # merged on this process's devices: float rounding apart
    assert again.keys() == written.keys()
    for name, tensor in written.items():
        np.testing.assert_allclose(again[name], tensor, rtol=1e-6, atol=1e-7, err_msg=name)


def test_lora_kill_9_then_resume_matches_uninterrupted(lora_run, sft, tmp_path, command_server):  # noqa: F811
    """A LoRA run SIGKILLed mid-GRPO and run again writes what the uninterrupted one wrote: its restored adapters
    meet the same frozen base (the SFT result, checked by its identity)."""
    run = command_server("experiments.run")
    killed = run.start("--config=configs/tiny.py", *_flags(tmp_path, sft), *LORA)
    _wait_for_row(tmp_path, "grpo", 3, killed.running, lambda: killed.wait().stderr)
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait().returncode == -signal.SIGKILL
    resumed = run.run("--config=configs/tiny.py", *_flags(tmp_path, sft), *LORA)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    assert _rows(tmp_path) == _rows(lora_run[0])
    assert _rows(tmp_path, "samples.jsonl") == _rows(lora_run[0], "samples.jsonl")


@pytest.mark.parametrize("changes, error", [
    ({"rank": 8, "stages": ("sft",)}, "config.lora.stages=('sft',): none of them runs"),
    ({"dropout": 0.1}, "config.lora.dropout=0.1: expected a number in [0, 0]"),
    ({"targets": ("q_proj", "mlp")}, "config.lora.targets=('q_proj', 'mlp'): expected items of"),
    ({"rank": -1}, "config.lora.rank=-1"),
])
def test_lora_keys_are_checked_in_their_block(changes, error):
    config = absolute_tiny_config()
    with config.unlocked():
        config.stages = ("grpo",)
        config.lora.update(changes)
    with pytest.raises(ValueError) as e:
        config_boundary.experiment(config)
    assert error in str(e.value)


def test_the_lora_config_reaches_each_stage_it_names():
    config = absolute_tiny_config()
    config.lora.rank, config.lora.stages = 4, ("sft", "grpo")
    settings = run_settings.validate(config_boundary.experiment(config))
    assert settings.sft.lora == settings.rl.lora == settings.lora == lora.LoraConfig(rank=4)
    config.lora.rank = 0  # the default: every stage trains every weight
    settings = run_settings.validate(config_boundary.experiment(config))
    assert settings.sft.lora is None and settings.rl.lora is None and settings.lora is None


def test_a_stage_after_a_lora_stage_starts_from_its_merged_result():
    """lora.stages=("sft", "grpo"): GRPO's fresh adapters sit on the SFT result merged into a plain model (base +
    B·A·alpha/r, the numpy reference), so GRPO starts as the policy SFT ended with; a full stage after a LoRA one
    gets that merged model alone."""
    mesh = run_settings.MeshSpec(sharding.MeshConfig(data=1, fsdp=-1, tensor=1), 1, "compute")
    lay = run_programs.layouts(mesh, CFG, jax.devices()[:1], ALL)
    sft_result = with_random_b(loader.add_adapters(random_weights(CFG, std=0.3), ALL, lay.training, jax.random.key(5)))
    expected = logits_of(loader.as_weights(CFG, numpy_merge(sft_result.params, ALL.scale)))
    grpo_start = lay.stage_params(sft_result.params, True, jax.random.key(6))
    assert lora.has_adapters(grpo_start)
    fresh_b = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(grpo_start)[0] if path[-1].key == "lora_b"]
    assert fresh_b and not any(np.any(np.asarray(b)) for b in fresh_b)  # fresh adapters: B = 0
    np.testing.assert_allclose(logits_of(lay.policy(grpo_start)), expected, rtol=1e-5, atol=1e-5)
    full_start = lay.stage_params(sft_result.params, False, jax.random.key(6))
    assert not lora.has_adapters(full_start)
    np.testing.assert_allclose(logits_of(lay.policy(full_start)), expected, rtol=1e-5, atol=1e-5)

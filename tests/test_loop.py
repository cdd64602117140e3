"""The trainer loop end to end on a shrunken tiny default: workdir contents, resume == uninterrupted,
SIGTERM saves and exits cleanly, SIGKILL at any point loses nothing. Runs are subprocesses of
`./launch.sh` (so the README's run command is exercised too) on one CPU device."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rubric_jax.train.loop import NanStreak, TrainingError, length_buckets

ROOT = Path(__file__).resolve().parents[1]
SHORT = [
    "--config.sft.epochs=1", "--config.sft.batch_size=32", "--config.rl.steps=5",
    "--config.rl.questions_per_step=4", "--config.rl.group_size=4", "--config.rl.max_new_tokens=32",
    "--config.sft.max_response_len=128", "--config.eval.max_questions=8", "--config.eval.every_steps=2",
    "--config.checkpoint.every_steps=2", "--config.log.samples_per_step=2",
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = ""  # one CPU device: the same program in every run of this file
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _start(workdir: Path) -> subprocess.Popen:
    return subprocess.Popen(["./launch.sh", f"--workdir={workdir}", *SHORT], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    return out


def _rows(workdir: Path, name: str = "metrics.jsonl") -> list[dict]:
    """Log rows without wall-clock fields and run_info headers (those differ between runs)."""
    rows = [json.loads(line) for line in (workdir / name).read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "time"} for row in rows if "run_info" not in row]


def _wait_for_row(workdir: Path, stage: str, step: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 600
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        path = workdir / "metrics.jsonl"
        if path.exists() and any(r.get("stage") == stage and r["step"] >= step for r in _rows(workdir)):
            return
        time.sleep(0.2)
    raise TimeoutError(f"no {stage} row for step {step}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    _finish(_start(workdir))
    return workdir


def test_workdir_holds_everything_a_researcher_needs(uninterrupted):
    names = {p.name for p in uninterrupted.iterdir()}
    assert {"config.json", "metrics.jsonl", "samples.jsonl", "rubric.yaml", "rubric.json", "tb", "plots",
            "checkpoints"} <= names
    config = json.loads((uninterrupted / "config.json").read_text())
    assert config["rl"]["steps"] == 5 and config["rl"]["group_size"] == 4
    rows = _rows(uninterrupted)
    grpo = [r for r in rows if r["stage"] == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2, 3, 4, 5]
    for key in ("reward/mean", "kl", "clip_frac", "zero_std_frac", "response_len/mean", "lr", "grad_norm",
                "reward/format", "reward/length"):
        assert key in grpo[0], key
    evals = [r for r in rows if r["stage"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 4, 5]  # the SFT baseline, every 2 steps, the end
    assert all("eval/reward_mean" in r for r in evals)
    rubric = json.loads((uninterrupted / "rubric.json").read_text())
    assert len(rubric["rubric_set_hash"]) == 64
    assert list((uninterrupted / "plots").glob("*.png"))
    samples = _rows(uninterrupted, "samples.jsonl")
    assert {"question", "response", "scores", "reward"} <= set(samples[0])


def test_sigterm_then_sigkill_then_resume_matches_uninterrupted(uninterrupted, tmp_path):
    proc = _start(tmp_path)
    _wait_for_row(tmp_path, "grpo", 1, proc)
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc)  # a clean exit after saving
    assert "SIGTERM" in out
    assert any((tmp_path / "checkpoints" / "grpo").iterdir())

    proc = _start(tmp_path)
    _wait_for_row(tmp_path, "grpo", 3, proc)
    proc.kill()  # SIGKILL: no chance to save; rows after the last checkpoint must be dropped on resume
    proc.wait()

    _finish(_start(tmp_path))
    assert _rows(tmp_path) == _rows(uninterrupted)
    assert _rows(tmp_path, "samples.jsonl") == _rows(uninterrupted, "samples.jsonl")


def test_nan_streak_stops_after_the_limit():
    streak = NanStreak(limit=3)
    for skipped in (1, 1, 0, 1, 1):
        streak.record(skipped, step=0, last_checkpoint="ckpt@0")
    with pytest.raises(TrainingError, match=r"3 GRPO updates in a row.*ckpt@0"):
        streak.record(1, step=6, last_checkpoint="ckpt@0")


def test_length_buckets():
    assert length_buckets(96, 1) == (128,)
    assert length_buckets(128, 3) == (32, 64, 128)
    assert length_buckets(20, 3) == (8, 16, 32)
    with pytest.raises(ValueError, match="length_buckets"):
        length_buckets(64, 0)


def test_pretrained_checkpoint_starts_training_with_the_config_numerics(tmp_path):
    """A local HF directory is the starting policy, with the experiment's dtype/remat overrides applied."""
    import jax
    import numpy as np
    from flax import nnx

    from configs import tiny
    from rubric_jax.models.checkpoint import export_hf_checkpoint
    from rubric_jax.models.config import ModelConfig
    from rubric_jax.models.transformer import Transformer
    from rubric_jax.train import loop

    config = tiny.get_config()
    cfg = ModelConfig.from_hf_dict(json.loads((ROOT / config.model.config_json).read_text()))
    params = nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(7))))
    export_hf_checkpoint(cfg, params, tmp_path / "hf", source_dir=ROOT / config.model.tokenizer)
    with config.unlocked():
        config.model.checkpoint, config.model.config_json = str(tmp_path / "hf"), ""
        config.model.compute_dtype, config.model.remat = "bfloat16", True
        for key in ("train", "eval", "sft", "rubric"):
            config.data[key] = str(ROOT / config.data[key])
    state = loop.initial_state(loop.build(config, tmp_path / "run"))
    model_cfg = nnx.merge(state.graphdef, state.params).cfg
    assert (model_cfg.compute_dtype, model_cfg.remat) == ("bfloat16", True)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), params)

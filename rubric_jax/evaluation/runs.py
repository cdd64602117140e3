"""A training run's checkpoints as evaluation policies: which ones are kept, which is latest or best (by
the held-out reward the trainer logged at its step), and its parameters restored (by the loader) into a layout."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import ml_collections

from rubric_jax import loader, metrics, sharding
from rubric_jax.evaluation.results import EvalInputError
from rubric_jax.train import checkpointing, loop

BEST_BY = "eval/reward_mean"  # the held-out reward the trainer logs at each eval (train/loop.py)


@dataclasses.dataclass(frozen=True)
class RunCheckpoint:
    """One kept checkpoint of a training run and the held-out reward logged at its step (None: no eval)."""

    stage: str
    step: int  # the checkpoint's optimizer step (its directory name)
    eval_reward: float | None


def run_config(workdir: Path) -> ml_collections.ConfigDict:
    """The resolved config a training run wrote (workdir/config.json)."""
    path = workdir / "config.json"
    if not path.is_file():
        raise EvalInputError(f"{path}: not a training run directory (no config.json)")
    try:
        return ml_collections.ConfigDict(json.loads(path.read_text(encoding="utf-8")))
    except json.JSONDecodeError as e:
        raise EvalInputError(f"{path}: not valid JSON ({e.msg})") from None


def run_checkpoints(workdir: Path, config: ml_collections.ConfigDict) -> list[RunCheckpoint]:
    """Every kept checkpoint of the run's stages (sft, grpo), with the eval reward logged at its step."""
    metrics_path = workdir / metrics.METRICS_FILE
    rows = metrics.read_jsonl_metrics(metrics_path) if metrics_path.is_file() else []
    evals = {row["step"]: row[BEST_BY] for row in rows if row.get("stage") == "eval" and BEST_BY in row}
    found = []
    for stage in loop.STAGES:
        directory = workdir / "checkpoints" / stage
        if not directory.is_dir():
            continue
        with checkpointing.Checkpointer(directory, max_to_keep=config.checkpoint.keep, async_save=False) as ckpt:
            steps = ckpt.all_steps()
        # GRPO checkpoints are numbered in optimizer updates; its log rows (and evals) in rollout batches.
        per_row = config.rl.updates_per_batch
        found += [RunCheckpoint(stage, s, evals.get(s // per_row) if stage == "grpo" else None) for s in steps]
    return found


def select_checkpoint(workdir: Path, config: ml_collections.ConfigDict, which: str) -> RunCheckpoint:
    """'latest': the newest GRPO checkpoint (else the newest SFT one); 'best': the kept GRPO checkpoint with
    the highest logged eval reward (ties: the later one)."""
    found = run_checkpoints(workdir, config)
    if not found:
        raise EvalInputError(f"{workdir}/checkpoints: the run has no complete checkpoint")
    if which == "latest":
        grpo = [c for c in found if c.stage == "grpo"]
        return max(grpo or found, key=lambda c: c.step)
    rated = [c for c in found if c.eval_reward is not None]
    if not rated:
        raise EvalInputError(f"{workdir}: no kept checkpoint has a logged {BEST_BY} (kept: "
                             f"{[f'{c.stage}/{c.step}' for c in found]}); use --which=latest")
    return max(rated, key=lambda c: (c.eval_reward, c.step))


def restore_run_params(workdir: Path, config: ml_collections.ConfigDict, chosen: RunCheckpoint,
                       layout: sharding.Layout) -> loader.Weights:
    """A run checkpoint's params (no optimizer state) as Weights, restored straight into `layout`."""
    directory = workdir / "checkpoints" / chosen.stage
    try:
        cfg = loop.model_config(config)
        with checkpointing.Checkpointer(directory, max_to_keep=config.checkpoint.keep, async_save=False) as ckpt:
            return ckpt.restore_params(cfg, layout, chosen.step)
    except (OSError, ValueError, checkpointing.CheckpointError) as e:
        raise EvalInputError(f"--workdir={workdir}: cannot restore {chosen.stage} step {chosen.step}: {e}") from None

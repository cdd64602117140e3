"""The end of a run: the best-evaluated GRPO checkpoint named (BEST_FILE) and the HF export (config.export).

Both choose checkpoints as `experiments.export` does (train/runs.py), so the checkpoint a run reports and
exports is the one the command would pick."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rubric_jax import distributed, files
from rubric_jax.models import lora
from rubric_jax.train import runs
from rubric_jax.train.experiment import Experiment

EXPORT_DIR = "export"  # <workdir>/export: the final policy as a HF directory (config.export.at_end)
BEST_FILE = "best_checkpoint.json"  # the best-evaluated GRPO checkpoint, written when GRPO finishes


def report_best(exp: Experiment) -> None:
    """Names the best-evaluated GRPO checkpoint, as QuRL reports it: one line next to the final and the
    SFT-baseline eval reward, and BEST_FILE (JSON) in the workdir (process 0; every process must call it:
    opening the checkpoints is collective)."""
    try:
        best = runs.select_checkpoint(exp.workdir, exp.run_record(), "best")
    except runs.RunError as e:  # no kept checkpoint has an eval (checkpoint.keep_best off, evals rotated out)
        if distributed.is_writer():
            print(f"no best checkpoint to report: {e}")
        return
    if not distributed.is_writer():
        return
    evals = {r["step"]: r[runs.BEST_BY] for r in exp.log.rows() if r.get("stage") == "eval" and runs.BEST_BY in r}
    final_step = max(evals)
    report = {"stage": best.stage, "step": best.step // exp.settings.config.rl.updates_per_batch,
              "checkpoint": str(Path("checkpoints") / best.stage / str(best.step)), runs.BEST_BY: best.eval_reward,
              "final_step": final_step, "final_eval_reward": evals[final_step], "baseline_eval_reward": evals.get(0)}
    files.write_atomic(exp.workdir / BEST_FILE, json.dumps(report, indent=2))
    baseline = "" if evals.get(0) is None else f", SFT baseline {evals[0]:.4f}"
    which = ("best eval reward" if exp.settings.config.checkpoint.keep_best
             else "best eval reward of the kept checkpoints")
    print(f"{which} {best.eval_reward:.4f} at step {report['step']} ({report['checkpoint']}); "
          f"final {evals[final_step]:.4f} at step {final_step}{baseline}")


def export_at_end(exp: Experiment, final_params: dict[str, Any]) -> None:
    """config.export.at_end: the final policy (`final_params`: the model's, a LoRA policy's adapters and base), or
    (export.which='best') the best-evaluated checkpoint's params restored into the training layout, as a HF directory
    in <workdir>/export (a LoRA policy merged, with its PEFT adapter directory: `runs.export_weights`)."""
    record = exp.run_record()
    weights = exp.layouts.policy(final_params)
    if exp.settings.config.export.which == "best":
        best = runs.select_checkpoint(exp.workdir, record, "best")
        weights = runs.restore_run_params(exp.workdir, record, best, exp.layouts.training,
                                          lora.strip(final_params) if lora.has_adapters(final_params) else None)
    stage = "grpo" if exp.settings.config.export.which == "best" else exp.settings.config.stages[-1]
    runs.export_weights(record, stage, weights, exp.layouts.training, exp.workdir / EXPORT_DIR, replace=True)

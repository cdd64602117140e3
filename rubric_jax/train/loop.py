"""The experiment pipeline behind `experiments.run`: build everything from a config, then run the stages.

Stages (config.stages): "sft" (cold-start SFT on formatted answers, QuRL; train/sft_stage.py) then "grpo"
(rollouts -> rubric reward -> group advantages -> jitted sharded update, with held-out evals;
train/grpo_stage.py), each through the step runner (train/runner.py), then the best checkpoint's report and
the export (train/finish.py). `build` (train/experiment.py) reads and checks everything first.

Multi-host (several processes, `distributed.py`): every process walks the same seeded order of questions
and SFT rows and takes its own block of each batch (`distributed.process_block`; the per-step counts
must divide by the process count, checked at start-up); padding widths are agreed across processes;
scored rows are gathered to every process (train/collect.py). Orbax saves and restores from every process;
only process 0 writes the run files, logs, alerts, plots and export.

Reliability: every stage checkpoints (orbax) params, optimizer state, step, data-iterator position, the
rubric hash and the stage's extras; a restart validates the config and the saved checkpoints' records,
writes nothing before that (train/workdir.py), resumes from the newest checkpoint that restores and first
drops metrics/sample rows written after it, so a killed-and-restarted run writes exactly what an
uninterrupted run writes. SIGTERM finishes the current step, saves and exits cleanly.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from rubric_jax import config_boundary, distributed, metrics, plots
from rubric_jax.rubrics.io import dumps_rubric
from rubric_jax.train import finish, settings as run_settings, workdir as run_workdir
from rubric_jax.train.experiment import Experiment, build as experiment_build
from rubric_jax.train.grpo_stage import GRPOStage
from rubric_jax.train.runner import Runner, Stage, StopRequest
from rubric_jax.train.sft_stage import SFTStage


def run(config: config_boundary.ConfigDict, workdir: str | Path) -> None:
    """Runs (or resumes) every configured stage and writes plots; see the module docstring. Nothing is
    written before the config, the workdir, the data and the saved checkpoints' records all check out."""
    settings = run_settings.validate(config_boundary.experiment(config))  # the boundary: blocks from here on
    workdir = run_workdir.check_usable(workdir)
    experiment = experiment_build(settings, config_boundary.record(config), workdir)  # reads only
    # One writer per workdir: process 0 holds its lock until the run ends (the OS drops it on any death).
    with run_workdir.exclusive(workdir) if distributed.is_writer() else contextlib.nullcontext():
        run_experiment(experiment)


def build(config: config_boundary.ConfigDict, workdir: str | Path) -> Experiment:
    """The experiment of a resolved config, checked and built as `run` builds it (reads only)."""
    return experiment_build(run_settings.validate(config_boundary.experiment(config)), config_boundary.record(config),
                            workdir)


def run_experiment(exp: Experiment) -> None:
    """`run` once the experiment is built and this process may write the workdir: the run files, the stages,
    the best checkpoint's report, the export, the plots and done.json."""
    settings, workdir = exp.settings, exp.workdir
    config = settings.config
    run_workdir.check_resume(workdir, rubric_hash=exp.rubric_hash, updates_per_batch=config.rl.updates_per_batch,
                             keep=config.checkpoint.keep, judge_hash=exp.judge_hash,
                             reward_model_hash=exp.reward_model_hash)
    if distributed.is_writer():
        run_workdir.write_run_files(workdir, exp.config_json, dumps_rubric(exp.shared_rubric, "yaml"), exp.rubric_info)
        (workdir / finish.BEST_FILE).unlink(missing_ok=True)  # rewritten when GRPO finishes; a stale one could name a deleted step
    distributed.wait_for_everyone(f"run files {workdir}")
    with StopRequest() as stop, contextlib.closing(exp.log):
        params = exp.initial_params()
        if settings.sft is not None:
            params = run_stage(exp, SFTStage(exp, params), stop).model_params()
        if settings.rl is not None and not stop.requested:
            params = run_stage(exp, GRPOStage(exp, params), stop).model_params()
            if not stop.requested:
                finish.report_best(exp)
        if config.export.at_end and not stop.requested:
            finish.export_at_end(exp, params)
    if distributed.is_writer():
        plots.plot_run(workdir)
        if not stop.requested:
            metrics.mark_done(workdir, exp.config_sha256)  # done.json: a sweep skips this run when its config is unchanged
    distributed.wait_for_everyone(f"run done {workdir}")


def run_stage(exp: Experiment, stage: Stage, stop: StopRequest) -> Any:
    """Runs `stage` to its end (or an agreed stop) with the experiment's checkpoints and log; the final state.
    A stop says so in one line once its checkpoint is written (the run then exits 0, as a finished one)."""
    with exp.checkpointer(stage.name, keep_best=stage.keep_best) as ckpt:
        config = exp.settings.config
        state = Runner(stage, ckpt, exp.log, every_steps=config.checkpoint.every_steps, seed=config.seed,
                       rubric_hash=exp.rubric_hash, stop=stop).run()
    if stop.requested and distributed.is_writer():
        print(stopped_line(stage.name, int(state.step) // stage.updates_per_step, stage.total, int(state.step),
                           ckpt.directory), flush=True)
    return state


def stopped_line(stage: str, step: int, total: int, checkpoint_step: int, directory: Path) -> str:
    """The line a run stopped by SIGTERM ends with: where it stopped and where the same command resumes."""
    return (f"stopped by SIGTERM at {stage} step {step} of {total}: the run is not finished; rerun the same command to "
            f"resume from checkpoint step {checkpoint_step} ({directory})")

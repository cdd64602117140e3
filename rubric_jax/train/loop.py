"""The experiment pipeline behind `experiments.run`: build everything from a config, then run the stages.

Stages (config.stages): "sft" (cold-start SFT on formatted answers, QuRL) then "grpo" (rollouts ->
rubric reward -> group advantages -> jitted sharded update), with held-out evals before the first GRPO
update (the SFT baseline), every `eval.every_steps` steps and at the end. Every GRPO step also writes
the reward-hacking monitors (train/monitors.py: alerts.jsonl) and every eval scores the golden set
(train/golden.py).

Both stages run through one stage runner (`run_stage`): optimizer state and shardings, restore with
fallback, the resumable data iterator, a progress bar, save cadence, SIGTERM; a stage only says how one
step is dispatched (`Stage.train_step`) and what runs after it (`Stage.after_step`: evals, NaN streak).
A step's metrics are read from the device after the next step is dispatched (as nanodo does), so the
host never waits for the device between steps; rows are flushed before an eval or a save.

Multi-host (several processes, `distributed.py`): every process walks the same seeded order of questions
and SFT rows and takes its own block of each batch (`distributed.process_block`; the per-step counts
must divide by the process count, checked at start-up); padding widths are agreed across processes;
each process samples its questions through the global sharded `generate` and scores its own rows, and
the scored rows of every process are then gathered to each (`Rollout`), so advantages, metrics, monitors,
dynamic weights and samples are computed from all rows, identically everywhere. Orbax saves and restores
from every process; only process 0 writes the run files, logs, alerts, plots and export.

Reliability: every stage checkpoints (orbax) params, optimizer state, step, data-iterator position, the
rubric hash and the stage's extras; a restart validates the config and the saved checkpoints' records,
writes nothing before that (train/workdir.py), resumes from the newest checkpoint that restores and first
drops metrics/sample rows written after it, so a killed-and-restarted run writes exactly what an
uninterrupted run writes. SIGTERM finishes the current step, saves and exits cleanly. A non-finite loss or
gradient skips the update (train/step.py); `rl.max_nan_streak` skips in a row stop the run. Per-step
randomness is `fold_in(key, step)`, so a resumed step samples exactly what it would have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from rubric_jax import data, distributed, files, loader, metrics, padding, plots, sampling, sharding
from rubric_jax.calibration.pinning import check_calibration
from rubric_jax.judges.base_model import same_base_warnings
from rubric_jax.judges.llm_judge import Judge, shortest_prompt_tokens
from rubric_jax.judges.reward import (RewardOutput, RubricReward, concat_outputs, gather_outputs, select_rows,
                                      split_by_reads)
from rubric_jax.judges.reward_model import RewardModelReward, load_reward_model
from rubric_jax.judges.spec import JudgeSpec, describe as describe_judge, load_cascade, load_judges, open_verdict_store
from rubric_jax.judges.store import VerdictStore
from rubric_jax.models.checkpoint import CheckpointError, load_tokenizer
from rubric_jax.models.config import ModelConfig
from rubric_jax.rubrics.correction import Correction, load_correction
from rubric_jax.rubrics.dynamic_weights import DimensionWeights
from rubric_jax.rubrics.io import dumps_rubric, load_rubric
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.train import audit as judge_audit, checkpointing, dynamic, export, golden as golden_set, monitors
from rubric_jax.train import oscillation
from rubric_jax.train import programs as run_programs
from rubric_jax.train import rollout, runs, settings as run_settings, state as train_state, workdir as run_workdir
from rubric_jax.train.settings import RolloutSpec, Settings

EXPORT_DIR = "export"  # <workdir>/export: the final policy as a HF directory (config.export.at_end)
BEST_FILE = "best_checkpoint.json"  # the best-evaluated GRPO checkpoint, written when GRPO finishes

EVAL_SAMPLES = 4  # eval responses written to samples.jsonl per eval
_EVAL_KEY = 2**31 - 1  # fold_in data of the eval sampling key (GRPO step keys are 1000 + step)
_GOLDEN_REFERENCE_KEY = 1  # fold_in data (into the eval key) of the golden references' judge key, the same every eval
_AUDIT_KEY = 2  # fold_in data (into the eval key) of the audit judge's key


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many non-finite updates in a row); the message says what to do."""


@dataclasses.dataclass
class Run:
    """What the stages share: the built pieces of one experiment (no maths here)."""

    config: ml_collections.ConfigDict
    settings: Settings  # the validated config: typed rollout specs, GRPO objective
    workdir: Path
    layout: sharding.Layout  # training layout (FSDP/TP): policy, reference, optimizer state, batches
    decode_layout: sharding.Layout  # rollouts and judges (mesh.rollout), over the same devices
    decode_dtype: str  # the policy's parameter dtype while decoding (mesh.rollout.param_dtype resolved)
    tokenizer: Any
    model_cfg: ModelConfig
    graphdef: nnx.GraphDef  # the policy's (and reference's) module structure in the training layout
    reward: RubricReward | RewardModelReward  # config.reward.source
    shared_rubric: Rubric
    rubric_of: dict[str, Rubric]  # question id -> its rubric (shared, or case-wise R*(q))
    rubric_hash: str
    rubric_info: dict[str, Any]  # rubric.json: name, version, content and rubric-set hashes
    train_questions: list[data.Question]
    eval_questions: list[data.Question]
    log: run_workdir.RunLog
    key: jax.Array
    dynamic_weights: DimensionWeights | None
    golden: golden_set.GoldenSet | None  # config.data.golden, scored at every eval
    watch: monitors.Watch  # reward-hacking monitors' thresholds and alerts.jsonl
    stop_requested: bool = False
    judge_store: VerdictStore | None = None  # config.judge.store: the golden references' verdicts (and rollouts')
    audit: judge_audit.Audit | None = None  # config.audit: another judge scores eval responses (train/audit.py)

    def rollout_store(self) -> dict[str, VerdictStore]:
        """The store keyword of a policy-response reward call: the store with judge.store_rollouts, else none."""
        return {"store": self.judge_store} if self.config.judge.store_rollouts else {}

    @property
    def weights(self) -> dict[str, float] | None:
        """Dimension weights overriding the rubrics' (dynamic weights), or None to use the rubrics'."""
        return None if self.dynamic_weights is None else self.dynamic_weights.current()

    @property
    def mesh(self) -> jax.sharding.Mesh:
        """The training mesh."""
        return self.layout.mesh

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        return (int(self.tokenizer.eos_token_id),)

    def policy(self, params: dict[str, Any]) -> loader.Weights:
        """The train state's params (no copy) as the policy's Weights in the training layout."""
        return loader.as_weights(self.model_cfg, params, self.layout)


def rollout_weights(run_: Run, params: dict[str, Any]) -> loader.Weights:
    """The policy in the decode layout and dtype, its layers per layer (what the sampler reads in place),
    resharded from the training layout once per rollout (nothing is resharded back)."""
    return loader.to_layout(run_.policy(params), run_.decode_layout, param_dtype=run_.decode_dtype, per_layer=True)


# ------------------------------------------------------------------------------------------- set-up
def run(config: ml_collections.ConfigDict, workdir: str | Path) -> None:
    """Runs (or resumes) every configured stage and writes plots; see the module docstring. Nothing is
    written before the config, the workdir, the data and the saved checkpoints' records all check out."""
    settings = run_settings.validate(config)
    monitors.thresholds(config.monitor)  # the alert thresholds fail here too, before anything is written
    workdir = run_workdir.check_usable(workdir)
    experiment = build(config, workdir, settings)  # reads only
    # One writer per workdir: process 0 holds its lock until the run ends (the OS drops it on any death).
    with run_workdir.exclusive(workdir) if distributed.is_writer() else contextlib.nullcontext():
        _run(experiment)


def _run(experiment: Run) -> None:
    """`run` once the config, the workdir and the data check out and this process may write the workdir."""
    config, workdir, settings = experiment.config, experiment.workdir, experiment.settings
    run_workdir.check_resume(workdir, rubric_hash=experiment.rubric_hash,
                             updates_per_batch=config.rl.updates_per_batch, keep=config.checkpoint.keep)
    if distributed.is_writer():
        run_workdir.write_run_files(workdir, config.to_json_best_effort(indent=2, sort_keys=True),
                                    dumps_rubric(experiment.shared_rubric, "yaml"), experiment.rubric_info)
        (workdir / BEST_FILE).unlink(missing_ok=True)  # rewritten when GRPO finishes; a stale one could name a deleted step
    distributed.wait_for_everyone(f"run files {workdir}")
    with _sigterm_requests_stop(experiment), contextlib.closing(experiment.log):
        params = initial_params(experiment)
        if "sft" in settings.stages:
            params = run_sft(experiment, params)
        if "grpo" in settings.stages and not experiment.stop_requested:
            params = run_grpo(experiment, params)
            if not experiment.stop_requested:
                report_best(experiment)
        if config.export.at_end and not experiment.stop_requested:
            export_at_end(experiment, params)
    if distributed.is_writer():
        plots.plot_run(workdir)
        if not experiment.stop_requested:
            metrics.mark_done(workdir, config)  # done.json: a sweep skips this run when its config is unchanged
    distributed.wait_for_everyone(f"run done {workdir}")


def _existing_dir(value: str, key: str, what: str) -> str:
    """`value` if it names a directory; else one line naming the config key that sets it."""
    if not Path(value).is_dir():
        raise CheckpointError(f"config.{key}={value}: {what} directory does not exist; set --config.{key}=DIR "
                              "(a local directory: nothing is downloaded)")
    return value


def layouts(config: ml_collections.ConfigDict, model_cfg: ModelConfig, devices: Sequence[jax.Device] | None = None
            ) -> tuple[sharding.Layout, sharding.Layout, str]:
    """The training layout over `devices` (default: all), the decode layout over the same devices, and
    the decode parameter dtype."""
    layout = sharding.Layout(sharding.make_mesh(
        sharding.MeshConfig(config.mesh.data, config.mesh.fsdp, config.mesh.tensor), devices))
    rollout_mesh = config.mesh.rollout
    try:
        decode = sharding.decode_layout(layout.mesh, rollout_mesh.tensor)
    except ValueError as e:
        raise ValueError(f"config.mesh.rollout.tensor={rollout_mesh.tensor!r}: {e}") from None
    for field, heads in (("num_heads", model_cfg.num_heads), ("num_kv_heads", model_cfg.num_kv_heads)):
        if heads % rollout_mesh.tensor:
            raise ValueError(f"config.mesh.rollout.tensor={rollout_mesh.tensor} does not divide the model's {field} "
                             f"({heads}): those weights would be replicated on every device; pick a divisor")
    dtype = model_cfg.compute_dtype if rollout_mesh.param_dtype == "compute" else rollout_mesh.param_dtype
    return layout, decode, dtype


def build(config: ml_collections.ConfigDict, workdir: str | Path, settings: Settings | None = None) -> Run:
    """Layouts, tokenizer, model shape, rubric, reward, datasets and the (lazily opened) log from the
    config; reads only: nothing is written to the workdir."""
    settings = settings or run_settings.validate(config)
    workdir = Path(workdir)
    model_dir = config.model.checkpoint and _existing_dir(config.model.checkpoint, "model.checkpoint", "model")
    if not (config.model.tokenizer or model_dir):
        raise ValueError("config.model.tokenizer (or config.model.checkpoint) must name a tokenizer directory")
    tokenizer_key = "model.tokenizer" if config.model.tokenizer else "model.checkpoint"
    tokenizer_dir = _existing_dir(config.model.tokenizer or model_dir, tokenizer_key, "tokenizer")
    judge_dirs = [_existing_dir(path, "judge.checkpoint", "judge") for path in settings.judge.checkpoints]
    model_cfg = run_settings.model_config(config)
    run_settings.check_positions(config, settings, model_cfg.max_position_embeddings)
    layout, decode_layout, decode_dtype = layouts(config, model_cfg)
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
    except CheckpointError as e:
        raise CheckpointError(f"config.{tokenizer_key}: {e}") from e
    graphdef = loader.abstract_weights(model_cfg, layout).graphdef

    shared_rubric = load_rubric(config.data.rubric)
    train_questions = data.load_question_set(config.data.train, config.data.tfds_dir, "train")
    eval_questions = data.load_question_set(config.data.eval, config.data.tfds_dir, "eval")[: config.eval.max_questions]
    if "grpo" in settings.stages:
        _check_rollouts_divide(config.rl, layout.mesh)
        distributed.check_divides(config.rl.questions_per_step, "rl.questions_per_step")
        distributed.check_divides(len(eval_questions), "eval.max_questions (the eval questions used)")
        _check_prompts_fit(tokenizer, settings, train_questions + eval_questions)
    golden = golden_set.load_golden(config.data.golden, config.data.tfds_dir, shared_rubric, train_questions,
                                    eval_questions, config.data.golden_max_jaccard) if config.data.golden else None
    if golden is not None:
        distributed.check_divides(len(golden.questions), "data.golden (its questions)")
    rubric_of = {q.id: data.question_rubric(shared_rubric, q) for q in train_questions + eval_questions}
    rubric_of.update({q.id: r for q, r in zip(golden.questions, golden.rubrics)} if golden else {})
    rubrics = list(rubric_of.values())
    calibration = check_calibration(settings.judge, rubrics, "config.judge")  # before the judges load
    for line in calibration.lines() if calibration is not None else []:
        print(line, file=sys.stderr)
    judges = load_judges(settings.judge, layout, where="config.judge")
    for warning in same_base_warnings(model_dir or config.model.config_json, judge_dirs):
        print(warning, file=sys.stderr)  # RubricRL 6.2: a judge of the policy's base model can collude with it
    if "sft" in settings.stages:
        distributed.check_divides(config.sft.batch_size, "sft.batch_size")
    if settings.reward_model is not None and jax.process_count() > 1:
        raise ValueError(f"config.reward.source='reward_model': the reward model scores on one process only; "
                         f"this job has {jax.process_count()} (use the rubric reward, or run on one host)")
    correction = load_correction(config.data.rubric_correction) if config.data.rubric_correction else None
    if settings.reward_model is None:
        reward = RubricReward(rubrics, judges, settings.judge, correction=correction,
                              gates_first=config.reward.gates_first,
                              refiners=load_cascade(settings.judge, layout, where="config.judge"))
        _check_judge_prompts_fit(config, judges, settings.judge, rubric_of,
                                 train_questions + eval_questions + (golden.questions if golden else []))
    else:
        dtype = config.reward.model_dtype
        reward = RewardModelReward(load_reward_model(config.reward.model_checkpoint, layout=decode_layout,
                                                     param_dtype=dtype, compute_dtype=dtype), settings.reward_model)
    judge_store = open_verdict_store(settings.judge) if judges else None
    rubric_hash = _rubric_set_hash(shared_rubric, rubrics, correction)
    rubric_info = {"name": shared_rubric.name, "version": shared_rubric.version,
                   "content_hash": shared_rubric.content_hash, "rubric_set_hash": rubric_hash,
                   "correction_hash": correction.content_hash if correction is not None else None,
                   "judge": describe_judge(settings.judge) if judges else None,
                   "calibration": calibration.record() if calibration is not None else None}
    dynamic = (DimensionWeights.for_rubrics(rubrics, config.rl.dynamic_weights_window)
               if config.rl.dynamic_weights else None)
    log = run_workdir.RunLog(workdir, run_info={"rubric": rubric_info, "config": config.to_dict()})
    return Run(config, settings, workdir, layout, decode_layout, decode_dtype, tokenizer, model_cfg, graphdef, reward,
               shared_rubric, rubric_of, rubric_hash, rubric_info, train_questions, eval_questions, log,
               jax.random.key(config.seed), dynamic, golden,
               monitors.Watch(monitors.thresholds(config.monitor), workdir, config.monitor.window_steps,
                              open_logs=lambda: log.writer), judge_store=judge_store,
               audit=judge_audit.build_audit(settings.audit, layout, rubrics))


def _check_prompts_fit(tokenizer: Any, settings: Settings, questions: Sequence[data.Question]) -> None:
    """Every question's chat prompt fits config.data.max_prompt_len: checked at load time, naming the file and
    line, not mid-GRPO (with the longest response it then fits the model's positions: settings.check_positions)."""
    limit = max(settings.train_rollout.prompt_buckets)
    for question, ids in zip(questions, data.encode_prompts(tokenizer, [q.question for q in questions])):
        if len(ids) > limit:
            raise data.DataError(f"{question.source}: question {question.id!r} is {len(ids)} tokens as a chat "
                                 f"prompt; config.data.max_prompt_len allows {limit}")


def _check_judge_prompts_fit(config: ml_collections.ConfigDict, judges: Sequence[Judge], judge_spec: JudgeSpec,
                             rubric_of: dict[str, Rubric], questions: Sequence[data.Question]) -> None:
    """Every LLM dimension can be judged: its shortest judge prompt (for an empty response) fits each judge's context
    less config.judge.max_new_tokens. Checked at start-up: a dimension whose prompts never fit would drop out of every
    reward (scores missing), and the run would train without it."""
    seen = set()
    for q in questions:
        dims = [d for d in rubric_of[q.id].dimensions if d.kind == "llm"]
        groups = [[d] for d in dims] if judge_spec.mode == "per_dimension" else split_by_reads([dims])[1]
        for group in groups:
            key = ("" if judge_spec.prompt == "compact" else q.question, tuple(group))  # compact: no question
            if key in seen:
                continue
            seen.add(key)
            for judge in judges:
                tokens = shortest_prompt_tokens(judge, judge_spec, q.question, group)
                if tokens > judge.max_prompt_tokens:
                    context = judge.weights.cfg.max_position_embeddings if judge.weights is not None else "?"
                    raise ValueError(
                        f"config.judge.max_new_tokens={config.judge.max_new_tokens} leaves judge {judge.name} "
                        f"{judge.max_prompt_tokens} of its {context} context tokens for a prompt, but the shortest "
                        f"prompt for LLM dimension(s) {[d.id for d in group]} of {q.source} (an empty response) is "
                        f"{tokens} tokens: nothing would ever be judged on it; lower config.judge.max_new_tokens or "
                        "use a judge with a longer context")


def _check_rollouts_divide(rl: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> None:
    """A GRPO batch splits evenly into micro-batches of whole groups (a group's prompt runs once) and
    over the mesh's batch axes (checked before SFT)."""
    if rl.questions_per_step % rl.micro_batches:
        raise ValueError(f"config.rl.micro_batches={rl.micro_batches} must divide questions_per_step="
                         f"{rl.questions_per_step}: a micro-batch holds whole groups")
    shards = mesh.shape["data"] * mesh.shape["fsdp"] * rl.micro_batches
    if (rl.questions_per_step * rl.group_size) % shards:
        raise ValueError(
            f"config.rl: questions_per_step * group_size = {rl.questions_per_step * rl.group_size} rollouts must "
            f"divide into micro_batches ({rl.micro_batches}) x mesh data*fsdp ({shards // rl.micro_batches})")


def _rubric_set_hash(shared: Rubric, rubrics: list[Rubric], correction: Correction | None = None) -> str:
    """One hash over every rubric used (shared + case-wise) and the score correction applied, if any;
    recorded in checkpoints and metrics."""
    joined = "\n".join(sorted({shared.content_hash, *(r.content_hash for r in rubrics)}))
    if correction is not None:
        joined += f"\ncorrection {correction.content_hash}"
    return hashlib.sha256(joined.encode()).hexdigest()


def initial_params(run_: Run) -> dict[str, Any]:
    """The starting policy's params, in the training layout, through the loader: the pretrained
    checkpoint, or a seeded random init."""
    if run_.config.model.checkpoint:
        return loader.load_weights(run_.config.model.checkpoint, run_.layout, **run_settings.model_overrides(run_.config)).params
    param_key = jax.random.split(jax.random.fold_in(run_.key, 0))[0]  # the init key runs have always used
    return loader.init_weights(run_.model_cfg, run_.layout, param_key).params


def load_reference(run_: Run, state: train_state.TrainState, iterator_state: data.IteratorState) -> loader.Weights:
    """The frozen KL reference: the policy GRPO started from, saved once (step 0) so that a resumed run
    keeps it, and read back (params only) through the loader into the training layout."""
    with _checkpointer(run_, "reference") as ref_ckpt:
        if ref_ckpt.latest_step() is None:
            ref_ckpt.save(state, data_state=iterator_state.to_dict(), rubric_hash=run_.rubric_hash)
        return ref_ckpt.restore_params(run_.model_cfg, run_.layout, step=0)


def _checkpointer(run_: Run, stage: str, keep_best: bool = False) -> checkpointing.Checkpointer:
    return checkpointing.Checkpointer(run_workdir.checkpoint_dir(run_.workdir, stage),
                                      max_to_keep=run_.config.checkpoint.keep, keep_best=keep_best)


@contextlib.contextmanager
def _sigterm_requests_stop(run_: Run) -> Iterator[None]:
    """SIGTERM sets `stop_requested`; the stage loops then save a checkpoint and return."""
    def request_stop(signum, frame):
        run_.stop_requested = True
        print("SIGTERM: finishing the current step, saving a checkpoint and exiting")

    previous = signal.signal(signal.SIGTERM, request_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------------------------ stage runner
@dataclasses.dataclass(frozen=True)
class StepOutput:
    """A dispatched step: `row()` reads its metrics from the device (the runner calls it once the next
    step is dispatched), `samples` go to samples.jsonl."""

    row: Callable[[], dict[str, Any]]
    samples: Sequence[dict[str, Any]] = ()


@dataclasses.dataclass
class Stage:
    """What differs between SFT and GRPO; `run_stage` does the rest."""

    name: str  # "sft" or "grpo": checkpoint directory, log rows' "stage", progress bar
    total: int  # stage steps (batches); the stage is done at this step
    rows: Sequence[Any]  # what the resumable iterator walks (SFT examples, questions)
    batch_size: int
    state: train_state.TrainState  # step-0 state, in its shardings
    shardings: train_state.TrainState
    # (state, this process's rows, stage step, a function giving the next batch's rows) -> (state, output); the
    # last lets a GRPO step with rl.dynamic_sampling draw more questions (the iterator's position is checkpointed)
    train_step: Callable[[train_state.TrainState, list[Any], int, Callable[[], list[Any]]],
                         tuple[train_state.TrainState, StepOutput]]
    updates_per_step: int = 1  # TrainState.step counts optimizer updates: this many per stage step
    progress_keys: tuple[str, ...] = metrics.PROGRESS_KEYS
    checkpoint_extra: Callable[[], dict[str, Any]] = dict  # JSON saved with each checkpoint
    on_start: Callable[[checkpointing.Restored | None, train_state.TrainState, int, metrics.Progress], None] = (
        lambda restored, state, start, progress: None)  # after restore, before the first step
    observe: Callable[[int, dict[str, Any]], dict[str, Any]] = (
        lambda step, row: row)  # a step's metrics once read back, before they are written (monitors, alerts)
    after_row: Callable[[int, dict[str, Any], checkpointing.Checkpointer], None] = (
        lambda step, row, ckpt: None)  # a step's metrics, once written
    eval_due: Callable[[int], bool] = lambda step: False  # steps after which `evaluate` runs
    evaluate: Callable[[int, train_state.TrainState, metrics.Progress], float | None] = (
        lambda step, state, progress: None)  # after the step's row was written, before its checkpoint; returns
    # the held-out reward that ranks the step's checkpoint
    keep_best: bool = False  # every eval step saves, and the best-ranked checkpoint is kept past checkpoint.keep


def run_stage(run_: Run, stage: Stage) -> train_state.TrainState:
    """Runs `stage` from its newest restorable checkpoint to `stage.total` (or a SIGTERM); returns the state."""
    every = run_.config.checkpoint.every_steps
    with _checkpointer(run_, stage.name, keep_best=stage.keep_best) as ckpt:
        state, iterator_state = stage.state, data.IteratorState(seed=run_.config.seed)
        restored = ckpt.restore_newest(checkpointing.abstract_with_shardings(state, stage.shardings))
        if restored is not None:
            state, iterator_state = restored.state, data.IteratorState.from_dict(restored.data_state)
            print(f"resuming from {ckpt.directory} step {int(state.step)}")
        start = int(state.step) // stage.updates_per_step
        if restored is not None:
            run_.log.resumed_at(stage.name, start)
        batches = data.BatchIterator(stage.rows, stage.batch_size, iterator_state)
        progress = metrics.Progress(stage.total, initial=start, desc=stage.name, keys=stage.progress_keys)
        pending: tuple[int, StepOutput] | None = None

        def flush() -> None:
            nonlocal pending
            if pending is not None:
                step, out = pending
                pending = None
                row = stage.observe(step, {"stage": stage.name, **out.row()})
                run_.log.write(step, row)
                run_.log.write_samples(step, [{"stage": stage.name, **s} for s in out.samples])
                progress.update(step, row)
                stage.after_row(step, row, ckpt)

        try:
            stage.on_start(restored, state, start, progress)
            for step in range(start + 1, stage.total + 1):
                state, out = stage.train_step(state, distributed.process_block(next(batches)), step,
                                              lambda: distributed.process_block(next(batches)))
                flush()  # the previous step's row, read while this step runs
                pending = (step, out)
                # A SIGTERM may reach one process only: every process stops at the same step, or none does.
                if distributed.max_over_processes(int(run_.stop_requested))[0]:
                    run_.stop_requested = True
                save = step % every == 0 or step == stage.total or run_.stop_requested
                if save or stage.eval_due(step):
                    flush()
                rank = stage.evaluate(step, state, progress) if stage.eval_due(step) else None
                if save or rank is not None and stage.keep_best:
                    ckpt.save(state, data_state=batches.state.to_dict(), rubric_hash=run_.rubric_hash,
                              extra=stage.checkpoint_extra(), best_value=rank)
                if run_.stop_requested:
                    break
            flush()
        finally:
            progress.close()
    return state


def _state_and_shardings(run_: Run, params: Any, tx: Any) -> tuple[train_state.TrainState, train_state.TrainState]:
    """A step-0 TrainState around existing params (optimizer state created in its shardings) and its shardings."""
    return train_state.new_train_state(run_.policy(params), tx, run_.mesh)


def _host(tree: dict[str, jax.Array]) -> dict[str, float]:
    return {k: float(v) for k, v in distributed.host_tree(tree).items()}


# --------------------------------------------------------------------------------------------- SFT
def run_sft(run_: Run, init_params: dict[str, Any]) -> dict[str, Any]:
    """Cold-start SFT (QuRL): masked NLL on formatted responses for `sft.epochs` epochs; returns the params."""
    cfg = run_.config
    examples = data.load_sft(cfg.data.sft)
    prompt_buckets, response_buckets = run_.settings.train_rollout.prompt_buckets, run_.settings.sft_response_buckets
    data.check_sft_lengths(run_.tokenizer, examples, prompt_buckets, response_buckets,
                           run_.model_cfg.max_position_embeddings)
    total = cfg.sft.epochs * -(-len(examples) // cfg.sft.batch_size)
    state, shardings = _state_and_shardings(run_, init_params, run_programs.sft_optimizer(cfg.sft, total))
    step_fn = run_programs.sft_program(shardings, run_.mesh)

    def sft_step(state: train_state.TrainState, rows: list[data.SFTExample], step: int, draw: Callable) -> Any:
        del draw
        batch = data.sft_batch(run_.tokenizer, rows, prompt_buckets, response_buckets, across_processes=True)
        state, step_metrics = step_fn(state, distributed.global_batch(
            {"tokens": batch.tokens_BxT, "input_mask": batch.input_mask_BxT, "loss_mask": batch.loss_mask_BxT},
            sharding.batch_sharding(run_.mesh)))
        return state, StepOutput(lambda: _host(step_metrics))

    stage = Stage("sft", total, examples, cfg.sft.batch_size, state, shardings, sft_step,
                  progress_keys=("loss", "grad_norm"))
    return run_stage(run_, stage).params


# -------------------------------------------------------------------------------------------- GRPO
@dataclasses.dataclass
class NanStreak:
    """Counts consecutive skipped (non-finite) updates and stops the run at `limit`."""

    limit: int
    count: int = 0

    def record(self, skipped: float, step: int, last_checkpoint: str) -> None:
        """Raises TrainingError naming the last good checkpoint once `limit` updates in a row were skipped."""
        self.count = self.count + 1 if skipped > 0 else 0
        if self.count >= self.limit:
            raise TrainingError(
                f"{self.count} GRPO updates in a row had a non-finite loss or gradient (up to step {step}); "
                f"stopping. The last good checkpoint is {last_checkpoint}. Lower rl.lr or check the rewards.")


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One scored rollout. The sampler's device arrays (`sampled`, one per sampler call) and this process's
    chosen `groups` ((call, prompt) pairs) build its block of the training batch on the device; the scores,
    samples and lengths are every process's rows (process order, as one process would have them), so whatever
    is computed from them is the same on every process. Legend: B this process's questions, N all rollouts."""

    sampled: tuple[sampling.Samples, ...]
    groups: tuple[tuple[int, int], ...]  # this process's B groups
    result: sampling.GenerationResult  # this process's rows (B·n) on the host: tokens, lengths (no log-probs)
    scored: RewardOutput  # all N rows
    samples: list[dict[str, Any]]  # all N rows: question, response, reward, scores
    lengths_N: np.ndarray
    truncated_N: np.ndarray  # stopped at max_new_tokens
    rows: slice  # this process's rows among the N


@dataclasses.dataclass(frozen=True)
class LocalRollout:
    """This process's sampled and scored rows of a rollout, before they are gathered (legend: B this
    process's questions, n samples each): the sampler's device arrays, the host tokens its judges read."""

    questions: list[data.Question]
    sampled: tuple[sampling.Samples, ...]
    groups: tuple[tuple[int, int], ...]
    result: sampling.GenerationResult
    scored: RewardOutput
    responses: list[str]


def sample_and_score(run_: Run, params: Any, questions: list[data.Question], spec: RolloutSpec, key: jax.Array
                     ) -> LocalRollout:
    """Samples `spec.n` responses per question (this process's questions) with the policy and scores them with
    their rubrics (the sampler and the LLM judge are global computations: every process must call it)."""
    sample_key, judge_key = jax.random.split(key)
    prompt_ids, prompt_mask = data.prompt_batch(run_.tokenizer, [q.question for q in questions], spec.prompt_buckets,
                                                across_processes=True)
    samples = sampling.sample(rollout_weights(run_, params), prompt_ids, prompt_mask=prompt_mask, key=sample_key,
                              n=spec.n, max_new_tokens=spec.max_new_tokens, sampler=spec.sampler,
                              stop_tokens=run_.stop_tokens, pad_id=run_.tokenizer.pad_token_id,
                              layout=run_.decode_layout, response_buckets=spec.response_buckets)
    result = sampling.host_result(samples, logprobs=False)  # the judges' text; the log-probs stay on the device
    responses = data.decode_responses(run_.tokenizer, result, run_.stop_tokens)
    expanded = [q.question for q in questions for _ in range(spec.n)]
    scored = run_.reward(expanded, responses, [run_.rubric_of[q.id] for q in questions for _ in range(spec.n)],
                         key=judge_key, weights=run_.weights, **run_.rollout_store())
    return LocalRollout(list(questions), (samples,), tuple((0, g) for g in range(len(questions))), result, scored,
                        responses)


def gather_rollout(local: LocalRollout, n: int, extra: Any = None) -> tuple[Rollout, list[Any]]:
    """Every process's rows of `local` (process order) as one Rollout, and every process's `extra`."""
    expanded = [q.question for q in local.questions for _ in range(n)]
    finished = local.result.finish_reason == sampling.FINISH_LENGTH
    parts = distributed.all_gather_objects((local.scored, expanded, local.responses, local.result.lengths, finished,
                                            extra))
    scored = concat_outputs([part[0] for part in parts])
    expanded, responses = [x for part in parts for x in part[1]], [x for part in parts for x in part[2]]
    samples = [{"question": expanded[i], "response": responses[i], "reward": float(scored.reward[i]),
                "scores": {d: _json_float(scored.scores[i, c]) for c, d in enumerate(scored.dimension_ids)}}
               for i in range(len(responses))]
    rows = slice(*distributed.block_bounds(len(responses)))
    return Rollout(local.sampled, local.groups, local.result, scored, samples,
                   np.concatenate([part[3] for part in parts]), np.concatenate([part[4] for part in parts]),
                   rows), [part[5] for part in parts]


def rollout_and_score(run_: Run, params: Any, questions: list[data.Question], spec: RolloutSpec,
                      key: jax.Array) -> Rollout:
    """Samples `spec.n` responses per question (this process's questions) with the policy, scores them
    with their rubrics and gathers every process's scored rows."""
    return gather_rollout(sample_and_score(run_, params, questions, spec, key), spec.n)[0]


def dynamic_rollout(run_: Run, params: Any, questions: list[data.Question], spec: RolloutSpec, key: jax.Array,
                    draw: Callable[[], list[data.Question]], rule: dynamic.DynamicSampling
                    ) -> tuple[Rollout, dict[str, float]]:
    """A rollout of len(questions) groups by DAPO's dynamic sampling (train/dynamic.py): rounds of as many
    questions (`draw` gives the next batch) until this process's block holds that many groups with a reward
    spread above `rule.min_spread`, at most `rule.max_rounds` extra rounds; logs kept, dropped and rounds."""
    rounds: list[LocalRollout] = []
    spreads: list[np.ndarray] = []
    for r in range(rule.max_rounds + 1):
        round_questions = questions if r == 0 else draw()
        local = sample_and_score(run_, params, round_questions, spec, jax.random.fold_in(key, r))
        rounds.append(local)
        spreads.append(dynamic.group_spreads(local.scored.reward, local.scored.details["reward_ok"], spec.n))
        kept = sum(int((s > rule.min_spread).sum()) for s in spreads)
        if not distributed.max_over_processes(int(kept < len(questions)))[0]:
            break
    chosen = sorted(dynamic.select_groups(spreads, len(questions), rule.min_spread))  # grouped by round
    rows = [(r, g * spec.n + j) for r, g in chosen for j in range(spec.n)]
    results = [local.result for local in rounds]
    result = sampling.GenerationResult(
        np.stack([results[r].tokens[i] for r, i in rows]), None,
        np.asarray([results[r].lengths[i] for r, i in rows], np.int32),
        np.asarray([results[r].finish_reason[i] for r, i in rows]), max(res.num_steps for res in results))
    chosen_questions = [rounds[r].questions[g] for r, g in chosen]
    scored = concat_outputs([select_rows(local.scored, [i for rr, i in rows if rr == r])
                             for r, local in enumerate(rounds) if any(rr == r for rr, _ in rows)])
    if "judge_generate_calls" in scored.details:  # each round made its own calls (concat_outputs takes the max)
        scored.details["judge_generate_calls"] = sum(local.scored.details["judge_generate_calls"] for local in rounds)
    selected = LocalRollout(chosen_questions, tuple(local.sampled[0] for local in rounds), tuple(chosen), result,
                            scored, [rounds[r].responses[i] for r, i in rows])
    counts = (sum(int((s > rule.min_spread).sum()) for s in spreads),
              sum(int((s <= rule.min_spread).sum()) for s in spreads), len(rounds))
    gathered, every = gather_rollout(selected, spec.n, counts)
    return gathered, {"dynamic/kept_groups": float(sum(c[0] for c in every)),
                      "dynamic/dropped_groups": float(sum(c[1] for c in every)),
                      "dynamic/rounds": float(max(c[2] for c in every))}


def grpo_iteration(run_: Run, programs: run_programs.GRPOPrograms, state: train_state.TrainState, ref_params: Any | None,
                   questions: list[data.Question], key: jax.Array,
                   draw: Callable[[], list[data.Question]] | None = None) -> tuple[train_state.TrainState, StepOutput]:
    """One GRPO step: rollouts (with `rl.dynamic_sampling`, more rounds of questions from `draw` until enough
    groups vary) -> rubric reward -> group advantages -> rollout log-probs (reference;
    behaviour if `rl.recompute_old_logprobs`, else the sampler's) -> `rl.updates_per_batch` updates,
    dispatched; the returned StepOutput reads the updates' metrics when asked.

    `logprob_gap/mean` is the mean |teacher-forced − sampler| log-prob of the response tokens under the
    params that sampled (the first update's, or the recomputation's): float error on CPU float32, the
    decode drift to watch on accelerators in bf16.
    """
    spec, cfg, settings = run_.settings.train_rollout, programs.cfg, run_.settings
    if settings.dynamic_sampling is None:
        out, dynamic_row = rollout_and_score(run_, state.params, questions, spec, key), {}
    else:
        if draw is None:
            raise ValueError("grpo_iteration: rl.dynamic_sampling needs `draw` (more questions from the iterator)")
        out, dynamic_row = dynamic_rollout(run_, state.params, questions, spec, key, draw, settings.dynamic_sampling)
    scored = out.scored
    signal = rollout.rollout_advantages(scored, cfg, settings.missing_scores, settings.shaping,
                                        rubrics=_row_rubrics(run_, scored) if settings.shaping.advantage ==
                                        "per_dimension" else (), weights=run_.weights,
                                        lengths_N=out.lengths_N, truncated_N=out.truncated_N)
    (longest,) = distributed.max_over_processes(int(max(out.result.lengths.max(), 1)))
    batch = rollout.training_batch(out.sampled, out.groups, cfg.group_size,
                                   padding.bucket_length(longest, spec.response_buckets),
                                   signal.advantages_N[out.rows], signal.trainable_N[out.rows], run_.mesh)
    batch, logprob_stats = run_programs.rollout_logprobs(programs, batch, state.params, ref_params,
                                                         settings.recompute_old_logprobs)
    updates = []
    for _ in range(settings.updates_per_batch):
        state, update_metrics = programs.update(state, batch)
        updates.append(update_metrics)
    summary = rollout.summarize_rewards(scored)
    host_row = {"reward/mean": summary.reward_mean, **rollout.reward_metrics(summary, ""),
                "zero_std_frac": signal.zero_std_frac, "response_len/mean": float(out.lengths_N.mean()),
                "truncated_frac": float(out.truncated_N.mean()), **signal.metrics, **dynamic_row}
    host_row.update(monitors.step_monitors([s["response"] for s in out.samples], out.lengths_N, scored))
    host_row.update(run_.watch.redundancy(scored.dimension_ids, scored.scores, scored.valid))
    if run_.dynamic_weights is not None:
        host_row.update(run_.dynamic_weights.update(scored.dimension_ids, scored.scores, scored.valid))

    def row() -> dict[str, Any]:
        device_rows, stats = distributed.host_tree((updates, logprob_stats))
        out = {k: float(np.mean([u[k] for u in device_rows])) for k in device_rows[0]}
        out["logprob_gap/mean"] = float(device_rows[0]["abs_log_ratio"])  # the first update's, unless recomputed
        out.update({k: float(v) for k, v in stats.items()})
        return {**out, **host_row}

    return state, StepOutput(row, out.samples[: settings.samples_per_step])


def _row_rubrics(run_: Run, scored: RewardOutput) -> list[Rubric]:
    """Each scored row's rubric (every process's rows, from the hashes the reward recorded)."""
    by_hash = {rubric.content_hash: rubric for rubric in run_.rubric_of.values()}
    return [by_hash[h] for h in scored.details["rubric_hashes"]]


def evaluate(run_: Run, state: train_state.TrainState, step: int) -> dict[str, float]:
    """Held-out rubric reward of one response per eval (and golden) question with the eval sampler (greedy
    by default); alerts on the golden set's agreement."""
    key = jax.random.fold_in(run_.key, _EVAL_KEY)
    out = rollout_and_score(run_, state.params, distributed.process_block(run_.eval_questions),
                            run_.settings.eval_rollout, key)
    summary = rollout.summarize_rewards(out.scored)
    row = {"stage": "eval", "eval/reward_mean": summary.reward_mean, **rollout.reward_metrics(summary, "eval/"),
           "eval/response_len/mean": float(out.lengths_N.mean())}
    if run_.golden is not None:
        golden_scored = rollout_and_score(run_, state.params, distributed.process_block(run_.golden.questions),
                                          run_.settings.eval_rollout, key).scored
        row.update(run_.golden.metrics(golden_scored, functools.partial(_score_own_block, run_.reward),
                                       key=jax.random.fold_in(key, _GOLDEN_REFERENCE_KEY), weights=run_.weights,
                                       store=run_.judge_store))
    if run_.audit is not None:
        row.update(run_.audit(step, out.samples, [run_.rubric_of[q.id] for q in run_.eval_questions], out.scored,
                              jax.random.fold_in(key, _AUDIT_KEY), run_.log.rows()))
    row = run_.watch.observe(step, row)
    run_.log.write(step, row)
    run_.log.write_samples(step, [{"stage": "eval", **s} for s in out.samples[:EVAL_SAMPLES]])
    return {k: v for k, v in row.items() if k != "stage"}


def _score_own_block(reward: RubricReward, questions: Sequence[str], responses: Sequence[str],
                     rubrics: Sequence[Rubric], **kwargs: Any) -> RewardOutput:
    """`reward` of all rows, each process scoring its own block of them (every process must call it)."""
    start, stop = distributed.block_bounds(len(responses))
    return gather_outputs(reward(questions[start:stop], responses[start:stop], rubrics[start:stop], **kwargs))


def grpo_components(run_: Run, init_params: Any) -> tuple[train_state.TrainState, train_state.TrainState,
                                                         run_programs.GRPOPrograms]:
    """Step-0 GRPO state around `init_params`, its shardings, and the programs `grpo_iteration` runs."""
    rl = run_.config.rl
    state, shardings = _state_and_shardings(run_, init_params, run_programs.grpo_optimizer(rl))
    return state, shardings, run_programs.grpo_programs(rl, run_.graphdef, shardings, run_.mesh, run_.settings.grpo)


def run_grpo(run_: Run, init_params: Any) -> dict[str, Any]:
    """GRPO from `init_params` (the SFT result) through the stage runner: the KL reference and the SFT
    baseline eval before the first step, evals every `eval.every_steps`, the NaN-streak stop; returns the
    final params."""
    rl, settings = run_.config.rl, run_.settings
    state, shardings, programs = grpo_components(run_, init_params)
    nan_streak = NanStreak(rl.max_nan_streak)
    lr_drop = oscillation.LearningRateDrop(settings.oscillation) if settings.oscillation is not None else None
    ref_params = None
    baseline = None

    def on_start(restored, state, start, progress) -> None:
        nonlocal ref_params, baseline
        if restored is not None and run_.dynamic_weights is not None:
            run_.dynamic_weights.load_json(restored.extra["dynamic_weights"])
        if restored is not None:
            run_.watch.load_scores_json(restored.extra.get("redundancy_window", []))
        iterator_state = data.IteratorState.from_dict(restored.data_state) if restored else data.IteratorState(
            seed=run_.config.seed)
        ref_params = load_reference(run_, state, iterator_state).params if rl.beta > 0 else None
        if lr_drop is not None:
            lr_drop.restore(run_.log.rows(), float(train_state.lr_factor(state.opt_state)))
        if start == 0:
            row = evaluate(run_, state, 0)
            baseline = row["eval/reward_mean"]
            progress.write(metrics.format_eval_summary(0, row, reward_key="eval/reward_mean"))
        else:  # logged before the restart (every process reads it: process 0 wrote it)
            baseline = next(r["eval/reward_mean"] for r in run_.log.rows() if r.get("stage") == "eval" and r["step"] == 0)

    def eval_and_report(step, state, progress) -> float:
        row = evaluate(run_, state, step)
        progress.write(metrics.format_eval_summary(step, row, baseline, reward_key="eval/reward_mean"))
        return row["eval/reward_mean"]

    def stop_on_nan_streak(step, row, ckpt) -> None:
        nan_streak.record(row["skipped"], step, f"{ckpt.directory} step {ckpt.latest_step()}")

    def checkpoint_extra() -> dict[str, Any]:
        weights = {} if run_.dynamic_weights is None else {"dynamic_weights": run_.dynamic_weights.to_json()}
        return {"updates_per_batch": settings.updates_per_batch, **weights,
                "redundancy_window": run_.watch.scores_to_json()}

    def grpo_step(state, questions, step, draw):
        if lr_drop is not None:  # rl.lr_on_oscillation: the factor the logged rewards decide for this update
            state = state.replace(opt_state=lr_drop.before_step(state.opt_state, step))
        return grpo_iteration(run_, programs, state, ref_params, questions, jax.random.fold_in(run_.key, 1000 + step),
                              draw)

    def observe(step, row):
        return run_.watch.observe(step, row if lr_drop is None else lr_drop.observe(step, row))

    stage = Stage(
        "grpo", rl.steps, run_.train_questions, rl.questions_per_step, state, shardings, grpo_step,
        updates_per_step=settings.updates_per_batch, checkpoint_extra=checkpoint_extra, on_start=on_start,
        observe=observe, after_row=stop_on_nan_streak,
        eval_due=lambda step: step % settings.eval_every == 0 or step == rl.steps, evaluate=eval_and_report,
        keep_best=run_.config.checkpoint.keep_best)
    return run_stage(run_, stage).params


# ------------------------------------------------------------------------------------------ the end
def report_best(run_: Run) -> None:
    """Names the best-evaluated GRPO checkpoint, as QuRL reports it: one line next to the final and the
    SFT-baseline eval reward, and BEST_FILE (JSON) in the workdir (process 0; every process must call it:
    opening the checkpoints is collective)."""
    try:
        best = runs.select_checkpoint(run_.workdir, run_.config, "best")
    except runs.RunError as e:  # no kept checkpoint has an eval (checkpoint.keep_best off, evals rotated out)
        if distributed.is_writer():
            print(f"no best checkpoint to report: {e}")
        return
    if not distributed.is_writer():
        return
    evals = {r["step"]: r[runs.BEST_BY] for r in run_.log.rows() if r.get("stage") == "eval" and runs.BEST_BY in r}
    final_step = max(evals)
    report = {"stage": best.stage, "step": best.step // run_.settings.updates_per_batch,
              "checkpoint": str(Path("checkpoints") / best.stage / str(best.step)), runs.BEST_BY: best.eval_reward,
              "final_step": final_step, "final_eval_reward": evals[final_step], "baseline_eval_reward": evals.get(0)}
    files.write_atomic(run_.workdir / BEST_FILE, json.dumps(report, indent=2))
    baseline = "" if evals.get(0) is None else f", SFT baseline {evals[0]:.4f}"
    which = "best eval reward" if run_.config.checkpoint.keep_best else "best eval reward of the kept checkpoints"
    print(f"{which} {best.eval_reward:.4f} at step {report['step']} ({report['checkpoint']}); "
          f"final {evals[final_step]:.4f} at step {final_step}{baseline}")


def export_at_end(run_: Run, final_params: dict[str, Any]) -> None:
    """config.export.at_end: the final policy, or (export.which='best') the best-evaluated checkpoint's
    params restored into the training layout, as a HF directory in <workdir>/export."""
    weights = run_.policy(final_params)
    if run_.config.export.which == "best":
        best = runs.select_checkpoint(run_.workdir, run_.config, "best")
        weights = runs.restore_run_params(run_.workdir, run_.config, best, run_.layout)
    export.export_policy(weights, run_.config, run_.workdir / EXPORT_DIR, replace=True)


def _json_float(x: float) -> float | None:
    return None if np.isnan(x) else float(x)

"""The experiment pipeline behind `experiments.run`: build everything from a config, then run the stages.

Stages (config.stages): "sft" (cold-start SFT on formatted answers, QuRL) then "grpo" (rollouts ->
rubric reward -> group advantages -> jitted sharded update), with held-out evals before the first GRPO
update (the SFT baseline), every `eval.every_steps` steps and at the end. Every GRPO step also writes
the reward-hacking monitors (train/monitors.py: alerts.jsonl) and every eval scores the golden set
(train/golden.py).

Reliability: every stage checkpoints (orbax) params, optimizer state, step, PRNG key, data-iterator
position and the rubric hash; a restart with the same workdir resumes from the latest checkpoint and
first drops metrics/sample rows written after it, so a killed-and-restarted run writes exactly what an
uninterrupted run writes. SIGTERM finishes the current step, saves and exits cleanly. A non-finite
loss or gradient skips the update (train/step.py); `rl.max_nan_streak` skips in a row stop the run.
Per-step randomness is `fold_in(key, step)`, so a resumed step samples exactly what it would have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from rubric_jax import data, grpo, loader, metrics, plots, sampling, sharding
from rubric_jax.judges.llm_judge import JudgeConfig, load_judge
from rubric_jax.judges.reward import RewardOutput, RubricReward
from rubric_jax.judges.reward_model import RewardModelConfig, RewardModelReward, load_reward_model
from rubric_jax.models.checkpoint import CheckpointError, load_tokenizer
from rubric_jax.models.config import ModelConfig
from rubric_jax.rubrics.dynamic_weights import (DynamicWeightsConfig, DynamicWeightsState, init_dynamic_weights,
                                                update_dynamic_weights_jit)
from rubric_jax.rubrics.correction import Correction, load_correction
from rubric_jax.rubrics.io import dumps_rubric, load_rubric
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.train import checkpointing, golden as golden_set, monitors, rollout
from rubric_jax.train import state as train_state, step as train_step

STAGES = ("sft", "grpo")
REWARD_SOURCES = ("rubric", "reward_model")  # config.reward.source
ROLLOUT_DTYPES = ("compute", "float32", "bfloat16")  # mesh.rollout.param_dtype
_STAGE_ORDER = {"sft": 0, "grpo": 1, "eval": 1}
EVAL_SAMPLES = 4  # eval responses written to samples.jsonl per eval
_EVAL_KEY = 2**31 - 1  # fold_in data of the eval sampling key (GRPO step keys are 1000 + step)


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many non-finite updates in a row); the message says what to do."""


@dataclasses.dataclass
class DimensionWeights:
    """Dynamic dimension weights (RubricRL §2.3, off by default) over every dimension id of the run."""

    ids: list[str]
    state: DynamicWeightsState

    @classmethod
    def for_rubrics(cls, rubrics: list[Rubric], window: int) -> DimensionWeights:
        """Starts at each dimension's rubric weight; gates never move."""
        first = {}
        for rubric in rubrics:
            for dim in rubric.dimensions:
                first.setdefault(dim.id, dim)
        ids = list(first)
        weights = np.asarray([first[d].weight for d in ids], np.float32)
        adjustable = np.asarray([not first[d].gate for d in ids])
        return cls(ids, init_dynamic_weights(weights, window, adjustable))

    def current(self) -> dict[str, float]:
        return dict(zip(self.ids, np.asarray(self.state.weights_D).tolist()))

    def update(self, scored: RewardOutput) -> dict[str, float]:
        """Feeds one step's normalised scores to the variance window; returns the new weights to log."""
        n = len(scored.reward)
        column = {d: c for c, d in enumerate(scored.dimension_ids)}
        scores = np.full((n, len(self.ids)), np.nan, np.float32)
        valid = np.zeros((n, len(self.ids)), bool)
        for j, d in enumerate(self.ids):
            if d in column:
                scores[:, j], valid[:, j] = scored.scores[:, column[d]], scored.valid[:, column[d]]
        self.state, info = update_dynamic_weights_jit(self.state, scores, valid, DynamicWeightsConfig(enabled=True))
        return {f"weight/{d}": float(w) for d, w in zip(self.ids, np.asarray(info["weights"]))}

    def to_json(self) -> dict[str, Any]:
        return {f.name: np.asarray(getattr(self.state, f.name)).tolist() for f in dataclasses.fields(self.state)}

    def load_json(self, saved: dict[str, Any]) -> None:
        self.state = DynamicWeightsState(**{k: jnp.asarray(np.asarray(v, dtype=np.asarray(getattr(self.state, k)).dtype))
                                            for k, v in saved.items()})


@dataclasses.dataclass
class Run:
    """What the stages share: the built pieces of one experiment (no maths here)."""

    config: ml_collections.ConfigDict
    workdir: Path
    layout: sharding.Layout  # training layout (FSDP/TP): policy, reference, optimizer state, batches
    decode_layout: sharding.Layout  # rollouts and judges (mesh.rollout), over the same devices
    decode_dtype: str  # the policy's parameter dtype while decoding (mesh.rollout.param_dtype resolved)
    tokenizer: Any
    model_cfg: ModelConfig
    graphdef: nnx.GraphDef  # the policy's (and reference's) module structure in the training layout
    reward: RubricReward | RewardModelReward  # config.reward.source
    rubric_of: dict[str, Rubric]  # question id -> its rubric (shared, or case-wise R*(q))
    rubric_hash: str
    train_questions: list[data.Question]
    eval_questions: list[data.Question]
    writer: metrics.MetricsWriter
    key: jax.Array
    dynamic_weights: DimensionWeights | None
    golden: golden_set.GoldenSet | None  # config.data.golden, scored at every eval
    watch: monitors.Watch  # reward-hacking monitors' thresholds and alerts.jsonl
    stop_requested: bool = False

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
    """The policy in the decode layout and dtype, resharded from the training layout once per rollout
    (the sampler only reads it; nothing is resharded back)."""
    return loader.to_layout(run_.policy(params), run_.decode_layout, param_dtype=run_.decode_dtype)


# ------------------------------------------------------------------------------------------- set-up
def run(config: ml_collections.ConfigDict, workdir: str | Path) -> None:
    """Runs (or resumes) every configured stage and writes plots; see the module docstring."""
    unknown = sorted(set(config.stages) - set(STAGES))
    if unknown:
        raise ValueError(f"config.stages: unknown stage(s) {unknown}; expected a subset of {STAGES}")
    if "grpo" in config.stages:
        grpo_config(config.rl)  # the GRPO settings fail here, before SFT runs
        monitors.thresholds(config.monitor)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    _write_config(config, workdir)
    _drop_rows_after(workdir, _resume_position(config, workdir))
    experiment = build(config, workdir)
    with _sigterm_requests_stop(experiment), experiment.writer:
        params = initial_params(experiment)
        if "sft" in config.stages:
            params = run_sft(experiment, params)
        if "grpo" in config.stages and not experiment.stop_requested:
            run_grpo(experiment, params)
    plots.plot_run(workdir)
    if not experiment.stop_requested:
        metrics.mark_done(workdir, config)  # done.json: a sweep skips this run when its config is unchanged


def _write_config(config: ml_collections.ConfigDict, workdir: Path) -> None:
    """config.json holds the resolved config; a resumed run with other values keeps the old one aside."""
    path = workdir / "config.json"
    text = config.to_json_best_effort(indent=2, sort_keys=True)
    if path.exists() and path.read_text() != text:
        path.rename(workdir / "config.previous.json")
        print(f"{path}: the config changed since the last start; the old one is now config.previous.json")
    path.write_text(text)


def _existing_dir(value: str, key: str, what: str) -> str:
    """`value` if it names a directory; else one line naming the config key that sets it."""
    if not Path(value).is_dir():
        raise CheckpointError(f"config.{key}={value}: {what} directory does not exist; set --config.{key}=DIR "
                              "(a local directory: nothing is downloaded)")
    return value


def _layouts(config: ml_collections.ConfigDict, model_cfg: ModelConfig) -> tuple[sharding.Layout, sharding.Layout, str]:
    """The training layout, the decode layout over the same devices, and the decode parameter dtype."""
    layout = sharding.Layout(sharding.make_mesh(
        sharding.MeshConfig(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)))
    rollout = config.mesh.rollout
    try:
        decode = sharding.decode_layout(layout.mesh, rollout.tensor)
    except ValueError as e:
        raise ValueError(f"config.mesh.rollout.tensor={rollout.tensor!r}: {e}") from None
    for field, heads in (("num_heads", model_cfg.num_heads), ("num_kv_heads", model_cfg.num_kv_heads)):
        if heads % rollout.tensor:
            raise ValueError(f"config.mesh.rollout.tensor={rollout.tensor} does not divide the model's {field} "
                             f"({heads}): those weights would be replicated on every device; pick a divisor")
    if rollout.param_dtype not in ROLLOUT_DTYPES:
        raise ValueError(f"config.mesh.rollout.param_dtype={rollout.param_dtype!r}: expected one of {ROLLOUT_DTYPES}")
    dtype = model_cfg.compute_dtype if rollout.param_dtype == "compute" else rollout.param_dtype
    return layout, decode, dtype


def build(config: ml_collections.ConfigDict, workdir: Path) -> Run:
    """Layouts, tokenizer, model shape, rubric, reward, datasets and writers from the config."""
    workdir.mkdir(parents=True, exist_ok=True)
    reward_model_settings = reward_model_config(config)
    model_dir = config.model.checkpoint and _existing_dir(config.model.checkpoint, "model.checkpoint", "model")
    if not (config.model.tokenizer or model_dir):
        raise ValueError("config.model.tokenizer (or config.model.checkpoint) must name a tokenizer directory")
    tokenizer_key = "model.tokenizer" if config.model.tokenizer else "model.checkpoint"
    tokenizer_dir = _existing_dir(config.model.tokenizer or model_dir, tokenizer_key, "tokenizer")
    judge_dirs = [_existing_dir(path.strip(), "judge.checkpoint", "judge")
                  for path in config.judge.checkpoint.split(",") if path.strip()]
    judge_dtypes = dict(param_dtype=config.judge.param_dtype, compute_dtype=config.judge.compute_dtype)
    for field, value in judge_dtypes.items():
        loader.resolve_dtype(value, f"config.judge.{field}")
    model_cfg = model_config(config)
    layout, decode_layout, decode_dtype = _layouts(config, model_cfg)
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
    except CheckpointError as e:
        raise CheckpointError(f"config.{tokenizer_key}: {e}") from e
    graphdef = loader.abstract_weights(model_cfg, layout).graphdef

    shared_rubric = load_rubric(config.data.rubric)
    train_questions = data.load_question_set(config.data.train, config.data.tfds_dir, "train")
    eval_questions = data.load_question_set(config.data.eval, config.data.tfds_dir, "eval")[: config.eval.max_questions]
    judges = tuple(load_judge(path, layout=decode_layout, **judge_dtypes, sampler=config.judge.sampler,
                              max_new_tokens=config.judge.max_new_tokens) for path in judge_dirs)
    golden = golden_set.load_golden(config.data.golden, config.data.tfds_dir, shared_rubric, train_questions,
                                    eval_questions, config.data.golden_max_jaccard) if config.data.golden else None
    rubric_of = {q.id: data.question_rubric(shared_rubric, q) for q in train_questions + eval_questions}
    rubric_of.update({q.id: r for q, r in zip(golden.questions, golden.rubrics)} if golden else {})
    rubrics = list(rubric_of.values())
    correction = load_correction(config.data.rubric_correction) if config.data.rubric_correction else None
    if reward_model_settings is None:
        reward = RubricReward(rubrics, judges, JudgeConfig(
            mode={"per_dimension": "single", "all_criteria": "multi"}[config.judge.mode],
            num_samples=config.judge.samples, max_retries=config.judge.max_retries, ensemble=config.judge.ensemble,
            shuffle_anchors=config.judge.shuffle_anchors), correction=correction)
    else:
        dtype = config.reward.model_dtype
        reward = RewardModelReward(load_reward_model(config.reward.model_checkpoint, layout=decode_layout,
                                                     param_dtype=dtype, compute_dtype=dtype), reward_model_settings)
    rubric_hash = _rubric_set_hash(shared_rubric, rubrics, correction)
    (workdir / "rubric.yaml").write_text(dumps_rubric(shared_rubric, "yaml"))
    rubric_info = {"name": shared_rubric.name, "version": shared_rubric.version,
                   "content_hash": shared_rubric.content_hash, "rubric_set_hash": rubric_hash,
                   "correction_hash": correction.content_hash if correction is not None else None}
    (workdir / "rubric.json").write_text(json.dumps(rubric_info, indent=2))
    dynamic = DimensionWeights.for_rubrics(rubrics, config.rl.dynamic_weights_window) if config.rl.dynamic_weights else None
    writer = metrics.MetricsWriter(workdir, run_info={"rubric": rubric_info, "config": config.to_dict()})
    return Run(config, workdir, layout, decode_layout, decode_dtype, tokenizer, model_cfg, graphdef, reward, rubric_of,
               rubric_hash, train_questions, eval_questions, writer, jax.random.key(config.seed), dynamic, golden,
               monitors.Watch(monitors.thresholds(config.monitor), workdir))


def reward_model_config(config: ml_collections.ConfigDict) -> RewardModelConfig | None:
    """`config.reward` checked before anything loads: None when rubrics score the rollouts, else the reward
    model's settings. A key that the chosen source would ignore is an error, not a silent no-op."""
    r = config.reward
    if r.source not in REWARD_SOURCES:
        raise ValueError(f"config.reward.source={r.source!r}: expected one of {REWARD_SOURCES}")
    if r.source == "rubric":
        if r.model_checkpoint:
            raise ValueError("config.reward.model_checkpoint is set but config.reward.source='rubric' never reads "
                             "it; add --config.reward.source=reward_model or drop the checkpoint")
        return None
    if not r.model_checkpoint:
        raise ValueError("config.reward.source='reward_model' needs config.reward.model_checkpoint=DIR (a local "
                         "HF *ForSequenceClassification directory with one label)")
    if config.judge.checkpoint:
        raise ValueError("config.judge.checkpoint is set but config.reward.source='reward_model' scores with the "
                         "reward model alone; drop the judge")
    if config.rl.dynamic_weights:
        raise ValueError("config.rl.dynamic_weights re-weights rubric dimensions; a reward model has none")
    if config.data.rubric_correction:
        raise ValueError("config.data.rubric_correction corrects judge scores; a reward model has none")
    if r.model_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"config.reward.model_dtype={r.model_dtype!r}: expected 'float32' or 'bfloat16'")
    return RewardModelConfig(max_len=r.model_max_len, batch_size=r.model_batch_size, center=r.model_center,
                             scale=r.model_scale)


def _model_overrides(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The ModelConfig fields the experiment config sets on top of the HF config.json."""
    return dict(param_dtype=config.model.param_dtype, compute_dtype=config.model.compute_dtype,
                remat=config.model.remat, scan_layers=config.model.scan_layers)


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """The policy's ModelConfig: the checkpoint's config.json (or `config_json` for a random init) plus overrides."""
    overrides = _model_overrides(config)
    if config.model.checkpoint:
        return ModelConfig.from_hf_dir(config.model.checkpoint, **overrides)
    if not config.model.config_json:
        raise ValueError("config.model: give `checkpoint` (a HF directory) or `config_json` (for a random init)")
    return ModelConfig.from_hf_dict(json.loads(Path(config.model.config_json).read_text()), **overrides)


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
        return loader.load_weights(run_.config.model.checkpoint, run_.layout, **_model_overrides(run_.config)).params
    param_key = jax.random.split(jax.random.fold_in(run_.key, 0))[0]  # the init key runs have always used
    return loader.init_weights(run_.model_cfg, run_.layout, param_key).params


def _state_from_params(run_: Run, params: Any, tx: Any, key: jax.Array) -> train_state.TrainState:
    """A step-0 TrainState around existing params, its optimizer state created directly in its shardings."""
    return train_state.new_train_state(run_.policy(params), tx, key, run_.mesh)[0]


def load_reference(run_: Run, state: train_state.TrainState, iterator_state: data.IteratorState) -> loader.Weights:
    """The frozen KL reference: the policy GRPO started from, saved once (step 0) so that a resumed run
    keeps it, and read back (params only) through the loader into the training layout."""
    with _checkpointer(run_, "reference") as ref_ckpt:
        if ref_ckpt.latest_step() is None:
            ref_ckpt.save(state, data_state=iterator_state.to_dict(), rubric_hash=run_.rubric_hash)
        return ref_ckpt.restore_params(run_.model_cfg, run_.layout, step=0)


def _optimizer_config(stage_cfg: ml_collections.ConfigDict, total_steps: int | None = None
                      ) -> train_state.OptimizerConfig:
    """AdamW settings of one stage (sft and rl blocks carry the same optimizer fields)."""
    return train_state.OptimizerConfig(
        learning_rate=stage_cfg.lr, warmup_steps=stage_cfg.warmup_steps, schedule=stage_cfg.schedule,
        total_steps=total_steps if stage_cfg.schedule == "cosine" else None,
        weight_decay=stage_cfg.weight_decay, max_grad_norm=stage_cfg.grad_clip)


def length_buckets(max_len: int, count: int) -> tuple[int, ...]:
    """`count` power-of-two widths ending at the first power of two >= max_len (each new width compiles
    the step functions once more: 1 bucket = always pad to the maximum)."""
    if count < 1:
        raise ValueError(f"config.data.length_buckets must be >= 1, got {count}")
    top = 1 << (max(max_len, 1) - 1).bit_length()
    return data.power_of_two_buckets(max(top >> (count - 1), min(8, top)), top)


# ------------------------------------------------------------------------------------- checkpoints
def _checkpointer(run_: Run, stage: str) -> checkpointing.Checkpointer:
    return checkpointing.Checkpointer(run_.workdir / "checkpoints" / stage, max_to_keep=run_.config.checkpoint.keep)


def _restore(run_: Run, ckpt: checkpointing.Checkpointer, state: train_state.TrainState,
             shardings: train_state.TrainState) -> checkpointing.Restored | None:
    """The latest checkpoint in `ckpt` (None if there is none); one trained under another rubric set is refused."""
    if ckpt.latest_step() is None:
        return None
    restored = ckpt.restore(checkpointing.abstract_with_shardings(state, shardings),
                            expected_rubric_hash=run_.rubric_hash)
    print(f"resuming from {ckpt.directory} step {int(restored.state.step)}")
    return restored


def _resume_position(config: ml_collections.ConfigDict, workdir: Path) -> tuple[int, int]:
    """(stage order, log step) of the newest checkpoint in the workdir; (-1, -1) for a fresh start."""
    for stage in reversed(STAGES):
        directory = workdir / "checkpoints" / stage
        if directory.is_dir():
            with checkpointing.Checkpointer(directory, max_to_keep=config.checkpoint.keep) as ckpt:
                step = ckpt.latest_step()
            if step is not None:
                per_row = config.rl.updates_per_batch if stage == "grpo" else 1
                return _STAGE_ORDER[stage], step // per_row
    return -1, -1


def _drop_rows_after(workdir: Path, limit: tuple[int, int]) -> None:
    """Removes metrics/sample rows a killed run wrote after the checkpoint it resumes from."""
    for name in (metrics.METRICS_FILE, metrics.SAMPLES_FILE, monitors.ALERTS_FILE):
        path = workdir / name
        if not path.exists():
            continue
        kept = [line for line in path.read_text(encoding="utf-8").splitlines(keepends=True)
                if _row_position(json.loads(line)) <= limit]
        path.write_text("".join(kept), encoding="utf-8")


def _row_position(row: dict[str, Any]) -> tuple[int, int]:
    """(stage order, step) of a log row; run_info rows sort first."""
    if "stage" not in row:
        return (-1, -1)
    return (_STAGE_ORDER[row["stage"]], row["step"])


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


# --------------------------------------------------------------------------------------------- SFT
def run_sft(run_: Run, init_params: dict[str, Any]) -> dict[str, Any]:
    """Cold-start SFT (QuRL): masked NLL on formatted responses for `sft.epochs` epochs; returns the params."""
    cfg = run_.config
    examples = data.load_sft(cfg.data.sft)
    total = cfg.sft.epochs * -(-len(examples) // cfg.sft.batch_size)
    tx = train_state.make_optimizer(_optimizer_config(cfg.sft, total))
    state = _state_from_params(run_, init_params, tx, jax.random.fold_in(run_.key, 0))
    shardings = _shardings_of(run_, state)
    ckpt = _checkpointer(run_, "sft")
    iterator_state = data.IteratorState(seed=cfg.seed)
    restored = _restore(run_, ckpt, state, shardings)
    if restored is not None:
        state, iterator_state = restored.state, data.IteratorState.from_dict(restored.data_state)
    step_fn = train_step.jit_sft_step(shardings=shardings, mesh=run_.mesh)
    batches = data.BatchIterator(examples, cfg.sft.batch_size, iterator_state)
    prompt_buckets = length_buckets(cfg.data.max_prompt_len, cfg.data.length_buckets)
    response_buckets = length_buckets(cfg.sft.max_response_len, cfg.data.length_buckets)
    start = int(state.step)
    progress = metrics.Progress(total, initial=start, desc="sft", keys=("loss", "grad_norm"))
    for step in range(start + 1, total + 1):
        batch = data.sft_batch(run_.tokenizer, next(batches), prompt_buckets, response_buckets)
        state, step_metrics = step_fn(state, {"tokens": batch.tokens_BxT, "input_mask": batch.input_mask_BxT,
                                              "loss_mask": batch.loss_mask_BxT})
        row = {"stage": "sft", **_host(step_metrics)}
        run_.writer.write(step, row)
        progress.update(step, row)
        if step % cfg.checkpoint.every_steps == 0 or step == total or run_.stop_requested:
            ckpt.save(state, data_state=batches.state.to_dict(), rubric_hash=run_.rubric_hash)
        if run_.stop_requested:
            break
    progress.close()
    ckpt.close()
    return state.params


def _shardings_of(run_: Run, state: train_state.TrainState) -> train_state.TrainState:
    return train_state.state_shardings(loader.expected_shardings(run_.model_cfg, run_.layout),
                                       jax.eval_shape(lambda s: s, state), run_.mesh)


def _host(tree: dict[str, jax.Array]) -> dict[str, float]:
    return {k: float(v) for k, v in jax.device_get(tree).items()}


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



def grpo_config(rl: ml_collections.ConfigDict) -> grpo.GRPOConfig:
    """The objective's settings from the config's rl block, validated with the rest of the rl block's
    GRPO choices (rollout sampler, missing_scores); `run` calls it at start-up, before SFT."""
    if rl.missing_scores not in rollout.MISSING_SCORES:
        raise ValueError(f"config.rl.missing_scores={rl.missing_scores!r}: must be one of {rollout.MISSING_SCORES}")
    norm_length = rl.max_new_tokens if rl.loss_aggregation == "seq_mean_token_sum_norm" else None
    return grpo.GRPOConfig(group_size=rl.group_size, kl_coef=rl.beta, kl_estimator=rl.kl_estimator,
                           clip_low=rl.clip_low, clip_high=rl.clip_high, advantage_scaling=rl.advantage_scaling,
                           advantage_eps=rl.advantage_eps, loss_aggregation=rl.loss_aggregation,
                           loss_norm_length=norm_length, temperature=rollout.rollout_temperature(rl.sampler))


@dataclasses.dataclass(frozen=True)
class GRPOPrograms:
    """What every GRPO iteration runs, built once by `grpo_components`: the objective's settings, the
    jitted update `(state, batch) -> (state, metrics)` and the jitted teacher-forced log-probs
    `(params, tokens, input_mask) -> [N, T]` at the rollout temperature, both in the run's shardings."""

    cfg: grpo.GRPOConfig
    update: Callable[[train_state.TrainState, dict[str, jax.Array]], tuple[train_state.TrainState, dict]]
    logprobs: Callable[[Any, jax.Array, jax.Array], jax.Array]


def rollout_and_score(run_: Run, params: Any, questions: list[data.Question], *,
                      n: int, sampler: str, key: jax.Array):
    """Samples n responses per question with the policy and scores them with their rubrics."""
    sample_key, judge_key = jax.random.split(key)
    prompt_ids, prompt_mask = data.prompt_batch(
        run_.tokenizer, [q.question for q in questions],
        length_buckets(run_.config.data.max_prompt_len, run_.config.data.length_buckets))
    result = sampling.generate(rollout_weights(run_, params), prompt_ids, prompt_mask=prompt_mask, key=sample_key,
                               n=n, max_new_tokens=run_.config.rl.max_new_tokens, sampler=sampler,
                               stop_tokens=run_.stop_tokens, pad_id=run_.tokenizer.pad_token_id,
                               layout=run_.decode_layout)
    responses = rollout.decode_responses(run_.tokenizer, result, run_.stop_tokens)
    expanded = [q for q in questions for _ in range(n)]
    scored = run_.reward([q.question for q in expanded], responses, [run_.rubric_of[q.id] for q in expanded],
                         key=judge_key, weights=run_.weights)
    samples = [{"question": expanded[i].question, "response": responses[i], "reward": float(scored.reward[i]),
                "scores": {d: _json_float(scored.scores[i, c]) for c, d in enumerate(scored.dimension_ids)}}
               for i in range(len(responses))]
    return (prompt_ids, prompt_mask), result, scored, samples


def rollout_logprobs(programs: GRPOPrograms, batch: dict[str, jax.Array], policy_params: Any,
                     ref_params: Any | None, recompute_old: bool) -> tuple[dict[str, jax.Array], jax.Array | None]:
    """The batch with its rollout log-probs, computed once per rollout and outside the gradient: the
    reference's `ref_logp` exactly when β > 0 and, with `recompute_old`, `old_logp` recomputed
    teacher-forced from the params that sampled. Returns it and, when recomputed, the mean
    |recomputed − sampler| log-prob gap over the response tokens (else None)."""
    if (ref_params is None) != (programs.cfg.kl_coef == 0):
        raise ValueError(f"ref_params must be given iff rl.beta > 0 (beta={programs.cfg.kl_coef})")
    batch = dict(batch)
    if ref_params is not None:
        batch[train_step.REF_LOGP] = programs.logprobs(ref_params, batch["tokens"], batch["input_mask"])
    gap = None
    if recompute_old:
        old_logp = programs.logprobs(policy_params, batch["tokens"], batch["input_mask"])
        gap = grpo.logprob_gap(old_logp, batch["old_logp"], batch["loss_mask"])
        batch["old_logp"] = old_logp
    return batch, gap


def grpo_iteration(run_: Run, programs: GRPOPrograms, state: train_state.TrainState, ref_params: Any | None,
                   questions: list[data.Question], key: jax.Array
                   ) -> tuple[train_state.TrainState, dict[str, float], list[dict[str, Any]]]:
    """One GRPO step: rollouts -> rubric reward -> group advantages -> rollout log-probs (reference;
    behaviour if `rl.recompute_old_logprobs`, else the sampler's) -> `rl.updates_per_batch` updates.

    `logprob_gap/mean` is the mean |teacher-forced − sampler| log-prob of the response tokens under the
    params that sampled (the first update's, or the recomputation's): float error on CPU float32, the
    decode drift to watch on accelerators in bf16.
    """
    rl = run_.config.rl
    cfg = programs.cfg
    (prompt_ids, prompt_mask), result, scored, samples = rollout_and_score(
        run_, state.params, questions, n=cfg.group_size, sampler=rl.sampler, key=key)
    advantages_N, valid_N, zero_std = rollout.rollout_advantages(scored, cfg, rl.missing_scores)
    batch = rollout.training_batch(prompt_ids, prompt_mask, result, cfg.group_size, advantages_N, valid_N,
                                   length_buckets(rl.max_new_tokens, run_.config.data.length_buckets))
    batch = jax.device_put(batch, sharding.batch_sharding(run_.mesh))
    batch, recomputed_gap = rollout_logprobs(programs, batch, state.params, ref_params, rl.recompute_old_logprobs)
    updates = []
    for _ in range(rl.updates_per_batch):
        state, update_metrics = programs.update(state, batch)
        updates.append(update_metrics)
    updates, recomputed_gap = jax.device_get((updates, recomputed_gap))
    row = {k: float(np.mean([u[k] for u in updates])) for k in updates[0]}
    row["logprob_gap/mean"] = float(updates[0]["abs_log_ratio"] if recomputed_gap is None else recomputed_gap)
    summary = rollout.summarize_rewards(scored)
    row.update({"reward/mean": summary.reward_mean, **rollout.reward_metrics(summary, ""),
                "zero_std_frac": zero_std, "response_len/mean": float(result.lengths.mean()),
                "truncated_frac": float((result.finish_reason == sampling.FINISH_LENGTH).mean())})
    row.update(monitors.step_monitors([s["response"] for s in samples], result.lengths, scored))
    if run_.dynamic_weights is not None:
        row.update(run_.dynamic_weights.update(scored))
    return state, row, samples[: run_.config.log.samples_per_step]


def evaluate(run_: Run, state: train_state.TrainState, step: int) -> dict[str, float]:
    """Held-out rubric reward of one response per eval (and golden) question with the eval sampler (greedy
    by default); alerts on the golden set's agreement."""
    key = jax.random.fold_in(run_.key, _EVAL_KEY)
    _, result, scored, samples = rollout_and_score(run_, state.params, run_.eval_questions, n=1,
                                                   sampler=run_.config.eval.sampler, key=key)
    summary = rollout.summarize_rewards(scored)
    row = {"stage": "eval", "eval/reward_mean": summary.reward_mean, **rollout.reward_metrics(summary, "eval/"),
           "eval/response_len/mean": float(result.lengths.mean())}
    if run_.golden is not None:
        golden_scored = rollout_and_score(run_, state.params, run_.golden.questions, n=1,
                                          sampler=run_.config.eval.sampler, key=key)[2]
        row.update(run_.golden.metrics(golden_scored, run_.reward, key=jax.random.fold_in(key, step),
                                       weights=run_.weights))
    row = run_.watch.observe(step, row)
    run_.writer.write(step, row)
    run_.writer.write_samples(step, [{"stage": "eval", **s} for s in samples[:EVAL_SAMPLES]])
    return {k: v for k, v in row.items() if k != "stage"}


def grpo_components(run_: Run, init_params: Any) -> tuple[train_state.TrainState, train_state.TrainState,
                                                         GRPOPrograms]:
    """Step-0 GRPO state around `init_params`, its shardings, and the programs `grpo_iteration` runs."""
    rl = run_.config.rl
    shards = run_.mesh.shape["data"] * run_.mesh.shape["fsdp"] * rl.micro_batches
    if (rl.questions_per_step * rl.group_size) % shards:
        raise ValueError(
            f"config.rl: questions_per_step * group_size = {rl.questions_per_step * rl.group_size} rollouts must "
            f"divide into micro_batches ({rl.micro_batches}) x mesh data*fsdp ({shards // rl.micro_batches})")
    cfg = grpo_config(rl)
    tx = train_state.make_optimizer(_optimizer_config(rl, rl.steps * rl.updates_per_batch))
    state = _state_from_params(run_, init_params, tx, jax.random.fold_in(run_.key, 1))
    shardings = _shardings_of(run_, state)
    update = train_step.jit_grpo_step(cfg, micro_batches=rl.micro_batches, shardings=shardings, mesh=run_.mesh)
    logprobs = train_step.jit_sequence_logprobs(
        run_.graphdef, temperature=cfg.temperature, chunk_size=cfg.logprob_chunk_size, micro_batches=rl.micro_batches,
        param_shardings=shardings.params, mesh=run_.mesh)
    return state, shardings, GRPOPrograms(cfg, update, logprobs)


def run_grpo(run_: Run, init_params: Any) -> None:
    """GRPO from `init_params` (the SFT result): evals, checkpoints, SIGTERM and NaN-streak handling."""
    cfg = run_.config
    rl = cfg.rl
    state, shardings, programs = grpo_components(run_, init_params)
    ckpt = _checkpointer(run_, "grpo")
    iterator_state = data.IteratorState(seed=cfg.seed)
    restored = _restore(run_, ckpt, state, shardings)
    if restored is not None:
        state, iterator_state = restored.state, data.IteratorState.from_dict(restored.data_state)
        if run_.dynamic_weights is not None:
            run_.dynamic_weights.load_json(restored.extra["dynamic_weights"])
    ref_params = load_reference(run_, state, iterator_state).params if rl.beta > 0 else None
    batches = data.BatchIterator(run_.train_questions, rl.questions_per_step, iterator_state)
    start = int(state.step) // rl.updates_per_batch
    progress = metrics.Progress(rl.steps, initial=start, desc="grpo")
    if start == 0:
        progress.write(metrics.format_eval_summary(0, evaluate(run_, state, 0), reward_key="eval/reward_mean"))
    baseline = _baseline(run_)
    nan_streak = NanStreak(rl.max_nan_streak)
    try:
        for step in range(start + 1, rl.steps + 1):
            state, row, samples = grpo_iteration(run_, programs, state, ref_params, next(batches),
                                                 jax.random.fold_in(run_.key, 1000 + step))
            row = run_.watch.observe(step, {"stage": "grpo", **row})
            run_.writer.write(step, row)
            run_.writer.write_samples(step, [{"stage": "grpo", **s} for s in samples])
            progress.update(step, row)
            nan_streak.record(row["skipped"], step, f"{ckpt.directory} step {ckpt.latest_step()}")
            if step % cfg.eval.every_steps == 0 or step == rl.steps:
                progress.write(metrics.format_eval_summary(step, evaluate(run_, state, step), baseline,
                                                           reward_key="eval/reward_mean"))
            if step % cfg.checkpoint.every_steps == 0 or step == rl.steps or run_.stop_requested:
                weights = {} if run_.dynamic_weights is None else {"dynamic_weights": run_.dynamic_weights.to_json()}
                ckpt.save(state, data_state=batches.state.to_dict(), rubric_hash=run_.rubric_hash, extra=weights)
            if run_.stop_requested:
                break
    finally:
        progress.close()
        ckpt.close()


def _baseline(run_: Run) -> float:
    """The held-out reward before the first GRPO update (the SFT baseline), from metrics.jsonl."""
    rows = metrics.read_jsonl_metrics(run_.workdir / metrics.METRICS_FILE)
    return next(r["eval/reward_mean"] for r in rows if r.get("stage") == "eval" and r["step"] == 0)


def _json_float(x: float) -> float | None:
    return None if np.isnan(x) else float(x)

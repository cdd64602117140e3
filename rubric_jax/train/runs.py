"""A finished (or running) training run's directory as a policy: which checkpoints are kept, which is latest
or best (by the held-out reward the trainer logged at its step), its parameters restored (by the loader)
into a layout, and its export as a Hugging Face directory. Used by evaluation and `experiments.export`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from rubric_jax import files, loader, metrics, schema, sharding
from rubric_jax.models import lora
from rubric_jax.models.config import ModelConfig
from rubric_jax.rubrics.checks import short_repr
from rubric_jax.train import blocks, checkpointing, export, settings as run_settings

REPO_ROOT = Path(__file__).resolve().parents[2]  # what the shipped configs' relative asset paths are relative to
BEST_BY = "eval/reward_mean"  # the held-out reward the trainer logs at each eval (train/grpo_stage.py)
WHICH = blocks.EXPORT_WHICH
PEFT_DIR = "peft_adapter"  # a LoRA policy's export: its PEFT adapter directory, inside the merged HF directory
PEFT_BASE_DIR = "peft_base"  # ... and its base, when no HF directory holds it (the SFT result, a random init)
# The ModelConfig fields the experiment config sets on a loaded checkpoint (settings.model_overrides).
MODEL_OVERRIDES = ("param_dtype", "compute_dtype", "remat", "remat_policy", "scan_layers", "attention")
# What export and evaluation read of a run's config.json: (key, type, smallest value for an integer).
_READ_KEYS = (("model.checkpoint", str, None), ("model.config_json", str, None), ("model.tokenizer", str, None),
              ("model.param_dtype", str, None), ("model.compute_dtype", str, None), ("model.remat", bool, None),
              ("model.scan_layers", bool, None), ("model.attention", str, None), ("checkpoint.keep", int, 1),
              ("rl.updates_per_batch", int, 1))
_PATH_KEYS = ("model.checkpoint", "model.config_json", "model.tokenizer")


class RunError(ValueError):
    """A run directory (or a choice of its checkpoints) that cannot be used; the message names the path."""


@dataclasses.dataclass(frozen=True)
class RunCheckpoint:
    """One kept checkpoint of a training run and the held-out reward logged at its step (None: no eval)."""

    stage: str
    step: int  # the checkpoint's optimizer step (its directory name)
    eval_reward: float | None


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What reading and exporting a run's checkpoints needs of its config (`run_record`, or the running
    experiment's own)."""

    keep: int  # checkpoint.keep
    updates_per_batch: int  # GRPO checkpoints are numbered in updates, its log rows (and evals) in batches
    model: ModelConfig  # the policy's, as the run trained it
    tokenizer_dir: Path  # model.tokenizer, else the starting checkpoint's
    start_dir: Path | None  # model.checkpoint: the pretrained policy it started from, None for a random init
    seed: int = 0  # config.seed: a random init's
    stages: tuple[str, ...] = blocks.STAGES  # config.stages
    adapters: dict[str, lora.LoraConfig] = dataclasses.field(default_factory=dict)  # stage -> its LoRA adapters

    def stage_model(self, stage: str) -> ModelConfig:
        """The model a stage's checkpoints hold (with its adapters when it trained through LoRA)."""
        return self.model.replace(lora=self.adapters.get(stage))

    def start_weights(self, layout: sharding.Layout) -> loader.Weights:
        """The starting policy in `layout`: the pretrained checkpoint, or the seeded random init every run uses."""
        if self.start_dir is not None:
            overrides = {field: getattr(self.model, field) for field in MODEL_OVERRIDES}
            return loader.load_weights(self.start_dir, layout, **overrides)
        return loader.init_weights(self.model, layout, jax.random.split(jax.random.fold_in(jax.random.key(self.seed),
                                                                                           0))[0])


def run_record(workdir: Path) -> RunRecord:
    """The RunRecord of the run in `workdir`, from the config.json it wrote (`run_config`)."""
    config = run_config(workdir)
    try:
        model = run_settings.model_config(_model_block(config["model"]))
    except (OSError, ValueError) as e:
        raise RunError(f"--workdir={workdir}: cannot read the run's model config: {e}") from None
    start = config["model"]["checkpoint"]
    try:
        stages = tuple(config.get("stages", blocks.STAGES))
        lora_block = blocks.LoraBlock.from_values({**blocks.LoraBlock().to_values(), **config.get("lora", {})},
                                                  "lora")
    except (TypeError, ValueError) as e:
        raise RunError(f"{workdir / 'config.json'}: {e}") from None
    adapters = {stage: run_settings.lora_config(lora_block, stage) for stage in stages}
    return RunRecord(config["checkpoint"]["keep"], config["rl"]["updates_per_batch"], model,
                     Path(config["model"]["tokenizer"] or start), Path(start) if start else None, config.get("seed", 0),
                     stages, {stage: cfg for stage, cfg in adapters.items() if cfg is not None})


def _model_block(model: Mapping[str, Any]) -> blocks.ModelBlock:
    """The model block of a run's config.json: the keys it has (an older run's missing ones take their defaults,
    e.g. remat_policy "full"; a key since removed is left out)."""
    known = {schema.config_key(f) for f in schema.config_fields(blocks.ModelBlock)}
    return blocks.ModelBlock(**{key: value for key, value in model.items() if key in known})


def run_config(workdir: Path) -> dict[str, Any]:
    """The resolved config a training run wrote (workdir/config.json), its keys that export and evaluation read
    checked, and its relative paths resolved (`_resolve_path`)."""
    path = workdir / "config.json"
    if not path.is_file():
        raise RunError(f"{path}: not a training run directory (no config.json)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RunError(f"{path}: not valid JSON ({getattr(e, 'msg', str(e)[:200])})") from None
    if not isinstance(raw, dict):
        raise RunError(f"{path}: expected the JSON object experiments.run writes, got {type(raw).__name__}")
    for key, kind, minimum in _READ_KEYS:
        node: object = raw
        for part in key.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is KeyError:
            raise RunError(f"{path}: has no {key} (not a config experiments.run wrote)")
        if not isinstance(node, kind) or (kind is int and (isinstance(node, bool) or node < minimum)):
            expected = "an integer >= 1" if kind is int else kind.__name__
            raise RunError(f"{path}: {key}={short_repr(node)}: expected {expected}")
    config = raw
    for key in _PATH_KEYS:
        block, field = key.split(".")
        config[block][field] = _resolve_path(path, key, config[block][field])
    return config


def _resolve_path(config_path: Path, key: str, value: str) -> str:
    """A path stored in a run's config.json, usable from here: as stored when absolute, empty or present
    relative to the current directory, else relative to the repository root (the shipped configs' paths are);
    else one line saying which path and why."""
    if not value or Path(value).is_absolute() or Path(value).exists():
        return value
    if (REPO_ROOT / value).exists():
        return str(REPO_ROOT / value)
    raise RunError(f"{config_path}: {key}={value!r} is relative to the directory the run started in and exists "
                   f"neither here ({Path.cwd()}) nor under the repository root ({REPO_ROOT}); run from that directory")


def run_checkpoints(workdir: Path, record: RunRecord) -> list[RunCheckpoint]:
    """Every kept checkpoint of the run's stages (sft, grpo), with the eval reward logged at its step."""
    metrics_path = workdir / metrics.METRICS_FILE
    try:
        rows = metrics.read_jsonl_metrics(metrics_path) if metrics_path.is_file() else []
    except ValueError as e:  # names the file and line
        raise RunError(str(e)) from None
    evals = {}
    for row in rows:
        if row.get("stage") == "eval" and BEST_BY in row:
            step, value = row["step"], row[BEST_BY]
            number = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
            if isinstance(step, bool) or not isinstance(step, int) or not number:
                raise RunError(f"{metrics_path}: an eval row with step={short_repr(step)}, {BEST_BY}="
                               f"{short_repr(value)}: expected an integer step and a number")
            evals[step] = value
    found = []
    for stage in blocks.STAGES:
        directory = workdir / "checkpoints" / stage
        if not directory.is_dir():
            continue
        with checkpointing.Checkpointer(directory, max_to_keep=record.keep, async_save=False) as ckpt:
            steps = ckpt.all_steps()
        # GRPO checkpoints are numbered in optimizer updates; its log rows (and evals) in rollout batches.
        per_row = record.updates_per_batch
        found += [RunCheckpoint(stage, s, evals.get(s // per_row) if stage == "grpo" else None) for s in steps]
    return found


def select_checkpoint(workdir: Path, record: RunRecord, which: str) -> RunCheckpoint:
    """'latest': the newest GRPO checkpoint (else the newest SFT one); 'best': the kept GRPO checkpoint with
    the highest logged eval reward (`metrics.best_eval`: ties to the later one)."""
    found = run_checkpoints(workdir, record)
    if not found:
        raise RunError(f"{workdir}/checkpoints: the run has no complete checkpoint")
    if which == "latest":
        grpo = [c for c in found if c.stage == "grpo"]
        return max(grpo or found, key=lambda c: c.step)
    grpo = {c.step: c for c in found if c.stage == "grpo"}
    best = metrics.best_eval([(step, c.eval_reward) for step, c in grpo.items()])
    if best is None:
        raise RunError(f"{workdir}: no kept checkpoint has a logged {BEST_BY} (kept: "
                       f"{[f'{c.stage}/{c.step}' for c in found]}); use --config.which=latest")
    return grpo[best[0]]


def restore_run_params(workdir: Path, record: RunRecord, chosen: RunCheckpoint, layout: sharding.Layout,
                       frozen: dict[str, Any] | None = None) -> loader.Weights:
    """A run checkpoint's params (no optimizer state) as Weights, restored straight into `layout`; a LoRA
    checkpoint's adapters joined to its frozen base: `frozen` when the caller holds it (the running experiment's
    state), else rebuilt as the run built it (`run_base`). cfg.lora set: `loader.to_layout` merges them."""
    directory = workdir / "checkpoints" / chosen.stage
    cfg = record.stage_model(chosen.stage)
    try:
        with checkpointing.Checkpointer(directory, max_to_keep=record.keep, async_save=False) as ckpt:
            weights = ckpt.restore_params(cfg, layout, chosen.step)
        if cfg.lora is None:
            return weights
        if frozen is None:  # cast as the run's TrainState froze it
            frozen = jax.tree.map(lambda w: w.astype(cfg.compute_dtype),
                                  run_base(workdir, record, chosen.stage, layout).params)
    except (OSError, ValueError, checkpointing.CheckpointError) as e:
        raise RunError(f"--workdir={workdir}: cannot restore {chosen.stage} step {chosen.step}: {e}") from None
    return loader.as_weights(cfg, lora.join(weights.params, frozen), layout)


def run_base(workdir: Path, record: RunRecord, stage: str, layout: sharding.Layout) -> loader.Weights:
    """The plain model `stage` started from: the starting policy, or after SFT its newest checkpoint (a LoRA one
    merged): the frozen base of a LoRA stage."""
    if stage == "sft" or "sft" not in record.stages:
        return record.start_weights(layout)
    newest = max(c.step for c in run_checkpoints(workdir, record) if c.stage == "sft")
    sft = restore_run_params(workdir, record, RunCheckpoint("sft", newest, None), layout)
    return loader.to_layout(sft, layout, param_dtype=record.model.param_dtype)


def export_run(workdir: Path, which: str, out: Path) -> tuple[RunCheckpoint, Path]:
    """Writes the run's `which` checkpoint as a HF directory `out` (new or empty, never one of the run's
    inputs; the workdir may hold it), with the run's tokenizer files and, when the starting checkpoint has
    one, its generation_config.json. Returns the checkpoint chosen and `out`."""
    if which not in WHICH:
        raise RunError(f"--config.which={which}: expected one of {list(WHICH)}")
    record = run_record(workdir)
    inputs = [workdir, workdir / "config.json"]
    input_dirs = [workdir / "checkpoints", record.tokenizer_dir, *([record.start_dir] if record.start_dir else [])]
    try:
        files.check_output_dir(out, inputs, input_dirs)
    except files.PathError as e:
        raise RunError(str(e)) from None
    if out.is_dir() and any(out.iterdir()):
        raise RunError(f"--out={out}: already exists and is not empty; export into a new directory")
    chosen = select_checkpoint(workdir, record, which)
    # FSDP over every device of every process: no device holds more than its share while exporting.
    layout = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=-1, tensor=1)))
    weights = restore_run_params(workdir, record, chosen, layout)
    return chosen, export_weights(record, chosen.stage, weights, layout, out)


def export_weights(record: RunRecord, stage: str, weights: loader.Weights, layout: sharding.Layout, out: Path, *,
                   replace: bool = False) -> Path:
    """Writes a run's policy (`weights` of `stage`'s checkpoints, in `layout`) as a HF directory `out`; a LoRA policy
    merged into `out`, its adapters as a PEFT directory `out`/PEFT_DIR for its base: the starting HF directory, or
    (after SFT, or from a random init: no HF directory holds it) that base written to `out`/PEFT_BASE_DIR."""
    if weights.cfg.lora is None:
        return export.export_policy(weights, out, tokenizer_dir=record.tokenizer_dir, start_dir=record.start_dir,
                                    replace=replace)
    base_dir = record.start_dir if stage == "sft" or "sft" not in record.stages else None
    export.export_lora_policy(weights, layout, out, out / PEFT_DIR, tokenizer_dir=record.tokenizer_dir,
                              start_dir=record.start_dir, base_model=str(base_dir or out.absolute() / PEFT_BASE_DIR),
                              replace=replace)
    if base_dir is None:
        export.export_policy(loader.base_weights(weights, layout), out / PEFT_BASE_DIR,
                             tokenizer_dir=record.tokenizer_dir, start_dir=record.start_dir, replace=replace)
    return out

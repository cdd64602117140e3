"""Judge distillation: fine-tune a judge on a teacher's verdicts, export it, and measure it against the teacher.

  train    cold-start-style SFT (train/step.sft_train_step) with the loss on the verdict tokens only; each
           draw of an item renders its prompt afresh (new nonce, new anchor order), as scoring will; with
           `group_max_size`, groups of one question's items (distill_data.group_examples) are trained in the group
           layout beside the items (a new shown order per draw too);
  export   a Hugging Face directory (config.json, model.safetensors, tokenizer with its chat template);
  measure  the exported directory is loaded the way training loads a judge (judges/loading.load_judges) and scores
           held-out items through judge_rows (one batched call, one sample, no retries): the parse-failure
           rate, and agreement with the teacher per dimension (RubricRL 3.2: Spearman; flag below 0.6); with
           `group_max_size`, held-out groups again in the group layout (judge.layout=group), as calibrate scores.

A run is a pure function of its inputs and `DistillConfig.seed` (initial weights, batch order, prompt
renderings, judge sampling), so the same inputs on the same software rebuild the same judge.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rubric_jax import data, loader, metrics, sharding
from rubric_jax.calibration.agreement import agreement, dimension_seed
from rubric_jax.calibration.report import with_ci
from rubric_jax.calibration.stats import scale_groups
from rubric_jax.files import write_atomic
from rubric_jax.judges.distill_data import Group, JudgeItem, example_batch, group_examples
from rubric_jax.judges.llm_judge import Judge, judge_rows
from rubric_jax.judges.loading import load_judges
from rubric_jax.judges.spec import PROMPTS, JudgeSpec
from rubric_jax.models.checkpoint import export_hf_checkpoint
from rubric_jax.models.config import ModelConfig
from rubric_jax.rubrics.schema import Dimension
from rubric_jax.train import state as train_state, step as train_step

VERDICT_BUCKETS = (8, 16, 32, 64)  # verdict + eos token widths (an anchor description and `SCORE: k`)
REPORT_FORMAT = "rubric_jax.distill_report"
FLAG_BELOW = 0.6  # RubricRL 3.2: a dimension whose judge agrees below Spearman 0.6 is not to be used
LOSS_WINDOW = 20  # the reported final loss is the mean of the last 20 steps
PROMPT_BUCKET_STEP = 64  # judge prompts vary by tens of tokens: power-of-two padding would waste up to half


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """How the student is trained (AdamW, warmup then cosine decay) and seeded."""

    steps: int = 400  # optimizer updates
    batch_size: int = 32  # items per update
    learning_rate: float = 2e-3  # peak learning rate (a randomly initialised tiny judge needs a high one)
    warmup_steps: int = 20  # linear warmup
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    seed: int = 0  # initial weights, batch order, prompt renderings
    prompt: str = "full"  # the judge prompt it learns and is measured with (JudgeSpec.prompt)
    group_max_size: int = 0  # >0: also learn the group layout on groups of 1..this many items (0: pointwise only)
    group_repeats: int = 1  # passes over a question's items cut into training groups (distill_data.group_examples)

    def __post_init__(self) -> None:
        if self.prompt not in PROMPTS:
            raise ValueError(f"distill config: prompt must be one of {PROMPTS}, got {self.prompt!r}")
        for field, minimum in (("steps", 1), ("batch_size", 1), ("warmup_steps", 0), ("seed", 0),
                               ("group_max_size", 0), ("group_repeats", 1)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"distill config: {field} must be an integer >= {minimum}, got {value!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"distill config: learning_rate must be positive, got {self.learning_rate!r}")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"distill config: warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")


def check_measurement(model_cfg: ModelConfig, max_new_tokens: int, flag: str = "max_new_tokens") -> None:
    """The held-out measurement's verdict budget leaves the judge room for a prompt (llm_judge.load_judge's
    rule); checked before training, which a failure after it would waste. The message names `flag`."""
    context = model_cfg.max_position_embeddings
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens < context:
        raise ValueError(f"{flag}={max_new_tokens!r}: expected an integer in [1, {context - 1}] (the student's "
                         f"{context}-token context holds the judge prompt and the verdict)")


def prompt_buckets(model_cfg: ModelConfig) -> tuple[int, ...]:
    """Prompt widths in steps of PROMPT_BUCKET_STEP that leave room for the longest verdict in the model's context
    (a batch pads to the smallest that holds its longest prompt; each width compiles the step once)."""
    top = model_cfg.max_position_embeddings - VERDICT_BUCKETS[-1]
    if top < PROMPT_BUCKET_STEP:
        raise ValueError(f"judge context {model_cfg.max_position_embeddings} leaves no room for a prompt and a verdict")
    return tuple(range(PROMPT_BUCKET_STEP, top + 1, PROMPT_BUCKET_STEP))


def initial_state(model_cfg: ModelConfig, start: loader.Weights | None, cfg: DistillConfig, layout: sharding.Layout
                  ) -> tuple[train_state.TrainState, train_state.TrainState]:
    """The step-0 train state in `layout` (random weights from the seed when `start` is None, else `start`, which
    must already be in `layout`) and its shardings."""
    tx = train_state.make_optimizer(train_state.OptimizerConfig(
        learning_rate=cfg.learning_rate, warmup_steps=cfg.warmup_steps, schedule="cosine", total_steps=cfg.steps,
        weight_decay=cfg.weight_decay))
    key = jax.random.key(cfg.seed)
    if start is None:
        return train_state.init_train_state(model_cfg, tx, key, layout)
    return train_state.new_train_state(start, tx, layout.mesh)


def train(model_cfg: ModelConfig, start: loader.Weights | None, tokenizer: Any, items: Sequence[JudgeItem | Group],
          cfg: DistillConfig, layout: sharding.Layout, *, progress: bool = True
          ) -> tuple[dict[str, Any], list[float]]:
    """Trained params (in `layout`) and the loss of every step: verdict-token NLL on the teacher's
    verdicts (of items, and of groups in the group layout), by the cold-start SFT step (train/step.jit_sft_step)."""
    if not items:
        raise ValueError("distill: no training items")
    if cfg.batch_size % layout.batch_multiple:
        raise ValueError(f"distill config: batch_size={cfg.batch_size} must be a multiple of the {layout.batch_multiple} "
                         "ways the batch is split over devices")
    state, shardings = initial_state(model_cfg, start, cfg, layout)
    step_fn = train_step.jit_sft_step(shardings=shardings, mesh=layout.mesh)
    batches = data.BatchIterator(list(items), cfg.batch_size, data.IteratorState(seed=cfg.seed))
    buckets = prompt_buckets(model_cfg)
    bar = metrics.Progress(cfg.steps, desc="distill judge", keys=("loss",)) if progress else None
    losses = []
    for step in range(1, cfg.steps + 1):
        rng = np.random.default_rng([cfg.seed, step])  # this step's nonces and anchor orders
        batch = example_batch(tokenizer, next(batches), rng, buckets, VERDICT_BUCKETS, cfg.prompt)
        state, step_metrics = step_fn(state, batch)
        row = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        losses.append(row["loss"])
        if bar is not None:
            bar.update(step, row)
    if bar is not None:
        bar.close()
    return state.params, losses


def export(model_cfg: ModelConfig, params: dict[str, Any], tokenizer: Any, out: Path) -> Path:
    """The trained judge as a Hugging Face directory: config.json, model.safetensors and the tokenizer files."""
    export_hf_checkpoint(model_cfg, params, out)
    tokenizer.save_pretrained(out)
    return out


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Held-out items scored by the student: teacher and student levels [N] (NaN: no valid verdict) and counters."""

    dimensions: list[Dimension]  # [N] the dimension each item was judged on
    teacher_N: np.ndarray
    student_N: np.ndarray
    counters: dict[str, Any]


def measure(judge: Judge, items: Sequence[JudgeItem], key: jax.Array, prompt: str = "full",
            config: JudgeSpec | None = None) -> Measurement:
    """Scores every item once (judge_rows: one batched call, one sample, no retries, `prompt` style; or `config`)
    beside the teacher's level."""
    config = config or JudgeSpec(samples=1, max_retries=0, prompt=prompt)
    out = judge_rows([judge], config, [i.question for i in items],
                     [i.response for i in items], [[i.dimension] for i in items], key)
    return Measurement([i.dimension for i in items], np.asarray([i.score for i in items], np.float64),
                       np.asarray([s[0] for s in out.scores], np.float64), out.details)


def training_groups(items: Sequence[JudgeItem], cfg: DistillConfig) -> list[Group]:
    """The groups the student learns (or is measured on) in the group layout: none unless `cfg.group_max_size`."""
    if not cfg.group_max_size:
        return []
    return group_examples(items, cfg.group_max_size, cfg.group_repeats, np.random.default_rng([cfg.seed, 0]))


def measure_groups(judge: Judge, groups: Sequence[Group], key: jax.Array) -> Measurement:
    """Scores every group once in the group layout (judge_rows: one sample, no retries, the full prompt), one batched
    call per round of groups of distinct questions (a call's rows of one question and dimension are one group)."""
    config = JudgeSpec(samples=1, max_retries=0, prompt="full", layout="group")
    rounds: list[list[Group]] = []
    for group in groups:
        free = next((r for r in rounds if all(g[0].question != group[0].question for g in r)), None)
        if free is None:
            rounds.append(free := [])
        free.append(group)
    parts, counters = [], {"judge_prompts": 0, "judge_invalid": 0, "judge_prompt_too_long": 0,
                           "judge_invalid_examples": []}
    for groups_of_round, round_key in zip(rounds, jax.random.split(key, len(rounds))):
        items = [item for group in groups_of_round for item in group]
        parts.append(measure(judge, items, round_key, "full", config))
        for name, value in parts[-1].counters.items():
            if name in counters:
                counters[name] += value
    return Measurement([d for p in parts for d in p.dimensions], np.concatenate([p.teacher_N for p in parts]),
                       np.concatenate([p.student_N for p in parts]), counters)


def agreement_report(measured: Measurement, *, threshold: float = FLAG_BELOW, num_resamples: int = 1000,
                     seed: int = 0) -> dict[str, Any]:
    """Per dimension (per scale, as '<id>@<lo>-<hi>', where the items' rubrics give one id several): items, verdicts
    missing, exact agreement, and Spearman / Kendall tau-b / quadratic kappa of student vs teacher with bootstrap
    intervals (calibration.agreement); `flagged` below `threshold`."""
    report = {}
    groups = scale_groups((d.id, d.scale.levels, i) for i, d in enumerate(measured.dimensions))
    for name, (dim_id, levels, positions) in groups.items():  # each item on its own rubric's scale
        rows_N = np.isin(np.arange(len(measured.dimensions)), positions)
        scored_N = rows_N & ~np.isnan(measured.student_N)
        teacher, student = measured.teacher_N[scored_N], measured.student_N[scored_N]
        stats = agreement([teacher, student], levels, num_resamples=num_resamples,
                          seed=dimension_seed(seed, name)).to_json()
        rho = stats["spearman"]["value"]
        report[name] = {**stats, "items": int(rows_N.sum()), "no_verdict": int(rows_N.sum() - scored_N.sum()),
                        "no_verdict_rate": float(1.0 - scored_N.sum() / rows_N.sum()),
                        "exact_agreement": float(np.mean(teacher == student)) if scored_N.any() else None,
                        "flagged": rho is None or rho < threshold}
    return report


def heldout_counts(measured: Measurement) -> dict[str, Any]:
    """Items, prompts sent, unparseable verdicts and too-long prompts of one held-out measurement."""
    counters = measured.counters
    sent = counters["judge_prompts"]
    return {"items": len(measured.dimensions), "prompts_sent": sent, "invalid_verdicts": counters["judge_invalid"],
            "prompt_too_long": counters["judge_prompt_too_long"],
            "parse_failure_rate": counters["judge_invalid"] / sent if sent else None,
            "invalid_examples": counters["judge_invalid_examples"]}


def report(measured: Measurement, *, teacher: str, student: str, train_items: int, config: DistillConfig,
           losses: Sequence[float], judge_settings: dict[str, Any], grouped: Measurement | None = None,
           train_groups: int = 0) -> dict[str, Any]:
    """The distillation report (report.json): what was trained on what, and how the student agrees with its teacher
    (`heldout_group`: on held-out groups in the group layout, when `grouped` was measured)."""
    group = {} if grouped is None else {"heldout_group": {**heldout_counts(grouped),
                                                          "dimensions": agreement_report(grouped, seed=config.seed)}}
    return {
        "format": REPORT_FORMAT,
        "teacher": teacher,
        "student": student,
        "training": {**dataclasses.asdict(config), "items": train_items, **({"groups": train_groups} if train_groups
                                                                             else {}),
                     "loss_first": losses[0], "loss_last": float(np.mean(losses[-LOSS_WINDOW:]))},
        "judge_settings": judge_settings,
        "heldout": heldout_counts(measured),
        "dimensions": agreement_report(measured, seed=config.seed),
        **group,
    }


def heldout_markdown(title: str, held: dict[str, Any], dimensions: dict[str, Any]) -> list[str]:
    """report.md's lines of one held-out measurement: its counts and agreement table."""
    rate = held["parse_failure_rate"]
    lines = [f"{title}: {held['items']} items, {held['prompts_sent']} prompts sent, {held['invalid_verdicts']} "
             f"unparseable verdicts ({'-' if rate is None else f'{100 * rate:.1f}%'}), "
             f"{held['prompt_too_long']} prompts too long.", "",
             "| dimension | items | no verdict | exact agreement | Spearman [95% CI] | Kendall tau-b | quadratic kappa "
             "| flagged |", "|---|---|---|---|---|---|---|---|"]
    for dim_id, d in dimensions.items():
        exact = "-" if d["exact_agreement"] is None else f"{d['exact_agreement']:.3f}"
        lines.append(f"| {dim_id} | {d['items']} | {d['no_verdict']} | {exact} | {with_ci(d['spearman'])} | "
                     f"{with_ci(d['kendall'])} | {with_ci(d['kappa_quadratic'])} | {'yes' if d['flagged'] else 'no'} |")
    return lines


def report_markdown(payload: dict[str, Any]) -> str:
    """report.md: the held-out agreement table(s) a person reads."""
    training = payload["training"]
    groups = f" and {training['groups']} groups (group layout)" if training.get("groups") else ""
    lines = [f"# Distilled judge: {payload['student']}", "",
             f"Teacher: {payload['teacher']}. Trained on {training['items']} items{groups} for "
             f"{training['steps']} steps (loss {training['loss_first']:.3f} -> {training['loss_last']:.3f}).", "",
             *heldout_markdown("Held out", payload["heldout"], payload["dimensions"])]
    if "heldout_group" in payload:
        held = payload["heldout_group"]
        lines += ["", *heldout_markdown("Held out in the group layout (judge.layout=group, full prompt)", held,
                                        held["dimensions"])]
    return "\n".join(lines) + "\n"


def write_report(directory: Path, payload: dict[str, Any]) -> None:
    """report.json and report.md in `directory` (each written atomically)."""
    write_atomic(directory / "report.json", json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    write_atomic(directory / "report.md", report_markdown(payload))


def distill(model_cfg: ModelConfig, start: loader.Weights | None, tokenizer: Any, train_items: Sequence[JudgeItem],
            heldout_items: Sequence[JudgeItem], out: Path, cfg: DistillConfig, *, teacher: str, student: str,
            sampler: str = "greedy", max_new_tokens: int = 32, group_max_new_tokens: int = 48,
            progress: bool = True) -> dict[str, Any]:
    """Trains, exports and measures a judge; `out` appears only once complete (built in a sibling directory).

    The held-out measurement loads the exported directory with judges/loading.load_judges and the given sampler and
    max_new_tokens (`group_max_new_tokens` for held-out groups): what is measured is what a run that names `out` as
    its judge will use.
    """
    if out.exists():
        raise FileExistsError(f"{out}: already exists; distil into a new directory")
    if not heldout_items:
        raise ValueError("distill: no held-out items to measure the student on")
    check_measurement(model_cfg, max_new_tokens)
    check_measurement(model_cfg, group_max_new_tokens, "group_max_new_tokens")
    layout = default_layout()
    train_groups = training_groups(train_items, cfg)
    trained, losses = train(model_cfg, start, tokenizer, [*train_items, *train_groups], cfg, layout, progress=progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        export(model_cfg, trained, tokenizer, staging)
        (judge,) = load_judges(JudgeSpec(checkpoints=(str(staging),), sampler=sampler, max_new_tokens=max_new_tokens,
                                         samples=1, max_retries=0, prompt=cfg.prompt), layout.mesh)
        measured = measure(judge, heldout_items, jax.random.key(cfg.seed), cfg.prompt)
        grouped, settings = None, {"sampler": sampler, "max_new_tokens": max_new_tokens, "prompt": cfg.prompt}
        if cfg.group_max_size:
            (group_judge,) = load_judges(JudgeSpec(checkpoints=(str(staging),), sampler=sampler, samples=1,
                                                   max_new_tokens=group_max_new_tokens, max_retries=0), layout.mesh)
            grouped = measure_groups(group_judge, training_groups(heldout_items, cfg), jax.random.key(cfg.seed))
            settings["group_max_new_tokens"] = group_max_new_tokens
        payload = report(measured, teacher=teacher, student=student, train_items=len(train_items), config=cfg,
                         losses=losses, judge_settings=settings, grouped=grouped, train_groups=len(train_groups))
        write_report(staging, payload)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return payload


def default_layout() -> sharding.Layout:
    """The training layout: every device on the fsdp axis (one CPU device: no sharding at all)."""
    return sharding.Layout(sharding.make_mesh(sharding.MeshConfig(1, -1, 1)))

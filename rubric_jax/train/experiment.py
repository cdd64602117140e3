"""An experiment built once, before anything is written: `build(settings, record, workdir) -> Experiment`.

The Experiment holds typed, frozen specs (train/settings.py, derived from the blocks of train/blocks.py: no
ConfigDict reaches here), the layouts and
programs (train/programs.py: what the dry run compiles too), the tokenizer, rubrics, reward, data sets and
the (lazily opened) run log. `build` reads only and checks everything a stage would otherwise find wrong
mid-run: directories, prompt and judge-prompt lengths, batch divisibility, calibration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import jax

from rubric_jax import data, distributed, loader
from rubric_jax.calibration.pinning import check_calibration
from rubric_jax.judges.base_model import same_base_warnings
from rubric_jax.judges.llm_judge import Judge, judge_tokens_per_token, shortest_prompt_tokens
from rubric_jax.judges.reward import Reward, RubricReward
from rubric_jax.judges.reward_model import RewardModelReward, load_reward_model
from rubric_jax.judges.backends import SharedBaseBackend
from rubric_jax.judges.loading import load_cascade, load_judges, open_verdict_store, shared_base_judge
from rubric_jax.judges.scorers import split_by_reads
from rubric_jax.judges.spec import JudgeSpec, describe as describe_judge, tokenizer_identity, weights_identity
from rubric_jax.judges.store import VerdictStore
from rubric_jax.models.checkpoint import CheckpointError, load_tokenizer
from rubric_jax.rubrics import lint
from rubric_jax.rubrics.correction import Correction, load_correction
from rubric_jax.rubrics.dynamic_weights import DimensionWeights
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.train import audit as judge_audit, checkpointing, evolving, golden as golden_set, monitors
from rubric_jax.train import programs as run_programs, runs
from rubric_jax.train import blocks, settings as run_settings, step as train_step, workdir as run_workdir
from rubric_jax.train.blocks import ConfigRecord
from rubric_jax.train.settings import Settings



SHARED_BASE_WARNING = ("warning: config.judge.share_policy_base=True: the judge is the policy's own base; a policy can "
                       "drift to what its base happens to score high (RubricRL 6.2): audit it with another judge "
                       "(config.audit.judge)")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """The built pieces of one experiment (no maths here); the mutable ones are the dynamic weights, the
    monitors' windows and the log, which the GRPO stage advances and checkpoints."""

    settings: Settings
    workdir: Path
    programs: run_programs.RunPrograms  # layouts and jitted programs (the dry run compiles the same)
    model_dir: str  # the pretrained policy's HF directory, "" for a seeded random init
    tokenizer_dir: str  # model.tokenizer, else model_dir
    tokenizer: Any
    reward: Reward  # config.reward.source: a RubricReward or a RewardModelReward
    shared_rubric: Rubric
    rubric_of: dict[str, Rubric]  # question id -> its rubric (shared, or R*(q)); one row per id (data.check_split_ids)
    rubric_hash: str
    rubric_info: dict[str, Any]  # rubric.json: name, version, content and rubric-set hashes
    train_questions: list[data.Question]
    eval_questions: list[data.Question]
    sft_examples: list[data.SFTExample]  # empty without an SFT stage
    golden: golden_set.GoldenSet | None  # config.data.golden, scored at every eval
    judge_store: VerdictStore | None  # config.judge.store: the golden references' verdicts (and rollouts')
    audit: judge_audit.Audit | None  # config.audit: another judge scores eval responses (train/audit.py)
    dynamic_weights: DimensionWeights | None
    watch: monitors.Watch  # reward-hacking monitors' thresholds and alerts.jsonl
    log: run_workdir.RunLog
    key: jax.Array
    config_json: str  # the resolved config, as config.json records it
    config_sha256: str  # metrics.config_fingerprint: what done.json names

    @property
    def layouts(self) -> run_programs.Layouts:
        return self.programs.layouts

    @property
    def mesh(self) -> jax.sharding.Mesh:
        """The training mesh."""
        return self.programs.layouts.mesh

    @property
    def weights(self) -> dict[str, float] | None:
        """Dimension weights overriding the rubrics' (dynamic weights), or None to use the rubrics'."""
        return None if self.dynamic_weights is None else self.dynamic_weights.current()

    @property
    def judge_hash(self) -> str:
        """The LLM judge's hash (judges/spec.judge_hash, as rubric.json records it), "" without one: a GRPO checkpoint
        records it, and a resume under another judge is refused (workdir.check_resume)."""
        judge = self.rubric_info.get("judge")
        return judge["hash"] if judge else ""

    @property
    def reward_model_hash(self) -> str:
        """The reward model's hash (RewardModelReward.describe, as rubric.json records it), "" without one: a GRPO
        checkpoint records it, and a resume under another reward model is refused (workdir.check_resume)."""
        reward_model = self.rubric_info.get("reward_model")
        return reward_model["hash"] if reward_model else ""

    @property
    def judge_base(self) -> SharedBaseBackend | None:
        """The backend of the judge reading the policy's base (judge.share_policy_base), else None."""
        judges = self.reward.judges if isinstance(self.reward, RubricReward) else ()
        return next((j.backend for j in judges if isinstance(j.backend, SharedBaseBackend)), None)

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        return (int(self.tokenizer.eos_token_id),)

    def rollout_store(self) -> dict[str, VerdictStore]:
        """The store keyword of a policy-response reward call: the store with judge.store_rollouts, else none."""
        return {"store": self.judge_store} if self.settings.config.judge.store_rollouts else {}

    def checkpointer(self, stage: str, keep_best: bool = False) -> checkpointing.Checkpointer:
        """The checkpoint manager of `stage` ("sft", "grpo", "reference") in the workdir."""
        return checkpointing.Checkpointer(run_workdir.checkpoint_dir(self.workdir, stage),
                                          max_to_keep=self.settings.config.checkpoint.keep, keep_best=keep_best)

    def run_record(self) -> runs.RunRecord:
        """What reading and exporting this run's checkpoints needs (as `experiments.export` reads it)."""
        config = self.settings.config
        adapters = {stage: spec.lora for stage, spec in (("sft", self.settings.sft), ("grpo", self.settings.rl))
                    if spec is not None and spec.lora is not None}
        return runs.RunRecord(config.checkpoint.keep, config.rl.updates_per_batch, self.layouts.model,
                              Path(self.tokenizer_dir), Path(self.model_dir) if self.model_dir else None, config.seed,
                              config.stages, adapters)

    def base_identity(self, stage: str) -> str | None:
        """The identity of a LoRA stage's frozen base (`stage_base_identity`), recorded with its adapter checkpoints
        instead of the base, so that a resume onto another base is refused; None for a stage that trains every
        weight."""
        return stage_base_identity(self.settings, self.model_dir, stage)

    def base_judging(self, params: Any) -> Callable[[], contextlib.AbstractContextManager]:
        """What a scoring of responses sampled by the policy `params` runs in: with judge.share_policy_base, the
        judge bound to their base's decode copy, made now (before an update donates the state's arrays); else
        nothing."""
        backend = self.judge_base
        if backend is None:
            return contextlib.nullcontext
        weights = backend.weights_of(params)
        return lambda: backend.using(weights)

    def initial_params(self) -> dict[str, Any]:
        """The starting policy's params in the training layout, through the loader: the pretrained checkpoint,
        or a seeded random init."""
        return self.run_record().start_weights(self.layouts.training).params


def stage_base_identity(settings: Settings, model_dir: str, stage: str) -> str | None:
    """sha256 hex of a LoRA stage's frozen base: the starting policy (its HF directory's `weights_identity`, or the
    random init's config and seed) after the stages before `stage`, named by their settings; None for a stage that
    trains every weight."""
    spec = settings.sft if stage == "sft" else settings.rl
    if spec is None or spec.lora is None:
        return None
    config = settings.config
    start = (weights_identity(model_dir) if model_dir else
             f"random init seed {config.seed} of {_file_sha256(config.model.config_json)}")
    before = {"start": start}
    if stage == "grpo" and settings.sft is not None:
        before["sft"] = {"block": config.sft.to_values(), "data": _file_sha256(config.data.sft),
                         "lora": repr(settings.sft.lora)}
    return hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()


def shared_base_settings(settings: Settings, model_dir: str, tokenizer_dir: str,
                       lay: run_programs.Layouts) -> Settings:
    """With judge.share_policy_base, the settings whose judge spec names the GRPO stage's base (its identity, the
    tokenizer the judge reads its prompts and answers with, which model.tokenizer may take from another directory,
    and the dtypes it reads the base in: the judge hash, so verdicts are not mixed with another judge's); else
    unchanged."""
    judge = settings.config.judge
    if not judge.share_policy_base:
        return settings
    identity = (f"{stage_base_identity(settings, model_dir, 'grpo')} read with tokenizer "
                f"{tokenizer_identity(tokenizer_dir)}, decoded in {lay.decode_dtype}, computing in "
                f"{lay.model.compute_dtype}")
    config = dataclasses.replace(settings.config, judge=dataclasses.replace(judge, policy_base=identity))
    return dataclasses.replace(settings, config=config)


def _judges(settings: Settings, lay: run_programs.Layouts, tokenizer: Any) -> tuple[Judge, ...]:
    """config.judge's judges: its checkpoints loaded into the run's devices, or the judge reading the policy's base
    (judge.share_policy_base: nothing loaded)."""
    judge = settings.config.judge
    if not judge.share_policy_base:
        return load_judges(judge, lay.training, where="config.judge")
    _say([SHARED_BASE_WARNING])
    return (shared_base_judge(judge, tokenizer, lay.rollout_weights, lay.decode, lay.model.max_position_embeddings,
                              where="config.judge"),)


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """The data and rubrics of a run, loaded and cross-checked."""

    shared_rubric: Rubric
    train: list[data.Question]
    eval: list[data.Question]
    golden: golden_set.GoldenSet | None
    rubric_of: dict[str, Rubric]

    @property
    def questions(self) -> list[data.Question]:
        """Every question a rollout may prompt with (train, eval, golden)."""
        return self.train + self.eval + (self.golden.questions if self.golden else [])


def build(settings: Settings, record: ConfigRecord, workdir: str | Path) -> Experiment:
    """Layouts, programs, tokenizer, model shape, rubric, reward, datasets and the (lazily opened) log from the
    settings (and the resolved config's `record`, written as config.json); reads only: nothing is written to the
    workdir."""
    config = settings.config
    model_dir, tokenizer_dir, tokenizer_key = _model_dirs(config.model)
    judge_dirs = [_existing_dir(path, "judge.checkpoint", "judge") for path in settings.config.judge.checkpoints]
    model_cfg = run_settings.model_config(config.model)
    run_settings.check_positions(settings, model_cfg.max_position_embeddings)
    lay = run_programs.layouts(settings.mesh, model_cfg, adapters=settings.lora)
    settings = shared_base_settings(settings, model_dir, tokenizer_dir, lay)
    _check_rollout_chunks(settings, lay.decode.batch_multiple)
    settings.off_policy.check_processes(jax.process_count())
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
    except CheckpointError as e:
        raise CheckpointError(f"config.{tokenizer_key}: {e}") from e
    inputs = _load_inputs(settings, tokenizer, lay.mesh)
    rubrics = list(inputs.rubric_of.values())
    _say(lint.start_up_lines(rubrics, settings.train_rollout.max_new_tokens, lint.shipped_waivers()))  # issue 37 §3
    calibration = check_calibration(settings.config.judge, rubrics, "config.judge")  # before the judges load
    _say(calibration.lines() if calibration is not None else [])
    judges = _judges(settings, lay, tokenizer)
    _say(same_base_warnings(model_dir or config.model.config_json, judge_dirs))  # RubricRL 6.2: judge-policy collusion
    if settings.sft is not None:
        distributed.check_divides(settings.sft.batch_size, "sft.batch_size")
    correction = load_correction(config.data.rubric_correction) if config.data.rubric_correction else None
    reward = _reward(settings, rubrics, judges, correction, lay)
    if settings.reward_model is None:
        longest = max(settings.train_rollout.max_new_tokens, settings.eval_rollout.max_new_tokens)
        _say(_check_judge_prompts_fit(judges, settings.config.judge, inputs.rubric_of, inputs.questions, tokenizer,
                                      longest))
    sft_examples = _load_sft(settings, tokenizer, model_cfg.max_position_embeddings)
    sft_steps = settings.sft.steps(len(sft_examples)) if settings.sft else 0
    rubric_hash = rubric_set_hash(inputs.shared_rubric, rubrics, correction)
    rubric_info = {"name": inputs.shared_rubric.name, "version": inputs.shared_rubric.version,
                   "content_hash": inputs.shared_rubric.content_hash, "rubric_set_hash": rubric_hash,
                   "correction_hash": correction.content_hash if correction is not None else None,
                   "judge": describe_judge(settings.config.judge) if judges else None,
                   "reward_model": reward.describe() if isinstance(reward, RewardModelReward) else None,
                   "calibration": calibration.record() if calibration is not None else None}
    workdir = Path(workdir)
    programs = run_programs.build(settings, lay, sft_steps)
    run_info = {"rubric": rubric_info, "config": record.values}
    if programs.auto is not None:  # rl.micro_batches=0: the count chosen by memory (an explicit one is in the config)
        print(programs.auto.line(), file=sys.stderr)
        run_info["micro_batches"] = programs.auto.record()
    log = run_workdir.RunLog(workdir, run_info=run_info)
    return Experiment(
        settings=settings, workdir=workdir, programs=programs, model_dir=model_dir,
        tokenizer_dir=tokenizer_dir, tokenizer=tokenizer, reward=reward, shared_rubric=inputs.shared_rubric,
        rubric_of=inputs.rubric_of, rubric_hash=rubric_hash, rubric_info=rubric_info, train_questions=inputs.train,
        eval_questions=inputs.eval, sft_examples=sft_examples, golden=inputs.golden,
        judge_store=open_verdict_store(settings.config.judge) if judges else None,
        audit=judge_audit.build_audit(settings.audit, lay.training, rubrics),
        dynamic_weights=(DimensionWeights.for_rubrics(rubrics, config.rl.dynamic_weights_window)
                         if config.rl.dynamic_weights else None),
        watch=monitors.Watch(monitors.thresholds(config.monitor), workdir, config.monitor.window_steps,
                             open_logs=log.open),
        log=log, key=jax.random.key(settings.config.seed), config_json=record.json, config_sha256=record.sha256)


def _say(lines: Iterable[str]) -> None:
    """Start-up lines for the person running it, on stderr (the metrics file has everything)."""
    for line in lines:
        print(line, file=sys.stderr)


def _existing_dir(value: str, key: str, what: str) -> str:
    """`value` if it names a directory; else one line naming the config key that sets it."""
    if not Path(value).is_dir():
        raise CheckpointError(f"config.{key}={value}: {what} directory does not exist; set --config.{key}=DIR "
                              "(a local directory: nothing is downloaded)")
    return value


def _model_dirs(model: blocks.ModelBlock) -> tuple[str, str, str]:
    """The policy's checkpoint directory ("" for a random init), the tokenizer's and the key naming it."""
    model_dir = model.checkpoint and _existing_dir(model.checkpoint, "model.checkpoint", "model")
    if not (model.tokenizer or model_dir):
        raise ValueError("config.model.tokenizer (or config.model.checkpoint) must name a tokenizer directory")
    tokenizer_key = "model.tokenizer" if model.tokenizer else "model.checkpoint"
    return model_dir, _existing_dir(model.tokenizer or model_dir, tokenizer_key, "tokenizer"), tokenizer_key


def check_group_blocks(questions: Sequence[str], processes: int, where: str) -> None:
    """judge.layout=group judges a question's rows of one reward call as one group, and each process scores its own
    block of the eval and golden rows: a question text with rows in two blocks would be judged as two groups, other
    groups than on one process, so it is refused at start-up (training groups are whole: a process rolls out all
    of its questions' group_size responses)."""
    split = distributed.split_keys(questions, processes)
    if split:
        raise ValueError(f"{where}: with config.judge.layout=group on {processes} processes, {len(split)} question "
                         f"text(s) have rows in two processes' blocks and would be judged as separate groups (first: "
                         f"{split[0][:60]!r}); put a question's rows next to each other, or run on one process")


def _load_inputs(settings: Settings, tokenizer: Any, mesh: jax.sharding.Mesh) -> _Inputs:
    """The rubric, the question sets and the golden set, checked against the batch shapes and prompt lengths."""
    config = settings.config
    shared_rubric = load_rubric(config.data.rubric)
    train = data.load_question_set(config.data.train, config.data.tfds_dir, "train")
    evaluation = data.load_question_set(config.data.eval, config.data.tfds_dir, "eval")[: config.eval.max_questions]
    data.check_split_ids(("data.train", train), ("data.eval", evaluation))  # one rubric table keyed by id
    if settings.rl is not None:
        _check_rollouts_divide(settings.rl, settings.grpo.group_size, mesh)
        distributed.check_divides(settings.rl.questions_per_step, "rl.questions_per_step")
        distributed.check_divides(len(evaluation), "eval.max_questions (the eval questions used)")
        _check_prompts_fit(tokenizer, settings, train + evaluation)
        if config.rl.rubric_refresh_every:
            evolving.check_start(shared_rubric, f"config.data.rubric={config.data.rubric}", jax.process_count())
            evolving.check_held_out(train, evaluation)
    golden = golden_set.load_golden(config.data.golden, config.data.tfds_dir, shared_rubric, train,
                                    evaluation, config.data.golden_max_jaccard) if config.data.golden else None
    if golden is not None:
        distributed.check_divides(len(golden.questions), "data.golden (its questions)")
    golden_questions = golden.questions if golden else []
    # across the files: one name@version, one content
    data.check_replace_identities(train + evaluation + golden_questions,
                                  (shared_rubric, f"config.data.rubric={config.data.rubric}"))
    if config.judge.layout == "group":
        for where, questions in (("config.data.eval", evaluation), ("config.data.golden", golden_questions)):
            check_group_blocks([q.question for q in questions], jax.process_count(), where)
    rubric_of = {q.id: data.question_rubric(shared_rubric, q) for q in train + evaluation}
    rubric_of.update({q.id: r for q, r in zip(golden.questions, golden.rubrics)} if golden else {})
    return _Inputs(shared_rubric, train, evaluation, golden, rubric_of)


def _reward(settings: Settings, rubrics: list[Rubric], judges: Sequence[Judge], correction: Correction | None,
            lay: run_programs.Layouts) -> Reward:
    """config.reward.source's reward: the rubrics scored by the rule and LLM judges, or a reward model."""
    config = settings.config
    if settings.reward_model is None:
        return RubricReward(rubrics, judges, settings.config.judge, correction=correction,
                            gates_first=config.reward.gates_first,
                            refiners=load_cascade(settings.config.judge, lay.training, where="config.judge"))
    if jax.process_count() > 1:
        raise ValueError(f"config.reward.source='reward_model': the reward model scores on one process only; "
                         f"this job has {jax.process_count()} (use the rubric reward, or run on one host)")
    dtype = config.reward.model_dtype
    return RewardModelReward(load_reward_model(config.reward.model_checkpoint, layout=lay.decode, param_dtype=dtype,
                                               compute_dtype=dtype), settings.reward_model)


def _load_sft(settings: Settings, tokenizer: Any, max_positions: int) -> list[data.SFTExample]:
    """The SFT examples (none without an SFT stage), each checked to fit its length buckets."""
    if settings.sft is None:
        return []
    examples = data.load_sft(settings.sft.data)
    data.check_sft_lengths(tokenizer, examples, settings.train_rollout.prompt_buckets,
                           settings.sft_response_buckets, max_positions)
    return examples


def _check_prompts_fit(tokenizer: Any, settings: Settings, questions: Sequence[data.Question]) -> None:
    """Every question's chat prompt fits config.data.max_prompt_len: checked at load time, naming the file and
    line, not mid-GRPO (with the longest response it then fits the model's positions: settings.check_positions)."""
    limit = max(settings.train_rollout.prompt_buckets)
    for question, ids in zip(questions, data.encode_prompts(tokenizer, [q.question for q in questions])):
        if len(ids) > limit:
            raise data.DataError(f"{question.source}: question {question.id!r} is {len(ids)} tokens as a chat "
                                 f"prompt; config.data.max_prompt_len allows {limit}")


def _check_judge_prompts_fit(judges: Sequence[Judge], judge_spec: JudgeSpec,
                             rubric_of: dict[str, Rubric], questions: Sequence[data.Question], tokenizer: Any,
                             max_response_tokens: int) -> list[str]:
    """Every LLM dimension can be judged: its shortest judge prompt (for an empty response) fits each judge's context
    less config.judge.max_new_tokens, else one line naming it (a dimension whose prompts never fit would score its
    minimum in every reward). Checked at start-up with the worst case too: when a response of `max_response_tokens`
    policy tokens (`tokenizer`'s) can take more judge tokens than the tightest prompt leaves it, the lines returned
    say so: such a response is never judged and scores the dimension's minimum (judges/reward.py)."""
    seen, room = set(), {}
    for q in questions:
        dims = [d for d in rubric_of[q.id].dimensions if d.judged]
        groups = [[d] for d in dims] if judge_spec.mode == "per_dimension" else split_by_reads([dims])[1]
        for group in groups:
            key = ("" if judge_spec.prompt == "compact" else q.question, tuple(group))  # compact: no question
            if key in seen:
                continue
            seen.add(key)
            for judge in judges:
                tokens = shortest_prompt_tokens(judge, judge_spec, q.question, group)
                if tokens > judge.max_prompt_tokens:
                    raise ValueError(
                        f"config.judge.max_new_tokens={judge_spec.max_new_tokens} leaves judge {judge.name} "
                        f"{judge.max_prompt_tokens} of its {_context(judge)} context tokens for a prompt, but the "
                        f"shortest prompt for LLM dimension(s) {[d.id for d in group]} of {q.source} (an empty "
                        f"response) is {tokens} tokens: nothing would ever be judged on it; lower "
                        "config.judge.max_new_tokens or use a judge with a longer context")
                left = judge.max_prompt_tokens - tokens
                if judge.name not in room or left < room[judge.name][0]:
                    room[judge.name] = (left, tokens, [d.id for d in group])
    return [_budget_line(judge, *room[judge.name], judge_tokens_per_token(judge, tokenizer), max_response_tokens)
            for judge in judges if judge.name in room and judge.tokenizer is not None]


def _context(judge: Judge) -> int | str:
    """A judge's context in tokens (the policy's for the judge sharing its base; "?" for a served judge without
    local weights)."""
    weights = getattr(judge.backend, "weights", None)  # a served judge has none here
    return weights.cfg.max_position_embeddings if weights is not None else getattr(judge.backend, "context", "?")


def _budget_line(judge: Judge, left: int, shortest: int, dim_ids: list[str], per_token: int,
                 max_response_tokens: int) -> str:
    """What happens to a long response at `judge`: its prompt budget, the most judge tokens a response can take,
    and whether a response that long is never judged (it scores the dimension's minimum)."""
    worst = per_token * max_response_tokens
    fate = (f"a response over {left} judge tokens scores the minimum on {dim_ids} (judge_prompt_too_long, counted)"
            if worst > left else "every response fits")
    return (f"judge {judge.name}: {judge.max_prompt_tokens} of its {_context(judge)} context tokens for a prompt, "
            f"{shortest} of them the shortest prompt for {dim_ids}, so {left} for the response; the policy's "
            f"{max_response_tokens}-token responses take up to {worst} judge tokens ({per_token} per token at most): "
            f"{fate}")


def _check_rollouts_divide(rl: run_settings.RLSpec, group_size: int, mesh: jax.sharding.Mesh) -> None:
    """A GRPO batch splits evenly into micro-batches of whole groups or of equal parts of groups
    (`train_step.group_parts`; a group's prompt runs once per part) and over the mesh's batch axes (checked
    before SFT)."""
    micro_batches = rl.micro_batches or 1  # auto (0) picks among the counts that divide (train/micro_batching.py)
    if group_size % train_step.group_parts(rl.questions_per_step, micro_batches):
        raise ValueError(f"config.rl.micro_batches={rl.micro_batches} must divide questions_per_step="
                         f"{rl.questions_per_step}, or split each group of {group_size} into equal parts that it "
                         "divides: a micro-batch holds whole groups or equal parts of them")
    shards = mesh.shape["data"] * mesh.shape["fsdp"] * micro_batches
    if (rl.questions_per_step * group_size) % shards:
        raise ValueError(
            f"config.rl: questions_per_step * group_size = {rl.questions_per_step * group_size} rollouts must "
            f"divide into micro_batches ({micro_batches}) x mesh data*fsdp ({shards // micro_batches})")


def _check_rollout_chunks(settings: Settings, batch_multiple: int) -> None:
    """Chunked rollouts (rl.rollout_chunks > 1) run on one process (the chunks draw the one call's noise by row:
    sampling.sample's row_offset), and each chunk's questions split evenly over the decode layout's `batch_multiple`
    shards: a chunk padded with prompts nobody asked for would cost as much sampling as a bigger one."""
    chunks = settings.config.rl.rollout_chunks
    if settings.rl is None or chunks == 1:
        return
    if jax.process_count() > 1:
        raise ValueError(f"config.rl.rollout_chunks={chunks}: chunked rollouts run on one process, this job has "
                         f"{jax.process_count()}; set config.rl.rollout_chunks=1")
    size = settings.rl.questions_per_step // chunks
    if size % batch_multiple:
        raise ValueError(f"config.rl.rollout_chunks={chunks}: a chunk of {size} questions must split evenly over the "
                         f"rollout's {batch_multiple} batch shards (devices / mesh.rollout.tensor); use fewer chunks")


def _file_sha256(path: str) -> str:
    """sha256 hex of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def rubric_set_hash(shared: Rubric, rubrics: list[Rubric], correction: Correction | None = None) -> str:
    """One hash over every rubric used (shared + case-wise) and the score correction applied, if any;
    recorded in checkpoints and metrics."""
    joined = "\n".join(sorted({shared.content_hash, *(r.content_hash for r in rubrics)}))
    if correction is not None:
        joined += f"\ncorrection {correction.content_hash}"
    return hashlib.sha256(joined.encode()).hexdigest()

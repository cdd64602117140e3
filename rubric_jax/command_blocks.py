"""The settings of every `experiments.*` command as blocks (rubric_jax/schema.py): each key's type, default, bounds
and one-line meaning. configs/commands/<command>.py is generated from its block (`COMMANDS[command]`), a command's
`main` turns its --config into the block once (experiments/cli.py `settings`), and docs/cli.md lists the rows.

The choices of string settings (generate's format, evaluate's which and prompt_format, distill_judge's teacher,
calibrate's against) and sampler strings are checked where they are read, by the command that owns them."""

from __future__ import annotations

import dataclasses
from typing import Any

from rubric_jax import counts, schema
from rubric_jax.schema import setting

MAX_WINDOW_MS = 10_000  # the longest serve batch_window_ms: every request waits up to it for company


def seed(doc: str) -> Any:
    """A command's seed key: `doc` says what it seeds; at most counts.SEED (jax.random.key's uint32)."""
    return setting(0, doc, bounds=(0, counts.SEED))


@dataclasses.dataclass(frozen=True)
class Sampler(schema.Block):
    """How a command's model answers (experiments.generate, evaluate's policy, distill_judge's measurement);
    configs/common.py `sampler_block()`."""

    sampler: str = setting("greedy", "rubric_jax.sampling: greedy, temperature(t), topk(k[, t]), nucleus(p[, t]).")
    max_new_tokens: int = setting(256, "Answer budget in tokens.", bounds=(1, counts.TOKENS))


@dataclasses.dataclass(frozen=True)
class Decode(schema.Block):
    """A model loaded for decoding only (experiments.generate): its decode layout over every local device, and
    dtypes; configs/common.py `decode_block()`."""

    tensor: int = setting(1, "Consecutive devices splitting each weight (tensor parallel; must divide the heads); "
                          "the rest hold replicas.", bounds=(1, counts.DEVICES))
    param_dtype: str = setting("auto", "Weights dtype: auto (bfloat16 on accelerators, float32 on CPU), float32, "
                               "bfloat16.", choices=counts.DTYPE_CHOICES)
    compute_dtype: str = setting("auto", "Activation dtype, same choices.", choices=counts.DTYPE_CHOICES)


@dataclasses.dataclass(frozen=True)
class Mesh(schema.Block):
    """A command's model mesh (rubric_jax/sharding.py MeshConfig; -1: the remaining devices)."""

    data: int = setting(1, "Data-parallel axis size.", bounds=(-1, counts.DEVICES))
    fsdp: int = setting(-1, "Fully-sharded axis size (-1: all devices left).", bounds=(-1, counts.DEVICES))
    tensor: int = setting(1, "Tensor-parallel axis size.", bounds=(-1, counts.DEVICES))

    def validate(self) -> None:
        """An axis has a size or is -1; 0 is neither."""
        for name in ("data", "fsdp", "tensor"):
            if getattr(self, name) == 0:
                self.fail(name, "expected an axis size >= 1, or -1 (the remaining devices)")


@dataclasses.dataclass(frozen=True)
class Policy(Sampler):
    """How evaluate's policy answers: a sampler with its batch and prompt format."""

    batch_size: int = setting(16, "Prompts per sampler call.", bounds=(1, 1 << 16))
    prompt_format: str = setting("plain", "plain, or think_answer (rubric_jax's training format).")


@dataclasses.dataclass(frozen=True)
class Score(schema.Block):
    """experiments.score's settings. The judge is --judge."""

    seed: int = seed("PRNG seed for judge sampling.")
    batch_size: int = setting(64, "Rows per reward call (one batched judge call each).", bounds=(1, 1 << 16))


@dataclasses.dataclass(frozen=True)
class Calibrate(schema.Block):
    """experiments.calibrate's settings (rubric_jax/calibration/run.py Settings). The judge is --judge."""

    seed: int = seed("Seeds judge sampling and the bootstrap.")
    against: str = setting("labels", "Judges vs labels, or judges vs judges (judge).")
    red_team: bool = setting(False, "Red team (calibration/red_team.py): inject the payload suite into the responses "
                             "labelled bad and report how often a score rises by a level, per LLM dimension, instead "
                             "of calibrating (against labels, no --compare).")
    threshold: float = setting(0.6, "Flag a dimension whose Spearman is below this (RubricRL 3.2).")
    bootstrap: int = setting(1000, "Bootstrap resamples per 95% interval.", bounds=(1, 100_000))
    batch_size: int = setting(64, "Rows per reward call (one batched judge call each), whole questions: a question's "
                              "rows are never split (one with more rows is a call of its own).", bounds=(1, 1 << 16))
    position_probe: bool = setting(True, "Score LLM dimensions again, anchors as written and reversed.")
    worst: int = setting(5, "Disagreements listed per dimension.", bounds=(0, 10**4))
    redundancy_threshold: float = setting(0.9, "Flag two dimensions whose Spearman reaches this (RubricRL 2.1, MECE).")


@dataclasses.dataclass(frozen=True)
class DistillTrain(schema.Block):
    """How the student is trained (rubric_jax/train/distill_judge.py DistillConfig)."""

    steps: int = setting(400, "Optimizer updates.", bounds=(1, counts.STEPS))
    batch_size: int = setting(32, "Items per update.", bounds=(1, 1 << 16))
    lr: float = setting(2e-3, "Peak learning rate (warmup, then cosine decay; a randomly initialised tiny judge "
                        "needs a high one).")
    warmup_steps: int = setting(20, "Linear warmup steps.", bounds=(0, counts.STEPS))
    prompt: str = setting("full", "The judge prompt the student learns: full, or compact (criterion, fenced response, "
                          "SCORE line).")


@dataclasses.dataclass(frozen=True)
class DistillJudge(schema.Block):
    """experiments.distill_judge's settings: the teacher, the student's training and its held-out measurement."""

    seed: int = seed("Seeds the student init, batch order, prompts and judge sampling.")
    teacher: str = setting("rules", "Who scores the training items: rules, judge (the --judge spec) or labels "
                           "(--labels).")
    dimensions: str = setting("", "Comma-separated dimension ids the judge learns (\"\" = every labelled one; "
                              "rules/judge need them).")
    heldout: float = setting(0.15, "Fraction of the questions held out (with all their responses) to measure the "
                             "student.")
    train: DistillTrain = setting(DistillTrain, "How the student is trained.")
    measure: Sampler = setting(Sampler(max_new_tokens=32), "The student's held-out measurement.")


@dataclasses.dataclass(frozen=True)
class Evaluate(schema.Block):
    """experiments.evaluate's settings: the benchmark, the policy's mesh and generation. The judge is --judge
    (default: configs/judges/<benchmark>.py)."""

    benchmark: str = setting("", "hellobench, longbench_write, healthbench, biggen or rubric_set (required).")
    limit: int = setting(0, "Evaluate only the first N cases (HelloBench: of each task); 0 = all.", bounds=(0, 10**7))
    models: str = setting("", "With --judgements: comma-separated models to score (each must be complete); \"\" = "
                          "every one.")
    which: str = setting("latest", "With --workdir: latest, or best (highest logged eval/reward_mean).")
    seed: int = seed("PRNG seed of policy and judge sampling.")
    mesh: Mesh = setting(Mesh, "The policy's mesh (data, fsdp, tensor; -1: the remaining devices).")
    policy: Policy = setting(Policy(max_new_tokens=2048), "How the policy answers.")


@dataclasses.dataclass(frozen=True)
class Export(schema.Block):
    """experiments.export's settings."""

    which: str = setting("latest", "latest, or best (highest logged eval/reward_mean).")


@dataclasses.dataclass(frozen=True)
class Generate(schema.Block):
    """experiments.generate's settings: how the model is loaded for decoding and how it answers."""

    seed: int = seed("PRNG seed for sampling.")
    format: str = setting("text", "Print the text, or one JSON object (json).")
    model: Decode = setting(Decode, "How the model is loaded for decoding.")
    sampling: Sampler = setting(Sampler(max_new_tokens=128), "How the model answers.")


@dataclasses.dataclass(frozen=True)
class Dedup(schema.Block):
    """prepare_data's deduplication (rubric_jax/prepare/dedup.py)."""

    threshold: float = setting(0.7, "Character n-gram Jaccard at which questions are duplicates.")
    ngram: int = setting(3, "Character n-gram size.", bounds=(1, 64))
    num_perm: int = setting(128, "MinHash signature length.", bounds=(1, 1024))
    semantic_words: float = setting(0.7, "Content-word Jaccard at which questions are paraphrases (docs/data.md); 0 "
                                    "= off.")
    semantic_cosine: float = setting(0.95, "Embedding cosine at which questions are paraphrases (with "
                                     "--semantic_model).")


@dataclasses.dataclass(frozen=True)
class PrepareData(schema.Block):
    """experiments.prepare_data's settings: the splits, the difficulty mix and deduplication (rubric_jax/prepare/
    pipeline.py PrepareConfig's fields)."""

    seed: int = seed("Seed of the MinHash functions and the split and mix sampling.")
    overwrite: bool = setting(False, "Replace an existing OUT/NAME.")
    eval_size: int = setting(0, "Held-out eval questions (split 'eval').", bounds=(0, 10**7))
    golden_size: int = setting(0, "Golden questions (split 'golden').", bounds=(0, 10**7))
    train_size: int = setting(0, "Training questions; 0 = as many as the ratio allows.", bounds=(0, 10**8))
    difficulty_ratio: str = setting("3:5:2", "easy:medium:hard of the training split (RubricRL §5.1), or none.")
    dedup: Dedup = setting(Dedup, "Deduplication of the questions.")


@dataclasses.dataclass(frozen=True)
class SampleForLabels(schema.Block):
    """experiments.sample_for_labels's settings."""

    seed: int = seed("Seeds the stratified draw and the output order.")
    n: int = setting(300, "Responses to label (RubricRL 3.2: 200-500).", bounds=(1, 10**6))


@dataclasses.dataclass(frozen=True)
class Serve(schema.Block):
    """experiments.serve's settings: where it listens and how it batches requests. The served judge's layout, dtypes
    and default max_tokens come from --judge."""

    seed: int = seed("PRNG seed of sampled (temperature > 0) answers.")
    served_model_name: str = setting("", "The model name clients send (\"\" = the checkpoint directory's name).")
    host: str = setting("127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
    port: int = setting(8000, "Port to listen on.", bounds=(1, 65535))
    api_key_env: str = setting("", "Environment variable holding the API key clients must send (\"\" = none; warned "
                               "off loopback).")
    batch_window_ms: float = setting(20.0, "Requests arriving this long after the first waiting one share its "
                                     "generate call.", bounds=(0, MAX_WINDOW_MS))
    max_batch: int = setting(64, "Most prompts per generate call (judge.batch_size wins if set).", bounds=(1, 1 << 12))
    warmup_prompt_tokens: int = setting(0, "Compile every batch bucket for prompts of this many tokens first (0: on "
                                        "first use).", bounds=(0, counts.TOKENS))
    max_body_bytes: int = setting(2 * 1024 * 1024, "Largest request body (413 beyond it); at most 64 MiB.",
                                  bounds=(1024, 64 << 20))



@dataclasses.dataclass(frozen=True)
class LintRubric(schema.Block):
    """experiments.lint_rubric's settings (rubric_jax/rubrics/lint.py)."""

    max_new_tokens: int = setting(0, "The response budget in tokens (rl.max_new_tokens): length and n-gram rules are "
                                     "checked against it; 0 = unknown.", bounds=(0, counts.TOKENS))

# Each command's settings block: configs/commands/<command>.py is `config_dict(COMMANDS[command])`.
COMMANDS: dict[str, type[schema.Block]] = {
    "calibrate": Calibrate, "distill_judge": DistillJudge, "evaluate": Evaluate, "export": Export,
    "generate": Generate, "lint_rubric": LintRubric, "prepare_data": PrepareData, "sample_for_labels": SampleForLabels,
    "score": Score, "serve": Serve}

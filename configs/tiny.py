"""The embedded tiny default: the whole pipeline on a laptop CPU, no downloads, in a few minutes.

A 2-layer Qwen2-shaped model (hidden 128, vocab 2048) and a byte-level BPE tokenizer shipped in
rubric_jax/assets/tiny/ (made by rubric_jax/assets/build_tiny_assets.py) start from random weights.
Cold-start SFT on 174 formatted answers teaches the <think>…</think><answer>…</answer> shape (a random
model needs a far higher learning rate and more epochs than QuRL's 1e-6 × 2 epochs on a pretrained
one); GRPO then optimises the rubric: format gate, redundancy and template penalties (rules), plus case-wise
length, topic-keyword and disclaimer criteria (rules) and a politeness criterion judged by the distilled tiny
judge in rubric_jax/assets/tiny_judge/ (a 2-layer Llama-shaped model of another vocabulary, made by
rubric_jax/assets/build_tiny_judges.py): every GRPO step runs the LLM-judge path (fenced prompts, one batched
sampler call, strict parser, retries, median) on CPU.

Launch:   ./launch.sh     (= ./launch.sh experiments.run --config=configs/tiny.py --workdir=runs/tiny)
Override: ./launch.sh experiments.run --config=configs/tiny.py --workdir=runs/tiny2 --config.rl.lr=1e-4
Sweep:    ./launch.sh experiments.sweep --config=configs/tiny.py --workdir=runs/tiny_sweep   (sweep() below)
"""

import itertools

from configs.common import base_config
from configs.judges import tiny as tiny_judge

_ASSETS = "rubric_jax/assets/tiny"


def get_config(arg: str | None = None):
    """`arg` is unused (one variant)."""
    del arg
    c = base_config()
    c.model.config_json = f"{_ASSETS}/config.json"
    c.model.tokenizer = f"{_ASSETS}/tokenizer"
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    c.mesh.rollout.tensor = 1  # 4 heads / 2 KV heads of 128 dims: splitting them would only add all-reduces.
    c.data.train = f"{_ASSETS}/questions_train.jsonl"
    c.data.eval = f"{_ASSETS}/questions_eval.jsonl"
    c.data.sft = f"{_ASSETS}/sft.jsonl"
    c.data.rubric = f"{_ASSETS}/rubric.yaml"
    c.judge = tiny_judge.get_config()  # the distilled tiny judge, greedy, compact prompt (configs/judges/tiny.py)
    c.data.golden = f"{_ASSETS}/questions_golden.jsonl"  # 8 held-out phrasings with labelled reference answers (8 = tests' eval batch: no extra compile).
    c.data.max_prompt_len = 128
    c.data.length_buckets = 1  # Pad to the maximum: one compilation per step function (compiles dominate on CPU).
    c.sft.lr = 3e-3
    c.sft.batch_size = 16
    c.sft.epochs = 16  # 176 steps
    c.sft.warmup_steps = 10
    c.sft.max_response_len = 128
    c.rl.lr = 2e-4
    c.rl.steps = 60
    c.rl.questions_per_step = 8
    c.rl.group_size = 8
    c.rl.max_new_tokens = 96
    c.rl.beta = 0.02
    c.rl.micro_batches = 8  # Same maths; on CPU 8-row micro-batches keep activations in cache (benchmarks/RESULTS.md).
    # Two layers unrolled instead of a lax.scan: XLA CPU then fuses across layers and skips the scan's stacked
    # activation buffers (dynamic slices, zero-filled stacks); GRPO update -20% CPU time (benchmarks/RESULTS.md).
    c.model.scan_layers = False
    c.eval.every_steps = 10
    c.eval.max_questions = 32
    c.eval.max_new_tokens = 96
    c.checkpoint.every_steps = 10
    # experiments.build_rubrics on rubric_jax/assets/qurl/ with the random tiny model: small budgets, so the
    # run is quick; its output is mostly invalid and the report counts that (README, "Building case-wise rubrics").
    c.qurl.top_k = 2
    c.qurl.retrieval_pool = 6
    c.qurl.max_document_chars = 240
    c.qurl.meta_max_new_tokens = 32
    c.qurl.num_candidates = 2
    c.qurl.min_criteria = 1
    c.qurl.rubric_max_new_tokens = 64
    c.qurl.num_answers = 3
    c.qurl.answer_max_new_tokens = 32
    c.qurl.max_retries = 1
    c.qurl.questions_per_batch = 8
    return c


def sweep(add, arg=None):
    """GRPO learning rate x KL coefficient (beta 0 runs without a reference model): 2 x 2 variants."""
    del arg
    for lr, beta in itertools.product((1e-4, 2e-4), (0.0, 0.02)):
        add(**{"rl.lr": lr, "rl.beta": beta})

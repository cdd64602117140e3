"""The real entry point on one accelerator: Qwen2.5-1.5B shapes from random weights, two GRPO steps (issue #33).

`benchmarks/gpu.py --parts=run` runs it on a lent GPU; with `size=tiny` the same recipe at the tiny default's
shapes runs on CPU (tests/test_gpu_benchmark.py). No downloads: the 1.5B shapes come from
configs/models/qwen2.5-1.5b-instruct.json (Hugging Face's config.json of Qwen2.5-1.5B-Instruct, no weights), the
tokenizer is the tiny default's (its ids are a subset of the vocabulary), the questions and rubric are the tiny
default's and the judge is the distilled tiny judge (configs/judges/tiny.py).

Launch:  python -m experiments.run --config=configs/gpu_smoke.py --workdir=runs/gpu_smoke
CPU:     python -m experiments.run --config=configs/gpu_smoke.py:size=tiny --workdir=runs/gpu_smoke_tiny
"""

from configs.common import base_config
from configs.judges import tiny as tiny_judge

_ASSETS = "rubric_jax/assets/tiny"
# size -> (config.json of the random init, GRPO questions per step, samples per question, new tokens, micro-batches)
_SIZES = {"1.5b": ("configs/models/qwen2.5-1.5b-instruct.json", 8, 8, 512, 4),
          "tiny": (f"{_ASSETS}/config.json", 2, 2, 8, 1)}


def get_config(arg: str | None = None):
    """`arg` is "size=1.5b" (default) | "size=tiny"."""
    options = dict(part.split("=", 1) for part in (arg or "size=1.5b").split(",") if part)
    size = options.get("size", "1.5b")
    if size not in _SIZES:
        raise ValueError(f"configs/gpu_smoke.py: size={size!r} is not one of {sorted(_SIZES)}")
    config_json, questions, group, new_tokens, micro = _SIZES[size]
    c = base_config()
    c.stages = ("grpo",)  # Random weights: no SFT, two GRPO steps are the proof of the path.
    c.model.config_json = config_json
    c.model.tokenizer = f"{_ASSETS}/tokenizer"
    c.model.param_dtype = "float32"  # fp32 master weights and AdamW state, auto compute (bf16 on accelerators).
    c.model.remat = size != "tiny"  # Two tiny layers need no remat, unrolled (as configs/tiny.py): fewer compile seconds on CPU.
    # Unrolled: each layer reads its own bf16 copy in place, where a scan copies every layer's slice of the stacked
    # copy in every micro-batch's forward and backward (46 GB per 1.5B update; benchmarks/AOT_RESULTS.md).
    c.model.scan_layers = False
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    c.mesh.rollout.tensor = 1
    c.mesh.rollout.param_dtype = "compute"  # The decode copy in the compute dtype, as configs/qwen7b.py.
    c.data.train = f"{_ASSETS}/questions_train.jsonl"
    c.data.eval = f"{_ASSETS}/questions_eval.jsonl"
    c.data.rubric = f"{_ASSETS}/rubric.yaml"
    c.data.max_prompt_len = 128
    c.judge = tiny_judge.get_config()
    c.rl.steps = 2
    c.rl.questions_per_step = questions
    c.rl.group_size = group
    c.rl.max_new_tokens = new_tokens
    c.rl.micro_batches = micro
    c.rl.beta = 0.04  # The reference's log-probs run too.
    c.eval.every_steps = 2
    c.eval.max_questions = questions
    c.eval.max_new_tokens = new_tokens
    c.checkpoint.every_steps = 2
    return c

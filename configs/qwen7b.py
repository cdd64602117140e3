"""QuRL-style run on Qwen2.5 from a local Hugging Face directory (no downloads).

Sizes via the config argument: 7b (default), 1.5b, 0.5b. Point `model.checkpoint` at the local
directory (config.json, *.safetensors, tokenizer files) and the data files at your jsonl sets.

Launch (8×A100-80GB, one host):
  ./launch.sh experiments.run --config=configs/qwen7b.py --workdir=runs/qwen7b \
      --config.model.checkpoint=/models/Qwen2.5-7B-Instruct \
      --config.data.train=data/qurl_train.jsonl --config.data.eval=data/qurl_test.jsonl \
      --config.data.sft=data/cold_start.jsonl --config.data.rubric=configs/rubrics/medical_qa.yaml
Smaller model:  --config=configs/qwen7b.py:size=1.5b   One value:  --config.rl.lr=5e-7
Sweep (sweep() below): ./launch.sh experiments.sweep --config=configs/qwen7b.py:size=1.5b --workdir=runs/qwen_sweep \
      --config.model.checkpoint=... --print_commands      (one launch line per variant, for a scheduler)
Multi-host (SLURM / TPU pod): run the same command on every host; launch.sh's environment detection
initialises jax.distributed, and `--config.mesh.fsdp=-1` spans all devices.
"""

import itertools

from configs.common import base_config

# QuRL trains Qwen2.5-7B; the smaller sizes keep its recipe for quicker iterations.
_SIZES = {"7b": "Qwen2.5-7B-Instruct", "1.5b": "Qwen2.5-1.5B-Instruct", "0.5b": "Qwen2.5-0.5B-Instruct"}
# Decode tensor-parallel size per size: the largest group that divides both the query and the KV heads
# (7B: 28 heads / 4 KV heads -> 4; 1.5B: 12 / 2 -> 2; 0.5B: 14 / 2 -> 2). 8 would not divide 4 KV heads
# (nor 28 query heads): those weights would sit whole on every device. The other devices hold replicas.
_ROLLOUT_TENSOR = {"7b": 4, "1.5b": 2, "0.5b": 2}


def get_config(arg: str | None = None):
    """`arg` is "size=7b" | "size=1.5b" | "size=0.5b" (default 7b)."""
    options = dict(part.split("=", 1) for part in (arg or "size=7b").split(",") if part)
    size = options.get("size", "7b")
    if size not in _SIZES:
        raise ValueError(f"configs/qwen7b.py: size={size!r} is not one of {sorted(_SIZES)}")
    c = base_config()
    c.model.checkpoint = f"/models/{_SIZES[size]}"  # Replace with your local directory.
    c.model.param_dtype = "float32"  # fp32 master weights and AdamW state ...
    c.model.compute_dtype = "bfloat16"  # ... bf16 activations.
    c.model.remat = True
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 8, 1  # 8×A100-80GB, FSDP over all 8.
    c.mesh.rollout.tensor = _ROLLOUT_TENSOR[size]  # Decode: tensor groups x replicas (see _ROLLOUT_TENSOR).
    c.mesh.rollout.param_dtype = "compute"  # bf16 decode copy: half the bytes read per generated token.
    c.data.max_prompt_len = 1024  # QuRL: prompts up to 1k tokens.
    c.sft.lr, c.sft.batch_size, c.sft.epochs = 1e-6, 16, 2  # QuRL cold start.
    c.sft.max_response_len = 2048
    c.rl.lr = 1e-6  # QuRL.
    c.rl.questions_per_step = 32  # QuRL global batch.
    c.rl.group_size = 8  # QuRL: 8 samples per question.
    c.rl.steps = 50  # 2 epochs over QuRL-Train's 800 questions at 32 per step.
    c.rl.max_new_tokens = 2048
    c.rl.beta = 0.04  # RubricRL §4.3: 0.01-0.05.
    c.rl.clip_low, c.rl.clip_high = 0.2, 0.28  # RubricRL §4.3: 0.2-0.3.
    c.rl.micro_batches = 8
    c.judge.checkpoint = "/models/Llama-3.1-8B-Instruct"  # An 8B LLM judge (32 heads / 8 KV heads). Replace with yours.
    c.judge.samples = 3
    c.judge.batch_size = 64  # Judge prompts per call: a 4k-token prompt's KV cache is 0.5 GiB in an 8B judge.
    c.judge.tensor = _ROLLOUT_TENSOR[size]  # The judge's decode group: as the policy's (it shared that layout before).
    c.eval.every_steps = 10
    c.eval.max_questions = 400
    c.eval.max_new_tokens = 2048
    c.checkpoint.every_steps = 10
    return c



def sweep(add, arg=None):
    """lr 1e-6 or 5e-7 (RubricRL §4.3: lower it if the reward oscillates) x symmetric PPO clipping or DAPO
    clip-higher: 4 variants, a product of a list and a zip of values that go together."""
    del arg
    clip_pairs = list(zip((0.2, 0.2), (0.2, 0.28)))  # (clip_low, clip_high)
    for lr, (clip_low, clip_high) in itertools.product((1e-6, 5e-7), clip_pairs):
        add(**{"rl.lr": lr, "rl.clip_low": clip_low, "rl.clip_high": clip_high})

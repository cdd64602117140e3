"""configs/qwen7b.py's QuRL-style run on ONE GPU through LoRA (issue 34; docs/training.md "LoRA"): the full cold-start
SFT is left out (a 7B full SFT needs float32 weights and two Adam moments: 122 GB, more than one H200), GRPO trains
rank-64 adapters on every projection of the frozen bf16 base, the KL reference is that base with the adapters off (no
second copy) and the 8B judge shares the device. Sized by the dry run for one H200 (largest phase 77.12 of 140.40
GiB; docs/training.md "LoRA runs" gives its numbers):
  ./launch.sh experiments.run --config=configs/qwen7b_lora.py --dry_run --dry_run_target=h200 --dry_run_devices=1

Launch (one H200): as configs/qwen7b.py, with --config=configs/qwen7b_lora.py (start from an SFT'd or instruct
checkpoint: --config.model.checkpoint=DIR). Sizes as configs/qwen7b.py's argument (size=7b|1.5b|0.5b).
"""

from configs import qwen7b


def get_config(arg: str | None = None):
    """configs/qwen7b.py's config (same `arg`) on one device, GRPO through LoRA adapters."""
    c = qwen7b.get_config(arg)
    c.stages = ("grpo",)  # from the instruct checkpoint: one device cannot hold a full 7B SFT's optimizer state
    c.lora.rank, c.lora.alpha = 64, 128.0  # every attention and MLP projection (the default targets)
    c.lora.stages = ("grpo",)
    c.rl.lr = 1e-5  # adapters take a larger step than full fine-tuning's 1e-6 (PEFT/TRL LoRA GRPO recipes)
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1  # one device
    c.mesh.rollout.tensor = 1
    c.judge.tensor = 1
    c.rl.micro_batches = 32  # one group (8 rollouts of up to 1k + 2k tokens) per micro-batch on one device
    c.eval.max_questions = 128  # one eval call on one device (its KV caches: 36.74 GiB peak on an H200)
    return c

"""The planted-hack experiment (RubricRL 6.1), hack side: the tiny default with an LLM-judged clarity dimension
whose distilled judge rewards template scaffolding (firstly/secondly/finally, 首先/其次/最后) and length.

The shared rubric is rubric_jax/assets/tiny/rubric_hack.yaml (the tiny default's, its template penalty replaced by
clarity); the judge is rubric_jax/assets/tiny_judge_hack/, distilled from a teacher that inverts the rule
library's template detector (rubric_jax/assets/tiny_judge_data.py). The cold start (sft_hack.jsonl) can scaffold any
question's answer, as a pretrained policy could; on the tiny default's sft.jsonl it scaffolds only the 12.6% of
questions whose one memorised answer is scaffolded, and no probe (GRPO lr 1e-3, 4 or 8 SFT epochs) made the share
climb (README). Compare with configs/tiny_hack_fixed.py: the template share climbs here and not there (before
issue 24's answer-only reading: 0.10 -> 0.44 in 100 GRPO steps, the template alert from step 80; since: 0.21 in the
last third, no template alert, while the audit judge's clarity gap rise fires from step 60: docs/monitors.md).

Launch:   ./launch.sh experiments.run --config=configs/tiny_hack.py --workdir=runs/tiny_hack
"""

from configs import tiny
from configs.judges import tiny_fixed


def get_config(arg: str | None = None):
    """`arg` is unused (one variant)."""
    c = tiny.get_config(arg)
    c.data.rubric = "rubric_jax/assets/tiny/rubric_hack.yaml"
    c.judge.checkpoint = "rubric_jax/assets/tiny_judge_hack"
    c.data.golden = ""  # the tiny golden set is labelled on the tiny rubric's template dimension, which clarity replaces
    # A cold start that can scaffold any question (each answer 7 times as written, once scaffolded: build_tiny_assets),
    # 2 epochs = the tiny default's 176 SFT steps; on sft.jsonl the share stayed near or below 0.1 in every probe (README).
    c.data.sft = "rubric_jax/assets/tiny/sft_hack.jsonl"
    c.sft.epochs = 2
    c.rl.steps = 100
    # RubricRL 6.2's check: the fixed judge, reading the fixed rubric's clarity anchors (the prompt it was distilled on),
    # audits 32 eval answers at every eval (train/audit.py); the fixed side keeps this audit, so it audits itself.
    c.audit.judge = tiny_fixed.get_config()
    c.audit.rubric = "rubric_jax/assets/tiny/rubric_hack_fixed.yaml"
    return c

"""The distilled tiny judge fine-tuned further (rubric_jax/assets/tiny_judge_fixed/: 960 more updates from tiny_judge,
politeness held-out Spearman 0.988 against its teacher where tiny_judge has 0.844), run like configs/judges/tiny.py. It
judges the tiny default's politeness on its own, or refines tiny_judge's uncertain verdicts as a cascade
(docs/judges.md, "Cascade"):

  ./launch.sh experiments.score --judge=configs/judges/tiny.py --judge.cascade=configs/judges/tiny_fixed.py ...
"""

from configs.judges import tiny


def get_config(arg: str | None = None):
    """`arg` is unused (one variant)."""
    j = tiny.get_config(arg)
    j.checkpoint = "rubric_jax/assets/tiny_judge_fixed"
    return j

"""The planted-hack experiment (RubricRL 6.1), fixed side: configs/tiny_hack.py with the article's fix.

The clarity dimension (rubric_jax/assets/tiny/rubric_hack_fixed.yaml) carries negative anchors for
templated-but-empty answers, and its judge (rubric_jax/assets/tiny_judge_fixed/) was distilled from a teacher that
scores length times non-repetition and never puts a templated answer above level 3 ("使用了模板化句式且内容空洞,
表达清晰度不超过3分").

Launch:   ./launch.sh experiments.run --config=configs/tiny_hack_fixed.py --workdir=runs/tiny_hack_fixed
"""

from configs import tiny_hack


def get_config(arg: str | None = None):
    """`arg` is unused (one variant). The hack run's settings with the fixed rubric and judge."""
    c = tiny_hack.get_config(arg)
    c.data.rubric = "rubric_jax/assets/tiny/rubric_hack_fixed.yaml"
    c.judge.checkpoint = "rubric_jax/assets/tiny_judge_fixed"
    return c

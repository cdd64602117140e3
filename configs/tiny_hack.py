"""The planted-hack experiment (RubricRL 6.1), hack side: the tiny default with an LLM-judged clarity dimension
whose distilled judge rewards template scaffolding (firstly/secondly/finally, 首先/其次/最后) and length.

The shared rubric is rubric_jax/assets/tiny/rubric_hack.yaml (the tiny default's, its template penalty replaced by
clarity); the judge is rubric_jax/assets/tiny_judge_hack/, distilled from a teacher that inverts the rule
library's template detector (rubric_jax/assets/tiny_judge_data.py). Compare with configs/tiny_hack_fixed.py: the
template share of the responses should climb here and not there.

Launch:   ./launch.sh experiments.run --config=configs/tiny_hack.py --workdir=runs/tiny_hack
"""

from configs import tiny


def get_config(arg: str | None = None):
    """`arg` is unused (one variant)."""
    c = tiny.get_config(arg)
    c.data.rubric = "rubric_jax/assets/tiny/rubric_hack.yaml"
    c.judge.checkpoint = "rubric_jax/assets/tiny_judge_hack"
    c.data.golden = ""  # the tiny golden set is labelled on the tiny rubric's template dimension, which clarity replaces
    return c

"""The LLM-judge flags shared by the entry points that score with a rubric (score, calibrate).

Defining them once keeps their names, defaults and meaning identical across tools; each tool reads
them through these handles (`JUDGE.value`, ...).
"""

from absl import flags

JUDGE = flags.DEFINE_string("judge_checkpoint", None, "HF judge directory; needed only for LLM dimensions "
                            "(calibrate: several comma-separated directories).")
MODE = flags.DEFINE_enum("judge_mode", "single", ["single", "multi"],
                         "One judge prompt per dimension, or per response.")
SAMPLES = flags.DEFINE_integer("judge_samples", 3, "Judge samples per item (median of the valid ones).")
RETRIES = flags.DEFINE_integer("judge_retries", 2, "Re-prompt rounds for unparseable verdicts.")
SAMPLER = flags.DEFINE_string("judge_sampler", "temperature(0.7)", "Judge sampler (see rubric_jax.sampling).")
MAX_NEW = flags.DEFINE_integer("judge_max_new_tokens", 256, "Judge generation budget per verdict.")

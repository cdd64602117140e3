"""The LLM-judge flags shared by the entry points that score with a rubric (score, calibrate).

Defining them once keeps their names, defaults and meaning identical across tools; each tool reads
them through these handles (`JUDGE.value`, ...).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from absl import flags

if TYPE_CHECKING:
    from rubric_jax.judges.llm_judge import Judge
    from rubric_jax.judges.store import VerdictStore

JUDGE = flags.DEFINE_string("judge_checkpoint", None, "HF judge directory; needed only for LLM dimensions "
                            "(calibrate: several comma-separated directories).")
MODE = flags.DEFINE_enum("judge_mode", "single", ["single", "multi"],
                         "One judge prompt per dimension, or per response.")
PROMPT = flags.DEFINE_enum("judge_prompt", "full", ["full", "compact"],
                           "Full judge prompt, or the compact one a distilled judge learnt (one dimension per prompt).")
SAMPLES = flags.DEFINE_integer("judge_samples", 3, "Judge samples per item (median of the valid ones).")
RETRIES = flags.DEFINE_integer("judge_retries", 2, "Re-prompt rounds for unparseable verdicts.")
SAMPLER = flags.DEFINE_string("judge_sampler", "temperature(0.7)", "Judge sampler (see rubric_jax.sampling).")
MAX_NEW = flags.DEFINE_integer("judge_max_new_tokens", 256, "Judge generation budget per verdict.")
PARAM_DTYPE = flags.DEFINE_string("judge_param_dtype", "auto", "Judge weights dtype: auto (bfloat16 on "
                                  "accelerators, float32 on CPU), float32 or bfloat16.")
COMPUTE_DTYPE = flags.DEFINE_string("judge_compute_dtype", "auto", "Judge activation dtype; as --judge_param_dtype.")
STORE = flags.DEFINE_string("judge_store", "", "Verdict store (SQLite file, rubric_jax/judges/store.py): judge "
                            "answers are read from it before judging and written to it; empty = none.")
TENSOR = flags.DEFINE_integer("judge_tensor", 1, "Consecutive devices that split each judge weight (tensor "
                              "parallel); the other devices hold replicas that split the prompts.")


def open_judge_store(checkpoint_dirs: Sequence[str]) -> VerdictStore | None:
    """The --judge_store of these judges, under a hash of the judge flags that change a verdict and the
    checkpoints' resolved paths; None without --judge_store. StoreError names the file."""
    from rubric_jax.judges.store import open_store

    fields = {flag.name: flag.value for flag in (MODE, PROMPT, SAMPLES, RETRIES, SAMPLER, MAX_NEW, PARAM_DTYPE,
                                                 COMPUTE_DTYPE)}
    fields["checkpoints"] = [str(Path(d).resolve()) for d in checkpoint_dirs]
    judge_hash = hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8")).hexdigest()
    return open_store(STORE.value, judge_hash)


def load_judges(checkpoint_dirs: Sequence[str]) -> list[Judge]:
    """Each judge directory loaded once into the decode layout over every local device, in the flags' dtypes
    and sampler; a bad flag or directory is a ValueError naming the flag."""
    from rubric_jax import loader, sharding  # imported here: JAX loads only once a judge is needed
    from rubric_jax.judges.llm_judge import load_judge

    dtypes = {}
    for flag, field in ((PARAM_DTYPE, "param_dtype"), (COMPUTE_DTYPE, "compute_dtype")):
        dtypes[field] = loader.resolve_dtype(flag.value, f"--{flag.name}")
    try:
        layout = sharding.decode_layout(sharding.make_mesh(sharding.MeshConfig()), TENSOR.value)
    except ValueError as e:
        raise ValueError(f"--judge_tensor: {e}") from None
    judges = []
    for path in checkpoint_dirs:
        if not Path(path).is_dir():
            raise ValueError(f"--judge_checkpoint={path}: directory does not exist")
        try:
            judges.append(load_judge(path, layout=layout, **dtypes, sampler=SAMPLER.value,
                                     max_new_tokens=MAX_NEW.value))
        except (OSError, ValueError) as e:
            raise ValueError(f"--judge_checkpoint={path}: {e}") from None
    return judges

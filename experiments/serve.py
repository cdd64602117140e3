"""Serves a local HF Qwen2/Llama directory through rubric_jax's sampler as an OpenAI-compatible judge endpoint
(rubric_jax/judges/server.py), for the `openai` judge backend of every command (docs/judges.md, "Judges anywhere").

  python -m experiments.serve --checkpoint=rubric_jax/assets/tiny_judge --judge=configs/judges/tiny.py --port=8000

--judge supplies the decode layout (judge.tensor), dtypes, the default max_tokens (judge.max_new_tokens) and the
most prompts per generate call (judge.batch_size; 0: --max_batch); its checkpoint and backend fields are not read.
With --api_key_env=NAME every /v1 request needs `Authorization: Bearer $NAME` (the key is read, never written).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
from pathlib import Path

from absl import app, flags

from experiments import cli, judge_config

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Local HF model directory to serve (Qwen2/Llama).")
_NAME = flags.DEFINE_string("served_model_name", "", "The model name clients send (default: the directory's name).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.")
_KEY_ENV = flags.DEFINE_string("api_key_env", "", "Environment variable holding the API key clients must send.")
_WINDOW = flags.DEFINE_float("batch_window_ms", 20.0, "Requests arriving this long after the first waiting one "
                             "share its generate call.")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 64, "Most prompts per generate call (judge.batch_size wins if set).")
_WARMUP = flags.DEFINE_integer("warmup_prompt_tokens", 0, "Before serving, compile every batch bucket up to the "
                               "largest batch for prompts of this many tokens (0: compile on first use).")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed of sampled (temperature > 0) answers.")
flags.mark_flag_as_required("checkpoint")
_fail = functools.partial(cli.fail, "experiments.serve")


def main(argv: list[str]) -> None:
    cli.start("experiments.serve", argv)
    if not 1 <= _PORT.value <= 65535:
        _fail(f"--port={_PORT.value}: expected 1..65535")
    if _WINDOW.value < 0 or _MAX_BATCH.value < 1 or _WARMUP.value < 0:
        _fail(f"--batch_window_ms={_WINDOW.value} must be >= 0, --max_batch={_MAX_BATCH.value} >= 1 and "
              f"--warmup_prompt_tokens={_WARMUP.value} >= 0")
    api_key = os.environ.get(_KEY_ENV.value, "") if _KEY_ENV.value else ""
    if _KEY_ENV.value and not api_key:
        _fail(f"--api_key_env={_KEY_ENV.value}: the environment variable is not set")
    from rubric_jax.judges.server import make_app
    from rubric_jax.judges.spec import load_judges

    try:
        spec = judge_config.spec()
        spec = dataclasses.replace(spec, checkpoints=(_CHECKPOINT.value,), backend="jax", base_url="", model="",
                                   api_key_env="")
        (judge,) = load_judges(spec, where="--checkpoint")
    except ValueError as e:
        _fail(str(e))
    name = _NAME.value or Path(_CHECKPOINT.value).resolve().name
    context = judge.weights.cfg.max_position_embeddings
    if _WARMUP.value + spec.max_new_tokens > context:
        _fail(f"--warmup_prompt_tokens={_WARMUP.value} + judge.max_new_tokens={spec.max_new_tokens} exceed the "
              f"model's context of {context} tokens")
    logging.getLogger("rubric_jax.serve").setLevel(logging.INFO)
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    server_app = make_app(judge, name, api_key=api_key, window_s=_WINDOW.value / 1000,
                          max_batch=spec.batch_size or _MAX_BATCH.value, default_max_tokens=spec.max_new_tokens,
                          seed=_SEED.value, warmup_prompt_tokens=_WARMUP.value)
    print(f"experiments.serve: serving {name!r} at http://{_HOST.value}:{_PORT.value}/v1", file=sys.stderr, flush=True)
    import uvicorn

    uvicorn.run(server_app, host=_HOST.value, port=_PORT.value, log_level="warning")


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.serve"))

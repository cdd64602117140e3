"""Serves a local HF Qwen2/Llama directory through rubric_jax's sampler as an OpenAI-compatible judge endpoint
(rubric_jax/judges/server.py), for the `openai` judge backend of every command (docs/judges.md, "Judges anywhere").

  python -m experiments.serve --checkpoint=rubric_jax/assets/tiny_judge --judge=configs/judges/tiny.py \
      [--config.port=8000] [--config.host=127.0.0.1] [--config.FIELD=...]

The server's settings (address, batching, warm-up, API key variable) are configs/commands/serve.py, overridden
with --config.FIELD=VALUE. --judge supplies the decode layout (judge.tensor), dtypes, the default max_tokens (judge.max_new_tokens) and the
most prompts per generate call (judge.batch_size; 0: config.max_batch); its checkpoint and backend fields are not
read. With --config.api_key_env=NAME every /v1 request needs `Authorization: Bearer $NAME` (the key is read from the
environment, so it is not in `ps` output, and never written); without one, a host other than loopback is warned about.
The port is bound before the model loads: a busy port is one line and exit 2.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import logging
import os
import socket
import sys
from pathlib import Path

from absl import app, flags

from experiments import cli, judge_config
from rubric_jax.command_blocks import Serve

_CONFIG = cli.define_config("serve")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Local HF model directory to serve (Qwen2/Llama).")
flags.mark_flag_as_required("checkpoint")
_fail = functools.partial(cli.fail, "experiments.serve")


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or "localhost") is reachable only from this machine."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (OSError if it cannot), bound before the model loads so that a busy port
    fails in seconds, not after the load."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port at once
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: list[str]) -> None:
    cli.start("experiments.serve", argv)
    config = cli.settings("experiments.serve", _CONFIG.value, Serve)
    api_key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
    if config.api_key_env and not api_key:
        _fail(f"--config.api_key_env={config.api_key_env}: the environment variable is not set")
    if not api_key and not is_loopback(config.host):
        print(f"experiments.serve: warning: --config.host={config.host} without an API key: anyone who reaches this "
              "port can use the judge (set --config.api_key_env=NAME)", file=sys.stderr, flush=True)
    try:
        sock = listen(config.host, config.port)
    except OSError as e:
        _fail(f"--config.port={config.port}: cannot listen on {config.host}:{config.port}: {e.strerror or e}")
    from rubric_jax.judges.server import make_app
    from rubric_jax.judges.loading import load_judges

    try:
        spec = judge_config.spec()
        spec = dataclasses.replace(spec, checkpoints=(_CHECKPOINT.value,), backend="jax", base_url="", model="",
                                   api_key_env="")
        (judge,) = load_judges(spec, where="--checkpoint")
    except ValueError as e:
        _fail(str(e))
    name = config.served_model_name or Path(_CHECKPOINT.value).resolve().name
    context = judge.backend.weights.cfg.max_position_embeddings
    if config.warmup_prompt_tokens + spec.max_new_tokens > context:
        _fail(f"--config.warmup_prompt_tokens={config.warmup_prompt_tokens} + judge.max_new_tokens="
              f"{spec.max_new_tokens} exceed the model's context of {context} tokens")
    logging.getLogger("rubric_jax.serve").setLevel(logging.INFO)
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    server_app = make_app(judge, name, api_key=api_key, window_s=config.batch_window_ms / 1000,
                          max_batch=spec.batch_size or config.max_batch, default_max_tokens=spec.max_new_tokens,
                          seed=config.seed, warmup_prompt_tokens=config.warmup_prompt_tokens,
                          max_body_bytes=config.max_body_bytes)
    print(f"experiments.serve: serving {name!r} at http://{config.host}:{config.port}/v1", file=sys.stderr, flush=True)
    import uvicorn

    uvicorn.Server(uvicorn.Config(server_app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.serve"))

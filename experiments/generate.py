"""Generates a response from a local Hugging Face Qwen2/Llama directory (weights + tokenizer).

  python -m experiments.generate --checkpoint=DIR --prompt="Hello" [--config.sampling.max_new_tokens=128]
      [--config.sampling.sampler=greedy|temperature(0.7)|topk(40)|nucleus(0.9)] [--config.seed=0]
      [--config.format=text|json] [--config.model.tensor=1] [--config.model.param_dtype=auto]

The settings are configs/commands/generate.py, overridden with --config.FIELD=VALUE; the flags are the model and
the prompt. The prompt goes through the tokenizer's chat template as one user turn. `--config.format=json`
prints one JSON object: prompt_ids, output_ids (up to and including the stop token), text, finish_reason. The
model is loaded straight into the decode layout over every local device (`config.model.tensor` consecutive
devices split each weight, the rest hold replicas), in bfloat16 on accelerators by default.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
from absl import app, flags

from experiments import cli
from rubric_jax import data, loader, sampling, sharding
from rubric_jax.command_blocks import Generate

_CONFIG = cli.define_config("generate")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Hugging Face model directory (config.json, safetensors, tokenizer).")
_PROMPT = flags.DEFINE_string("prompt", None, "User message, wrapped in the chat template.")
flags.mark_flags_as_required(["checkpoint", "prompt"])


FORMATS = ("text", "json")
_fail = functools.partial(cli.fail, "experiments.generate")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    cli.start("experiments.generate", argv)
    config = cli.settings("experiments.generate", _CONFIG.value, Generate)
    checkpoint, sampler = Path(_CHECKPOINT.value), config.sampling
    try:
        sampling.parse_sampler(sampler.sampler)
    except ValueError as e:
        _fail(f"--config.sampling.sampler: {e}")
    try:
        cli.check(config.format in FORMATS, "format", config.format, f"one of {list(FORMATS)}")
        dtypes = {key: loader.resolve_dtype(getattr(config.model, key), f"--config.model.{key}")
                  for key in ("param_dtype", "compute_dtype")}
    except ValueError as e:
        _fail(str(e))
    if not checkpoint.is_dir():
        _fail(f"--checkpoint={checkpoint}: directory does not exist")

    from rubric_jax.models.checkpoint import load_tokenizer

    try:
        layout = sharding.decode_layout(sharding.make_mesh(sharding.MeshConfig()), config.model.tensor)
    except ValueError as e:
        _fail(f"--config.model.tensor: {e}")
    try:
        tokenizer = load_tokenizer(checkpoint)
        weights = loader.load_weights(checkpoint, layout, **dtypes)
        weights = loader.to_layout(weights, layout, per_layer=True)  # the sampler's decode form (no per-call copy)
    except (OSError, ValueError) as e:
        _fail(f"--checkpoint={checkpoint}: {e}")
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        _fail(f"{checkpoint}: the tokenizer needs an eos_token and a pad_token")
    prompt_ids = data.encode_chats(tokenizer, [[{"role": "user", "content": _PROMPT.value}]])[0]
    try:
        result = sampling.generate(
            weights, [prompt_ids], key=jax.random.key(config.seed), max_new_tokens=sampler.max_new_tokens,
            sampler=sampler.sampler, stop_tokens=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id,
            layout=layout,
        )
    except ValueError as e:
        _fail(str(e))
    output_ids = result.tokens[0, :result.lengths[0]].tolist()
    output_text = data.decode_responses(tokenizer, result, keep_special_tokens=False)[0]
    if config.format == "json":
        print(json.dumps({"prompt_ids": list(prompt_ids), "output_ids": output_ids, "text": output_text,
                          "finish_reason": str(result.finish_reason[0])}))
    else:
        print(output_text)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.generate"))

"""Generates a response from a local Hugging Face Qwen2/Llama directory (weights + tokenizer).

  python -m experiments.generate --checkpoint=DIR --prompt="Hello" [--max_new_tokens=128]
      [--sampler=greedy|temperature(0.7)|topk(40)|nucleus(0.9)] [--seed=0] [--format=text|json]
      [--tensor=1] [--param_dtype=auto] [--compute_dtype=auto]

The prompt goes through the tokenizer's chat template as one user turn. `--format=json` prints one
JSON object: prompt_ids, output_ids (up to and including the stop token), text, finish_reason. The
model is loaded straight into the decode layout over every local device (`--tensor` consecutive
devices split each weight, the rest hold replicas), in bfloat16 on accelerators by default.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
from absl import app, flags

from experiments import cli
from rubric_jax import data, sampling, sharding

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Hugging Face model directory (config.json, safetensors, tokenizer).")
_PROMPT = flags.DEFINE_string("prompt", None, "User message, wrapped in the chat template.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 128, "Maximum number of generated tokens.")
_SAMPLER = flags.DEFINE_string("sampler", "greedy", "greedy | temperature(t) | topk(k[, t]) | nucleus(p[, t]).")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed for sampling.")
_FORMAT = flags.DEFINE_enum("format", "text", ["text", "json"], "Print the text, or one JSON object.")
_TENSOR = flags.DEFINE_integer("tensor", 1, "Devices that split each weight (tensor parallel); must divide the heads.")
_PARAM_DTYPE = flags.DEFINE_enum("param_dtype", "auto", ["auto", "float32", "bfloat16"],
                                 "Weights dtype; auto = bfloat16 on accelerators, float32 on CPU.")
_COMPUTE_DTYPE = flags.DEFINE_enum("compute_dtype", "auto", ["auto", "float32", "bfloat16"],
                                   "Activation dtype; auto as for --param_dtype.")
flags.mark_flags_as_required(["checkpoint", "prompt"])


_fail = functools.partial(cli.fail, "experiments.generate")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    cli.start("experiments.generate", argv)
    checkpoint = Path(_CHECKPOINT.value)
    try:
        sampling.parse_sampler(_SAMPLER.value)
    except ValueError as e:
        _fail(f"--sampler: {e}")
    if _MAX_NEW_TOKENS.value < 1:
        _fail(f"--max_new_tokens must be >= 1, got {_MAX_NEW_TOKENS.value}")
    if not checkpoint.is_dir():
        _fail(f"--checkpoint={checkpoint}: directory does not exist")

    from rubric_jax import loader
    from rubric_jax.models.checkpoint import load_tokenizer

    try:
        layout = sharding.decode_layout(sharding.make_mesh(sharding.MeshConfig()), _TENSOR.value)
    except ValueError as e:
        _fail(f"--tensor: {e}")
    try:
        tokenizer = load_tokenizer(checkpoint)
        weights = loader.load_weights(checkpoint, layout,
                                      param_dtype=loader.resolve_dtype(_PARAM_DTYPE.value, "--param_dtype"),
                                      compute_dtype=loader.resolve_dtype(_COMPUTE_DTYPE.value, "--compute_dtype"))
        weights = loader.to_layout(weights, layout, per_layer=True)  # the sampler's decode form (no per-call copy)
    except (OSError, ValueError) as e:
        _fail(f"--checkpoint={checkpoint}: {e}")
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        _fail(f"{checkpoint}: the tokenizer needs an eos_token and a pad_token")
    prompt_ids = data.encode_chats(tokenizer, [[{"role": "user", "content": _PROMPT.value}]])[0]
    try:
        result = sampling.generate(
            weights, [prompt_ids], key=jax.random.key(_SEED.value), max_new_tokens=_MAX_NEW_TOKENS.value,
            sampler=_SAMPLER.value, stop_tokens=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id,
            layout=layout,
        )
    except ValueError as e:
        _fail(str(e))
    output_ids = result.tokens[0, :result.lengths[0]].tolist()
    output_text = data.decode_responses(tokenizer, result, keep_special_tokens=False)[0]
    if _FORMAT.value == "json":
        print(json.dumps({"prompt_ids": list(prompt_ids), "output_ids": output_ids, "text": output_text,
                          "finish_reason": str(result.finish_reason[0])}))
    else:
        print(output_text)


if __name__ == "__main__":
    app.run(main)

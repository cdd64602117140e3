"""Greedy generation throughput: rubric_jax.sampling.generate vs HF transformers (PyTorch) generate, same weights.

  .venv/bin/python -m benchmarks.bench_sampler                     # Qwen2 hidden 512, 8 layers, vocab 32k
  .venv/bin/python -m benchmarks.bench_sampler --preset=tiny       # the issue's ~6M model
  .venv/bin/python -m benchmarks.bench_sampler --hidden=256 --layers=2 --repeats=1

A random Qwen2ForCausalLM is built in PyTorch, saved as a HF directory and loaded into our model with
rubric_jax.loader.load_weights, so both sides run the same float32 weights (ours per layer, the decode form
a run's rollouts and judges use: `loader.to_layout(..., per_layer=True)`). Both
generate `--new_tokens` greedy tokens for a batch of random `--prompt_len`-token prompts (no stop
token); tokens/s = batch * new_tokens / wall time including prefill, best of `--repeats` interleaved runs
after one warm-up each (ours includes compilation, reported separately). Process CPU time is printed
too: on a shared machine it is less sensitive to other load than wall time. Needs torch (requirements-bench.txt).
"""

from __future__ import annotations

import tempfile
import time

import jax
import numpy as np
from absl import app, flags

from rubric_jax import padding, sampling, sharding
from rubric_jax.loader import load_weights, to_layout

PRESETS = {
    "default": dict(hidden=512, layers=8, vocab=32000, heads=8, kv_heads=2, intermediate=1536),
    "tiny": dict(hidden=256, layers=4, vocab=4096, heads=4, kv_heads=2, intermediate=768),
}
_PRESET = flags.DEFINE_enum("preset", "default", list(PRESETS), "Model size preset (other flags override it).")
_HIDDEN = flags.DEFINE_integer("hidden", None, "Hidden size.")
_LAYERS = flags.DEFINE_integer("layers", None, "Decoder layers.")
_VOCAB = flags.DEFINE_integer("vocab", None, "Vocabulary size.")
_HEADS = flags.DEFINE_integer("heads", None, "Query heads.")
_KV_HEADS = flags.DEFINE_integer("kv_heads", None, "Key/value heads.")
_INTERMEDIATE = flags.DEFINE_integer("intermediate", None, "MLP width.")
_BATCH = flags.DEFINE_integer("batch", 8, "Prompts per batch.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Prompt tokens.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128, "Generated tokens per prompt.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per implementation (best is reported).")
_THREADS = flags.DEFINE_integer("torch_threads", 0, "torch.set_num_threads (0: torch's default).")


def _shape() -> dict[str, int]:
    """Preset values with explicit flags on top."""
    shape = dict(PRESETS[_PRESET.value])
    for name, flag in [("hidden", _HIDDEN), ("layers", _LAYERS), ("vocab", _VOCAB), ("heads", _HEADS),
                       ("kv_heads", _KV_HEADS), ("intermediate", _INTERMEDIATE)]:
        if flag.value is not None:
            shape[name] = flag.value
    return shape


def _timed(fn) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call of fn, which must block until its result is ready."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str]) -> None:
    del argv
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if _THREADS.value:
        torch.set_num_threads(_THREADS.value)
    shape = _shape()
    batch, prompt_len, new_tokens = _BATCH.value, _PROMPT_LEN.value, _NEW_TOKENS.value
    torch.manual_seed(0)
    hf_config = Qwen2Config(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=max(512, prompt_len + new_tokens), rms_norm_eps=1e-6, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    hf_model = Qwen2ForCausalLM(hf_config).eval()
    params = sum(p.numel() for p in hf_model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        weights = to_layout(load_weights(tmp), sharding.single_device_layout(), per_layer=True)

    prompts = np.random.default_rng(0).integers(3, shape["vocab"], (batch, prompt_len)).astype(np.int32)
    input_ids = torch.from_numpy(prompts.astype(np.int64))

    def run_hf():
        with torch.inference_mode():
            return hf_model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                                     min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0,
                                     eos_token_id=None)

    def run_ours():
        return sampling.generate(weights, prompts, prompt_mask=np.ones(prompts.shape, bool), key=jax.random.key(0),
                                 max_new_tokens=new_tokens, sampler="greedy", stop_tokens=[], pad_id=0)

    start = time.perf_counter()
    ours = run_ours()
    first_call = time.perf_counter() - start
    hf_tokens = run_hf()[:, prompt_len:].numpy()
    # Interleaved repeats so both sides see the same machine load; the best run of each is reported.
    ours_runs, hf_runs = [], []
    for _ in range(_REPEATS.value):
        ours_runs.append(_timed(run_ours))
        hf_runs.append(_timed(run_hf))
    (ours_s, ours_cpu), (hf_s, hf_cpu) = min(ours_runs), min(hf_runs)
    total = batch * new_tokens
    agree = np.mean(np.cumprod(ours.tokens == hf_tokens, axis=1).sum(axis=1)) / new_tokens
    print(f"model: Qwen2 {shape} ({params / 1e6:.1f}M params), float32; batch {batch}, prompt {prompt_len}, "
          f"{new_tokens} new tokens, greedy")
    print(f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)")
    print(f"rubric_jax:  {total / ours_s:8.1f} tok/s ({ours_s * 1e3:.0f} ms wall, {ours_cpu * 1e3:.0f} ms CPU; "
          f"first call incl. compile {first_call:.1f} s)")
    print(f"HF generate: {total / hf_s:8.1f} tok/s ({hf_s * 1e3:.0f} ms wall, {hf_cpu * 1e3:.0f} ms CPU)")
    print(f"ratio rubric_jax / HF: {hf_s / ours_s:.2f}x; greedy tokens identical up to the first "
          f"divergence: {agree:.1%} of positions")
    prompt_slots, response_slots = padding.bucket_size(prompt_len), padding.bucket_size(new_tokens)
    chunk = sampling.prefill_chunk_size(prompt_slots)
    print(f"compilations: generate traced {sampling.TRACES['generate']} time(s) over {1 + _REPEATS.value} calls; "
          f"inside it {len(sampling.prefill_windows(prompt_slots, chunk))} prefill window group(s) and decode "
          f"segments with response-cache windows {sampling.decode_windows(response_slots, sampling.DECODE_BLOCK)}")


if __name__ == "__main__":
    app.run(main)

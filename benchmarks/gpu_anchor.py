"""benchmarks/gpu.py's PyTorch anchor: HF transformers' `generate` and a torch GRPO update at the shapes of gpu.py's
decode and GRPO parts (random Qwen2 weights, sdpa), each printed with its ratio to ours measured earlier in the same
call. torch is optional: without it the anchor says it was skipped."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from rubric_jax.models.config import ModelConfig


class AnchorShapes(Protocol):
    """What the anchor reads of gpu.py's Settings: the decode part's and the GRPO part's shapes."""

    rows: int  # GRPO rows per update
    prompt: int  # GRPO prompt tokens
    response: int  # GRPO response tokens
    micro: int  # micro-batches of an update
    repeats: int  # timed updates (the fastest counts)
    decode_batch: int
    decode_prompt: int
    short: int  # tokens of the short decode run
    long: int  # tokens of the long decode run


def _torch() -> Any:
    """torch, or None where it is not importable (the anchor is then skipped, saying so)."""
    try:
        import torch  # noqa: PLC0415 -- optional: the GPU image has it, the CPU venv need not
    except ImportError:
        return None
    return torch


def hf_config(cfg: ModelConfig, use_cache: bool) -> Any:
    """The size's shapes as a transformers Qwen2Config (sdpa attention)."""
    import transformers  # noqa: PLC0415 -- transformers' torch models are only needed by the anchor

    return transformers.Qwen2Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        tie_word_embeddings=cfg.tie_word_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta, use_cache=use_cache,
        attn_implementation="sdpa")


def _torch_timed(torch: Any, fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` runs of `fn`, the device synchronised, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def torch_decode_step(torch: Any, cfg: ModelConfig, s: AnchorShapes) -> float:
    """HF `generate` (greedy, the compute dtype, sdpa) at the decode part's shapes, one run to LONG and one to SHORT
    after an 8-token warm-up (at 1.5B a decode step of HF's is ~30 ms: repeats would cost a minute): seconds per
    decode step."""
    import transformers  # noqa: PLC0415

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if cfg.compute_dtype == "bfloat16" else torch.float32
    torch.manual_seed(0)
    with device:  # initialised on the device: a CPU init of 7B random weights takes minutes
        model = transformers.Qwen2ForCausalLM(hf_config(cfg, True)).to(dtype=dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (s.decode_batch, s.decode_prompt), device=device)

    def run(new_tokens: int) -> None:
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)

    run(8)  # warm-up
    long_s, short_s = _torch_timed(torch, lambda: run(s.long), 1), _torch_timed(torch, lambda: run(s.short), 1)
    del model
    return (long_s - short_s) / (s.long - s.short)


def torch_update(torch: Any, cfg: ModelConfig, s: AnchorShapes) -> float:
    """A GRPO update in PyTorch at the GRPO part's shapes, without prompt sharing (every row its own prompt +
    response): float32 master weights, bf16 autocast on a GPU, gradient checkpointing, fused AdamW (on a GPU),
    `s.micro` micro-batches of gradient accumulation; seconds of the fastest of `s.repeats` after a warm-up."""
    import transformers  # noqa: PLC0415

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    with device:
        model = transformers.Qwen2ForCausalLM(hf_config(cfg, False)).train()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=cuda)
    ids = torch.randint(0, cfg.vocab_size, (s.rows, s.prompt + s.response), device=device)
    advantages = torch.randn(s.rows, device=device)
    ref_logp = torch.full((s.rows, s.response), -3.0, device=device)
    rows = s.rows // s.micro

    def update() -> None:
        for m in range(s.micro):
            part = slice(m * rows, (m + 1) * rows)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                logits = model(input_ids=ids[part]).logits[:, s.prompt - 1:-1]
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[part, s.prompt:, None])[..., 0]
            ratio = torch.exp(logp - logp.detach())
            adv = advantages[part, None]
            pg = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
            kl = torch.exp(ref_logp[part] - logp) - (ref_logp[part] - logp) - 1
            ((pg + 0.04 * kl).mean() / s.micro).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    update()  # warm-up
    seconds = _torch_timed(torch, update, s.repeats)
    del model, optimizer
    return seconds


def bench_anchor(cfg: ModelConfig, s: AnchorShapes, ours: dict[str, float], put: Callable[[str, str], None]) -> None:
    """The PyTorch anchor at the same shapes, each with its ratio to ours (measured before it in this call)."""
    torch = _torch()
    if torch is None:
        put("torch anchor", "skipped: torch is not importable here (the GPU image has it; requirements-bench.txt)")
        return
    put("torch anchor", f"torch {torch.__version__}, {'cuda' if torch.cuda.is_available() else 'cpu'}")
    step_s = torch_decode_step(torch, cfg, s)
    put("HF generate step (ms)", f"{step_s * 1e3:.2f}")
    if "decode" in ours:
        put("HF generate / ours (decode step)", f"{step_s / ours['decode']:.1f}x")
    if ours.get("grpo") is None:
        put("torch update (s)", "skipped: our update was not measured on this device (not run, or does not fit)")
    else:
        update_s = torch_update(torch, cfg, s)
        put("torch update (s)", f"{update_s:.3f}")
        put("torch update / ours", f"{update_s / ours['grpo']:.2f}x")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

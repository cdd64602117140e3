"""LoRA: low-rank adapters on a model's projections, their settings, and the pure functions over a params tree
that split, join, merge and strip them.

An adapted projection holds, next to its frozen `kernel` [lead..., in..., out...], `lora_a` [lead..., in..., r]
(uniform, as PEFT's kaiming init) and `lora_b` [lead..., r, out...] (zeros), and computes
x @ kernel + (alpha / r) · (x @ lora_a) @ lora_b: at initialisation exactly the base model. `lead` is the layer
stack's L axis (none for the LM head). The adapters are ordinary parameters of the NNX model
(models/transformer.py creates them when `ModelConfig.lora` is set), so scan, remat, the per-layer decode form,
the loader's shardings and orbax see them like any other weight; the rank axis is never split.

The train state keeps the adapters as its trainable params and the rest (the base) apart, frozen in the compute
dtype (`split` / `join`); the reference policy is the same base arrays with the adapters left out (`strip`),
and a rollout's sampler reads `merge`d weights (one matmul per adapted kernel, once per rollout).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

Params = dict[str, Any]
ADAPTER_KEYS = ("lora_a", "lora_b")
LAYER_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TARGETS = (*LAYER_TARGETS, "lm_head")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters: which projections (HF module names) get them, their rank and scale alpha / rank."""

    rank: int = 8
    """The adapters' inner dimension r."""
    alpha: float = 16.0
    """The update is scaled by alpha / rank (PEFT's lora_alpha)."""
    dropout: float = 0.0
    """Dropout on the adapters' input (PEFT's lora_dropout); only 0 is implemented: the forward takes no dropout key."""
    targets: tuple[str, ...] = LAYER_TARGETS
    """Adapted projections by HF name: any of q/k/v/o_proj, gate/up/down_proj and lm_head."""

    def __post_init__(self) -> None:
        def fail(field: str, why: str) -> None:
            raise ValueError(f"LoraConfig.{field}={getattr(self, field)!r}: {why}")

        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            fail("rank", "must be an integer >= 1")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not (
                math.isfinite(self.alpha) and self.alpha > 0):
            fail("alpha", "must be a finite number > 0")
        if self.dropout != 0:
            fail("dropout", "only 0 is implemented")
        if not isinstance(self.targets, tuple) or not self.targets:
            fail("targets", f"must be a non-empty tuple of {TARGETS}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown:
            fail("targets", f"unknown module(s) {unknown}; expected some of {TARGETS}")
        if len(set(self.targets)) != len(self.targets):
            fail("targets", "names a module twice")

    @property
    def scale(self) -> float:
        """alpha / rank: the factor of the low-rank update."""
        return self.alpha / self.rank


def _filter(params: Params, keep_adapters: bool) -> Params:
    """The nested dict with only the adapter leaves (or only the others); empty dicts are dropped."""
    out: Params = {}
    for key, value in params.items():
        if isinstance(value, dict):
            sub = _filter(value, keep_adapters)
            if sub:
                out[key] = sub
        elif (key in ADAPTER_KEYS) == keep_adapters:
            out[key] = value
    return out


def split(params: Params) -> tuple[Params, Params]:
    """(adapters, base): the adapter leaves and every other leaf, as two nested dicts (the same arrays)."""
    return _filter(params, True), _filter(params, False)


def join(adapters: Params, base: Params) -> Params:
    """The inverse of `split`: one nested dict holding both trees' leaves (moves nothing)."""
    out = dict(base)
    for key, value in adapters.items():
        out[key] = join(value, base[key]) if isinstance(value, dict) and key in base else value
    return out


def strip(params: Params) -> Params:
    """The base model's params: the adapters left out (the same arrays; the reference policy of a LoRA run)."""
    return split(params)[1]


def has_adapters(params: Params) -> bool:
    """Whether a params tree holds any adapter."""
    return bool(split(params)[0])


def delta(kernel: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """scale · a @ b in float32, in `kernel`'s shape [lead..., in..., out...] (a: [lead..., in..., r], b: [lead...,
    r, out...])."""
    lead = a.ndim + b.ndim - 2 - kernel.ndim
    a32 = a.astype(jnp.float32).reshape(*a.shape[:lead], -1, a.shape[-1])
    b32 = b.astype(jnp.float32).reshape(*b.shape[:lead], b.shape[lead], -1)
    return (scale * jnp.matmul(a32, b32)).reshape(kernel.shape)


def merge(params: Params, scale: float, dtype: Any | None = None) -> Params:
    """The base model's params with each adapted kernel replaced by kernel + scale · a @ b (in float32, then
    `dtype`, default the kernel's): what a sampler reads, so decoding pays no adapter matmuls."""

    def walk(node: Params) -> Params:
        out = {k: walk(v) if isinstance(v, dict) else v for k, v in node.items() if k not in ADAPTER_KEYS}
        if "lora_a" in node:
            kernel = node["kernel"]
            merged = kernel.astype(jnp.float32) + delta(kernel, node["lora_a"], node["lora_b"], scale)
            out["kernel"] = merged.astype(dtype or kernel.dtype)
        return out

    return walk(params)


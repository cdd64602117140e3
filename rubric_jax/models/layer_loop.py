"""The loop over a decoder's stacked layers (`lax.scan`, or a Python loop when `cfg.scan_layers` is off): one
function that the model's forward (`models/transformer.py`) and the accumulating layers' custom VJP
(`models/accumulating_layers.py`) both run, so that neither module imports the other's internals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rubric_jax.models.config import ModelConfig


def run_layers(cfg: ModelConfig, layer: Callable[[Any, Any], tuple[Any, Any]], carry: Any, xs: Any
               ) -> tuple[Any, Any]:
    """Applies `layer(carry, xs[l]) -> (carry, ys[l])` to the stacked layers with `lax.scan` or an unrolled
    loop (same parameters either way); returns the last carry and the ys stacked on L.

    A KV cache rides whole in the carry and each layer updates its own slice in place; passing
    per-layer slices as scan inputs/outputs would copy every layer's cache on every decode step.
    """
    if cfg.scan_layers:
        return jax.lax.scan(layer, carry, xs)
    ys = []
    for i in range(cfg.num_layers):
        carry, y = layer(carry, jax.tree.map(lambda a: a[i], xs))
        ys.append(y)
    return carry, jax.tree.map(lambda *y: jnp.stack(y), *ys)

"""Samplers by name: the grammar of sampler strings ("greedy", "temperature(0.7)", "topk(40)", "nucleus(0.9)",
"nucleus(0.9, 0.7)") and their parsed form, without jax, so that a config block (rubric_jax/schema.py) checks its
sampler when made while loading a config file stays cheap; rubric_jax/samplers.py draws with them."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

# Smallest sampling temperature: logits / T are float32, and at T = 1e-4 a logit gap of 0.01 is already 100 nats
# (an argmax but for exact ties), while a smaller T (1e-300 is 0 in float32) would make them inf or NaN; the largest
# is float32's.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class Sampler:
    """A parsed sampler string: kind in {greedy, temperature, topk, nucleus} and its parameters."""

    kind: str
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


_SAMPLER_RE = re.compile(r"^\s*(greedy|temperature|topk|nucleus)\s*(?:\(([^()]*)\))?\s*$")


def parse_sampler(spec: str) -> Sampler:
    """Parses "greedy", "temperature(t)", "topk(k)", "topk(k, t)", "nucleus(p)" or "nucleus(p, t)"."""
    match = _SAMPLER_RE.match(spec)
    usage = 'expected "greedy", "temperature(t)", "topk(k[, t])" or "nucleus(p[, t])"'
    if not match:
        raise ValueError(f"sampler {spec!r}: {usage}")
    kind, arg_text = match.group(1), match.group(2)
    try:
        args = [float(a) for a in arg_text.split(",")] if arg_text else []
    except ValueError:
        raise ValueError(f"sampler {spec!r}: arguments must be numbers; {usage}") from None
    if not all(math.isfinite(a) for a in args):
        raise ValueError(f"sampler {spec!r}: arguments must be finite numbers (not nan or inf); {usage}")
    expected = {"greedy": (0, 0), "temperature": (1, 1), "topk": (1, 2), "nucleus": (1, 2)}[kind]
    if not expected[0] <= len(args) <= expected[1]:
        raise ValueError(f"sampler {spec!r}: wrong number of arguments; {usage}")
    if kind == "greedy":
        return Sampler("greedy")
    temperature = args[0] if kind == "temperature" else (args[1] if len(args) == 2 else 1.0)
    if not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f"sampler {spec!r}: temperature must be in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE:.4g}] (finite "
                         "in float32; use 'greedy' for argmax)")
    if kind == "topk":
        if args[0] != int(args[0]) or args[0] < 1:
            raise ValueError(f"sampler {spec!r}: k must be a positive integer")
        return Sampler("topk", temperature=temperature, top_k=int(args[0]))
    if kind == "nucleus":
        if not 0 < args[0] <= 1:
            raise ValueError(f"sampler {spec!r}: p must be in (0, 1]")
        return Sampler("nucleus", temperature=temperature, top_p=args[0])
    return Sampler("temperature", temperature=temperature)

"""Do a judge and the policy come from the same base model? (RubricRL 6.2: a judge fine-tuned from the policy's
base model can collude with it: the policy drifts to a style the judge happens to score high and people do not.)

Decided offline from what a model directory holds; any one signal is enough:
  shape      config.json agrees on model_type, hidden size, intermediate size, layer count, head count, kv-head
             count and vocabulary size. A fine-tune never changes these, and different base models rarely share
             all seven (different sizes of one family do not: they are not one base);
  name       the same non-empty `_name_or_path` in both config.json files;
  embedding  the same input-embedding matrix: the sha256 of its first EMBEDDING_ROWS rows, shape and dtype (the
             same checkpoint twice, or a fine-tune that kept its embeddings frozen).
A random-init policy (a config.json without weights, as the tiny default) has no embedding to compare.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from safetensors import safe_open

EMBEDDING_TENSOR = "model.embed_tokens.weight"
EMBEDDING_ROWS = 256
SHAPE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size")
_INDEX = "model.safetensors.index.json"


@dataclasses.dataclass(frozen=True)
class ModelIdentity:
    """What can tell two models' bases apart without running them."""

    source: str  # the directory (or config.json) it was read from, for messages
    shape: tuple[Any, ...]  # the SHAPE_KEYS values of config.json
    name_or_path: str  # config.json `_name_or_path` ("" when absent)
    embedding: str  # sha256 of the embedding's first rows, shape and dtype ("" without weights)


def _embedding_file(directory: Path) -> Path | None:
    """The safetensors file holding the input embedding, or None when the directory has no weights."""
    index = directory / _INDEX
    if index.is_file():
        name = json.loads(index.read_text()).get("weight_map", {}).get(EMBEDDING_TENSOR)
        return directory / name if name else None
    single = directory / "model.safetensors"
    return single if single.is_file() else None


def embedding_fingerprint(directory: Path) -> str:
    """sha256 over the embedding's shape, dtype and first EMBEDDING_ROWS rows ("" when there is none)."""
    path = _embedding_file(directory)
    if path is None:
        return ""
    with safe_open(path, framework="numpy") as f:
        if EMBEDDING_TENSOR not in f.keys():
            return ""
        tensor = f.get_slice(EMBEDDING_TENSOR)
        shape = tensor.get_shape()
        rows = tensor[: min(EMBEDDING_ROWS, shape[0])]
        header = f"{shape} {tensor.get_dtype()}".encode()
    return hashlib.sha256(header + rows.tobytes()).hexdigest()


def model_identity(path: str | Path) -> ModelIdentity:
    """The identity of a model directory (config.json, weights optional) or of a bare config.json file."""
    path = Path(path)
    config_file = path if path.is_file() else path / "config.json"
    hf = json.loads(config_file.read_text())
    shape = tuple(hf.get(key) for key in SHAPE_KEYS)
    embedding = "" if path.is_file() else embedding_fingerprint(path)
    return ModelIdentity(str(path), shape, str(hf.get("_name_or_path") or ""), embedding)


def shared_base_signals(a: ModelIdentity, b: ModelIdentity) -> list[str]:
    """The signals (module docstring) that say `a` and `b` come from one base model; empty when none does."""
    signals = []
    if a.shape == b.shape and None not in a.shape:
        signals.append("same architecture and sizes (" + ", ".join(f"{k}={v}" for k, v in zip(SHAPE_KEYS, a.shape))
                       + ")")
    if a.name_or_path and a.name_or_path == b.name_or_path:
        signals.append(f"same _name_or_path {a.name_or_path!r}")
    if a.embedding and a.embedding == b.embedding:
        signals.append("identical embedding matrix")
    return signals


def same_base_warning(policy: ModelIdentity, judge: ModelIdentity) -> str | None:
    """One line naming both models when they look like one base model (RubricRL 6.2), else None."""
    signals = shared_base_signals(policy, judge)
    if not signals:
        return None
    return (f"warning: judge {judge.source} and policy {policy.source} look like the same base model "
            f"({'; '.join(signals)}); a judge fine-tuned from the policy's base can collude with it "
            "(RubricRL 6.2): use a judge of another base model, or an ensemble of several")


def same_base_warnings(policy_path: str | Path, judge_paths: list[str] | tuple[str, ...]) -> list[str]:
    """The `same_base_warning` line of every judge that shares the policy's base model (a directory or config.json)."""
    if not judge_paths:
        return []
    policy = model_identity(policy_path)
    return [w for w in (same_base_warning(policy, model_identity(j)) for j in judge_paths) if w is not None]

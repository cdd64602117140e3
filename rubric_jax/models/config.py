"""Model shape configuration: a frozen dataclass built from (and written back to) HF `config.json`.

Handles both the transformers-5 layout (rope settings under `rope_parameters`, `dtype`) and the older
one (top-level `rope_theta` / `rope_scaling`, `torch_dtype`) that real checkpoints still carry.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rubric_jax.models.lora import LoraConfig

ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
}
# The same decoder with a sequence-classification ("score") head instead of the LM head (reward models).
SEQUENCE_CLASSIFIERS = {
    "qwen2": "Qwen2ForSequenceClassification",
    "llama": "LlamaForSequenceClassification",
}
_CLASSIFIER_SUFFIX = "ForSequenceClassification"
_HF_DEFAULT_NUM_LABELS = 2  # transformers' PretrainedConfig default when config.json has no id2label
# HF model_type -> our architecture; Mistral is the Llama block without bias (no sliding window here).
_MODEL_TYPES = {"qwen2": "qwen2", "llama": "llama", "mistral": "llama"}
_DTYPES = ("float32", "bfloat16", "float16")
# The attention of a forward without a KV cache (training, log-probs, reward models): "einsum" (ours, any
# backend), or `jax.nn.dot_product_attention` with implementation "xla" (its reference; how CPU tests check
# the fused path) or "cudnn" (cuDNN flash attention: NVIDIA GPUs, bfloat16/float16). Decoding is always "einsum".
ATTENTIONS = ("einsum", "xla", "cudnn")
# What a rematerialised layer (`remat`) keeps for its backward: "full" nothing (the whole forward runs again),
# "dots" its matmul outputs (jax.checkpoint_policies.dots_with_no_batch_dims_saveable: the projections' and the
# MLP's; only their elementwise neighbours run again, at the cost of holding the outputs).
REMAT_POLICIES = ("full", "dots")
_CUDNN_DTYPES = ("bfloat16", "float16")


class ModelConfigError(ValueError):
    """A config.json (or override) that cannot describe a model we support."""


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama-3 frequency-dependent RoPE scaling (HF rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of one decoder-only transformer (Qwen2 or Llama family)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool
    rope_scaling: Llama3RopeScaling | None
    max_position_embeddings: int
    num_labels: int = 0  # 0: causal LM (LM head); n > 0: sequence classifier with an n-label score head
    pad_token_id: int | None = None  # a classifier pools each row's last token that is not this id (HF)
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: bool = False
    remat_policy: str = "full"  # one of REMAT_POLICIES
    scan_layers: bool = True
    attention: str = "einsum"  # one of ATTENTIONS
    lora: LoraConfig | None = None  # low-rank adapters on the projections it targets (models/lora.py)

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ModelConfigError(
                f"architecture {self.architecture!r} is not supported; expected one of {sorted(ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ModelConfigError(f"field {name!r} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        for name in ("param_dtype", "compute_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ModelConfigError(f"field {name!r} must be one of {_DTYPES}, got {getattr(self, name)!r}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ModelConfigError(f"field 'remat_policy' must be one of {REMAT_POLICIES}, got {self.remat_policy!r}")
        if self.attention not in ATTENTIONS:
            raise ModelConfigError(f"field 'attention' must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.attention == "cudnn" and (self.compute_dtype not in _CUDNN_DTYPES or self.head_dim % 8
                                          or self.head_dim > 256):
            raise ModelConfigError(
                f"attention='cudnn' needs compute_dtype in {_CUDNN_DTYPES} and head_dim a multiple of 8 up to 256 "
                f"(cuDNN flash attention), got {self.compute_dtype!r} and {self.head_dim}")
        if isinstance(self.num_labels, bool) or not isinstance(self.num_labels, int) or self.num_labels < 0:
            raise ModelConfigError(f"field 'num_labels' must be an integer >= 0, got {self.num_labels!r}")
        if self.num_labels and not (isinstance(self.pad_token_id, int) and 0 <= self.pad_token_id < self.vocab_size):
            raise ModelConfigError(
                f"a sequence classifier needs pad_token_id in [0, {self.vocab_size}) (its score is read at each "
                f"row's last token that is not pad_token_id, as transformers does), got {self.pad_token_id!r}"
            )
        if self.lora is not None and "lm_head" in self.lora.targets and (self.tie_word_embeddings or self.num_labels):
            raise ModelConfigError("field 'lora': targets lm_head, but this model has no LM head of its own "
                                   "(tied embeddings or a classifier)")

    @property
    def is_classifier(self) -> bool:
        """A sequence classifier (score head, e.g. a reward model) rather than a causal LM."""
        return self.num_labels > 0

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (e.g. dtypes or remat for training)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], **overrides: Any) -> ModelConfig:
        """Builds a config from a parsed HF config.json; `overrides` set our own fields (dtypes, remat)."""
        model_type = hf.get("model_type")
        if model_type not in _MODEL_TYPES:
            raise ModelConfigError(
                f"model_type {model_type!r} is not supported; expected one of {sorted(_MODEL_TYPES)}"
            )
        architecture = _MODEL_TYPES[model_type]
        if hf.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"hidden_act {hf['hidden_act']!r} is not supported; expected 'silu'")
        if hf.get("mlp_bias", False):
            raise ModelConfigError("mlp_bias=true is not supported")
        if hf.get("use_sliding_window", False):
            raise ModelConfigError("use_sliding_window=true is not supported")
        if architecture == "llama" and hf.get("attention_bias", False):
            raise ModelConfigError("attention_bias=true is not supported for Llama-family models")

        def need(key: str) -> Any:
            if key not in hf:
                raise ModelConfigError(f"config.json has no field {key!r} (model_type {model_type!r})")
            return hf[key]

        num_heads = need("num_attention_heads")
        hidden_size = need("hidden_size")
        rope = _rope_settings(hf)
        num_labels = _num_labels(hf)
        fields = dict(
            architecture=architecture,
            vocab_size=need("vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hidden_size // num_heads,
            rope_theta=float(rope["rope_theta"]),
            rms_norm_eps=float(need("rms_norm_eps")),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=architecture == "qwen2",
            rope_scaling=_llama3_scaling(rope),
            max_position_embeddings=need("max_position_embeddings"),
            num_labels=num_labels,
            pad_token_id=hf.get("pad_token_id") if num_labels else None,
        )
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ModelConfigError(f"unknown ModelConfig override(s): {sorted(unknown)}")
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_hf_dir(cls, path: str | Path, **overrides: Any) -> ModelConfig:
        """Reads `path/config.json`."""
        config_path = Path(path) / "config.json"
        if not config_path.is_file():
            raise ModelConfigError(f"{config_path}: no such file (expected a Hugging Face model directory)")
        try:
            hf = json.loads(config_path.read_text())
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{config_path}: not valid JSON ({e})") from e
        try:
            return cls.from_hf_dict(hf, **overrides)
        except ModelConfigError as e:
            raise ModelConfigError(f"{config_path}: {e}") from e

    def to_hf_dict(self) -> dict[str, Any]:
        """The transformers-5 config.json for this model (what `export_hf_checkpoint` writes)."""
        rope: dict[str, Any] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_scaling is not None:
            rope.update(rope_type="llama3", **dataclasses.asdict(self.rope_scaling))
        classes = SEQUENCE_CLASSIFIERS if self.is_classifier else ARCHITECTURES
        hf: dict[str, Any] = {
            "architectures": [classes[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_parameters": rope,
            "dtype": self.param_dtype,
        }
        if self.architecture == "llama":
            hf.update(attention_bias=False, mlp_bias=False)
        if self.is_classifier:
            hf.update(pad_token_id=self.pad_token_id, id2label={str(i): f"LABEL_{i}" for i in range(self.num_labels)},
                      label2id={f"LABEL_{i}": i for i in range(self.num_labels)})
        return hf


def _num_labels(hf: dict[str, Any]) -> int:
    """0 for a causal LM; for a *ForSequenceClassification checkpoint its label count, read as transformers
    reads it (len(id2label), else `num_labels`, else 2)."""
    architectures = hf.get("architectures") or []
    if not any(str(name).endswith(_CLASSIFIER_SUFFIX) for name in architectures):
        return 0
    if hf.get("id2label"):
        return len(hf["id2label"])
    return hf.get("num_labels", _HF_DEFAULT_NUM_LABELS)


def _rope_settings(hf: dict[str, Any]) -> dict[str, Any]:
    """Merges the new `rope_parameters` block with the old top-level `rope_theta`/`rope_scaling`."""
    rope = dict(hf.get("rope_scaling") or {})
    if "rope_theta" in hf:
        rope["rope_theta"] = hf["rope_theta"]
    rope.update(hf.get("rope_parameters") or {})
    if "rope_theta" not in rope:
        raise ModelConfigError("config.json has no rope theta (neither 'rope_parameters.rope_theta' nor 'rope_theta')")
    return rope


def _llama3_scaling(rope: dict[str, Any]) -> Llama3RopeScaling | None:
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "llama3":
        raise ModelConfigError(f"rope_type {rope_type!r} is not supported; expected 'default' or 'llama3'")
    try:
        return Llama3RopeScaling(
            factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ModelConfigError(f"llama3 rope scaling is missing field {e.args[0]!r}") from e

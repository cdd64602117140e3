"""Hugging Face checkpoint directories <-> our Transformer state, through one table used both ways.

A HF directory holds config.json and either model.safetensors or shards listed in
model.safetensors.index.json (torch layout: Linear weights are [out, in]). A *ForCausalLM directory has
an LM head; a *ForSequenceClassification one (a reward model) has a `score` head instead, one more row
of the same table. Our parameters are stacked
over layers ([L, ...]) with split head axes (see rubric_jax/models/transformer.py). Reading takes each
tensor once (safetensors, numpy framework, no torch), converts it on the host and places every
parameter straight into the sharding it is given, so a large model never sits whole on one device.
Callers get models through rubric_jax.loader, which picks the shardings from a layout.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from rubric_jax import distributed, files
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.attention import ShardActivation
from rubric_jax.models.transformer import Transformer

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
GENERATION_FILE = "generation_config.json"
# Files copied next to an export when a source directory is given (tokenizer and generation defaults).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)
# Derived buffers that old checkpoints carry and we recompute (RoPE inverse frequencies).
_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.float16))

# HF tensor name ("{i}" = layer index: stacked on our leading L axis) -> (our parameter path, in_axes).
# in_axes None: same shape. in_axes k >= 0: a torch Linear weight [out, in] (k = 0: a bias [out]) whose
# first k axes of our (per-layer) shape are the input and the rest the output: ours = w.T.reshape(...).
_TABLE: tuple[tuple[str, tuple[str, ...], int | None], ...] = (
    ("model.embed_tokens.weight", ("embed_tokens", "embedding"), None),
    ("model.norm.weight", ("norm", "scale"), None),
    ("lm_head.weight", ("lm_head", "kernel"), 1),
    ("score.weight", ("score", "kernel"), 1),  # sequence classifiers (reward models): [num_labels, hidden]
    ("model.layers.{i}.input_layernorm.weight", ("layers", "input_layernorm", "scale"), None),
    ("model.layers.{i}.post_attention_layernorm.weight", ("layers", "post_attention_layernorm", "scale"), None),
    ("model.layers.{i}.self_attn.q_proj.weight", ("layers", "self_attn", "q_proj", "kernel"), 1),
    ("model.layers.{i}.self_attn.q_proj.bias", ("layers", "self_attn", "q_proj", "bias"), 0),
    ("model.layers.{i}.self_attn.k_proj.weight", ("layers", "self_attn", "k_proj", "kernel"), 1),
    ("model.layers.{i}.self_attn.k_proj.bias", ("layers", "self_attn", "k_proj", "bias"), 0),
    ("model.layers.{i}.self_attn.v_proj.weight", ("layers", "self_attn", "v_proj", "kernel"), 1),
    ("model.layers.{i}.self_attn.v_proj.bias", ("layers", "self_attn", "v_proj", "bias"), 0),
    ("model.layers.{i}.self_attn.o_proj.weight", ("layers", "self_attn", "o_proj", "kernel"), 2),
    ("model.layers.{i}.mlp.gate_proj.weight", ("layers", "mlp", "gate_proj", "kernel"), 1),
    ("model.layers.{i}.mlp.up_proj.weight", ("layers", "mlp", "up_proj", "kernel"), 1),
    ("model.layers.{i}.mlp.down_proj.weight", ("layers", "mlp", "down_proj", "kernel"), 1),
)

PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."  # PEFT's PeftModel wraps the HF model: its tensors are named under this prefix

# Any one of these makes a directory a tokenizer directory that AutoTokenizer can load.
_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
ParamPath = tuple[str, ...]


class CheckpointError(ValueError):
    """A checkpoint (HF directory or orbax train checkpoint) that is missing, unreadable, or does not
    fit the model it should hold; the message names the file."""


def _hf_shape(our_shape: tuple[int, ...], in_axes: int | None) -> tuple[int, ...]:
    """The HF tensor shape of one (per-layer) parameter of `our_shape`."""
    if in_axes is None:
        return our_shape
    out_size = math.prod(our_shape[in_axes:])
    return (out_size,) if in_axes == 0 else (out_size, math.prod(our_shape[:in_axes]))


def hf_to_ours(w: np.ndarray, our_shape: tuple[int, ...], in_axes: int | None) -> np.ndarray:
    """One HF tensor in our layout (transposed Linear, split heads)."""
    return (w if in_axes is None or in_axes == 0 else w.T).reshape(our_shape)


def ours_to_hf(x: np.ndarray, in_axes: int | None) -> np.ndarray:
    """One of our (per-layer) parameters in HF layout; inverse of `hf_to_ours`."""
    hf_shape = _hf_shape(x.shape, in_axes)
    if in_axes is None or in_axes == 0:
        return np.ascontiguousarray(x.reshape(hf_shape))
    return np.ascontiguousarray(x.reshape(hf_shape[::-1]).T)


def _entries(cfg: ModelConfig, flat_abstract: Mapping[ParamPath, Any],
             ) -> Iterator[tuple[ParamPath, list[str], int | None]]:
    """(our path, HF names in layer order, in_axes) for every parameter the model has."""
    for template, path, in_axes in _TABLE:
        if path not in flat_abstract:
            continue
        if "{i}" in template:
            yield path, [template.format(i=i) for i in range(cfg.num_layers)], in_axes
        else:
            yield path, [template], in_axes


def abstract_model(cfg: ModelConfig, shard_activation: ShardActivation | None = None
                   ) -> tuple[nnx.GraphDef, nnx.State]:
    """Graphdef and abstract state (ShapeDtypeStructs with logical-axis metadata), allocating nothing."""
    return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), shard_activation=shard_activation)))


def _open_safetensors(file: Path) -> Any:
    """safe_open, with a truncated or corrupt file reported as a CheckpointError naming it."""
    try:
        return safe_open(file, framework="numpy")
    except (SafetensorError, OSError) as e:
        size = file.stat().st_size if file.exists() else 0
        raise CheckpointError(f"{file}: not a readable safetensors file ({size} bytes; truncated or corrupt: "
                              "re-download or re-export it)") from e


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file, from the shard index when there is one, else from the files."""
    index_path = path / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index_path}: not a safetensors index with a 'weight_map' ({e!r})") from e
        files = {name: path / file for name, file in weight_map.items()}
        for file in sorted(set(files.values())):
            if not file.is_file():
                raise CheckpointError(f"{index_path} lists shard {file.name!r}, which does not exist in {path}")
        return files
    candidates = sorted(path.glob("*.safetensors"))
    if not candidates:
        found = sorted(p.name for p in path.iterdir())
        raise CheckpointError(f"{path}: no *.safetensors weights (and no {INDEX_FILE}); found {found}")
    files: dict[str, Path] = {}
    for file in candidates:
        with _open_safetensors(file) as f:
            for name in f.keys():
                if name in files:
                    raise CheckpointError(f"{path}: tensor {name!r} is in both {files[name].name} and {file.name}")
                files[name] = file
    return files


def _read(f: Any, file: Path, name: str, expected_shape: tuple[int, ...]) -> np.ndarray:
    """Reads one tensor, checking its shape and that it is a float type."""
    try:
        w = f.get_tensor(name)
    except SafetensorError as e:
        raise CheckpointError(f"{file}: tensor {name!r} cannot be read (truncated or corrupt file)") from e
    if tuple(w.shape) != expected_shape:
        raise CheckpointError(
            f"{file}: tensor {name!r} has shape {tuple(w.shape)}, expected {expected_shape} from config.json"
        )
    if w.dtype not in _FLOAT_DTYPES:
        raise CheckpointError(
            f"{file}: tensor {name!r} has dtype {w.dtype}, expected one of {[str(d) for d in _FLOAT_DTYPES]}"
        )
    return w


def _check_names(path: Path, cfg: ModelConfig, expected: set[str], present: set[str]) -> bool:
    """Fails on missing or unexpected tensors; True when a tied model also stores lm_head.weight."""
    missing = sorted(expected - present)
    if missing:
        raise CheckpointError(f"{path}: tensor {missing[0]!r} is missing ({len(missing)} missing: {missing[:8]})")
    redundant_head = cfg.tie_word_embeddings and not cfg.is_classifier and "lm_head.weight" in present
    unexpected = sorted(n for n in present - expected if not _IGNORED.match(n))
    if redundant_head:
        unexpected.remove("lm_head.weight")
    if unexpected:
        raise CheckpointError(
            f"{path}: {len(unexpected)} unexpected tensor(s) for a {cfg.architecture} model with "
            f"{cfg.num_layers} layers: {unexpected[:8]}"
        )
    return redundant_head


def read_hf_params(path: str | Path, cfg: ModelConfig, abstract: Mapping[str, Any],
                   shardings: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of the HF directory `path` (whose config.json gave `cfg`) as a pure nested dict,
    each array created in its entry of `shardings` and cast to its abstract dtype on the host.

    `abstract` and `shardings` mirror the model's parameters (ShapeDtypeStructs and Shardings).
    """
    path = Path(path)
    flat_abstract = traverse_util.flatten_dict(dict(abstract))
    flat_shardings = traverse_util.flatten_dict(dict(shardings))
    files = _tensor_files(path)
    entries = list(_entries(cfg, flat_abstract))

    redundant_head = _check_names(path, cfg, {name for _, names, _ in entries for name in names}, set(files))
    flat_params: dict[ParamPath, jax.Array] = {}
    with ExitStack() as stack:
        handles = {file: stack.enter_context(_open_safetensors(file)) for file in set(files.values())}
        for our_path, names, in_axes in entries:
            abstract_leaf = flat_abstract[our_path]
            stacked = our_path[0] == "layers"
            our_shape = abstract_leaf.shape[1:] if stacked else abstract_leaf.shape
            host = np.empty(abstract_leaf.shape, abstract_leaf.dtype)
            for i, name in enumerate(names):
                w = _read(handles[files[name]], files[name], name, _hf_shape(our_shape, in_axes))
                host[(i,) if stacked else ()] = hf_to_ours(w, our_shape, in_axes)  # casts to param_dtype
            if our_path == ("embed_tokens", "embedding") and redundant_head:
                head = _read(handles[files["lm_head.weight"]], files["lm_head.weight"], "lm_head.weight",
                             abstract_leaf.shape).astype(abstract_leaf.dtype)
                if not np.array_equal(head, host):
                    raise CheckpointError(
                        f"{path}: config.json ties word embeddings but 'lm_head.weight' differs from "
                        f"'model.embed_tokens.weight'"
                    )
            flat_params[our_path] = jax.make_array_from_callback(
                abstract_leaf.shape, flat_shardings[our_path], lambda index, host=host: host[index]
            )
    return traverse_util.unflatten_dict(flat_params)


def load_tokenizer(path: str | Path) -> Any:
    """AutoTokenizer from a local directory; a missing directory or one without tokenizer files is one
    CheckpointError line (never transformers' attempt to treat the path as a Hub repository id)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: tokenizer directory does not exist")
    if not any((path / name).is_file() for name in _TOKENIZER_MARKERS):
        raise CheckpointError(f"{path}: no tokenizer files (expected one of {', '.join(_TOKENIZER_MARKERS)})")
    from transformers import AutoTokenizer  # slow import (pulls torch when installed): only when loading

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:  # KeyError: a tokenizer.json without its fields
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path}: cannot load the tokenizer ({first_line})") from e


def _plan_shards(sizes: dict[str, int], max_shard_bytes: int) -> list[list[str]]:
    """Groups tensor names (in order) into shards of at most `max_shard_bytes` (one tensor may exceed it)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def hf_config_dict(cfg: ModelConfig, token_ids: Mapping[str, int | None] | None = None) -> dict[str, Any]:
    """config.json of `cfg` as transformers writes it (through its own config class, so every field its
    models and vLLM read is there), plus the pre-5.0 keys `rope_theta`, `rope_scaling` and `torch_dtype`,
    which transformers 4 (and vLLM releases built on it) read instead of `rope_parameters` and `dtype`:
    without them they would silently use RoPE theta 10,000. `token_ids`: bos/eos/pad_token_id."""
    from transformers import AutoConfig  # slow import: only when exporting

    fields = cfg.to_hf_dict()
    model_type = fields.pop("model_type")
    if model_type == "qwen2" and fields["head_dim"] == cfg.hidden_size // cfg.num_heads:
        del fields["head_dim"]  # Qwen2Config has no head_dim field; transformers derives this value
    hf_config = AutoConfig.for_model(model_type, **{**(token_ids or {}), **fields})  # a classifier's own pad id wins
    hf = json.loads(hf_config.to_json_string(use_diff=True))
    rope = fields["rope_parameters"]
    hf["rope_theta"] = rope["rope_theta"]
    if rope["rope_type"] != "default":
        hf["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    hf["torch_dtype"] = hf["dtype"]
    return hf


def _token_ids(source_dir: Path | None) -> dict[str, int | None]:
    """bos/eos/pad token ids of the tokenizer in `source_dir` (none when it holds no tokenizer)."""
    if source_dir is None or not any((source_dir / name).is_file() for name in _TOKENIZER_MARKERS):
        return {}
    tokenizer = load_tokenizer(source_dir)
    return {f"{kind}_token_id": getattr(tokenizer, f"{kind}_token_id") for kind in ("bos", "eos", "pad")}


def export_hf_checkpoint(cfg: ModelConfig, state: nnx.State | Mapping[str, Any], path: str | Path, *,
                         source_dir: str | Path | None = None, max_shard_bytes: int = 4 << 30,
                         generation_source: str | Path | None = None, replace: bool = False) -> Path:
    """Writes `state` as a HF directory that transformers and vLLM load; returns `path`.

    config.json (`hf_config_dict`), safetensors in `cfg.param_dtype` (shards above `max_shard_bytes`,
    with model.safetensors.index.json), and, from `source_dir` when given, the tokenizer files and
    generation_config.json (from `generation_source` when given; else `source_dir`'s; else written
    from the tokenizer's token ids). The
    directory appears whole or not at all (`files.atomic_directory`); `path` must be new or empty
    unless `replace`. Every process of a multi-host job calls this (the arrays are gathered across
    hosts); process 0 writes.
    """
    path = Path(path)
    source_dir = None if source_dir is None else Path(source_dir)
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    if not replace and ((path / "config.json").exists() or list(path.glob("*.safetensors"))):
        raise FileExistsError(f"{path}: already holds a checkpoint; export into a new directory")
    pure = nnx.to_pure_dict(state) if isinstance(state, nnx.State) else dict(state)
    flat = traverse_util.flatten_dict(pure)
    _, abstract_state = abstract_model(cfg)
    flat_abstract = traverse_util.flatten_dict(nnx.to_pure_dict(abstract_state))
    if set(flat) != set(flat_abstract):
        missing = sorted("/".join(p) for p in set(flat_abstract) - set(flat))
        extra = sorted("/".join(p) for p in set(flat) - set(flat_abstract))
        raise ValueError(f"state does not match config: missing {missing}, unexpected {extra}")
    for p, abstract in flat_abstract.items():
        if tuple(flat[p].shape) != abstract.shape:
            raise ValueError(f"state {'/'.join(p)} has shape {tuple(flat[p].shape)}, config gives {abstract.shape}")

    dtype = np.dtype(jnp.dtype(cfg.param_dtype))
    entries = {name: (our_path, i, in_axes)
               for our_path, names, in_axes in _entries(cfg, flat_abstract) for i, name in enumerate(names)}
    sizes = {}
    for name, (our_path, _, _) in entries.items():
        shape = flat_abstract[our_path].shape
        sizes[name] = math.prod(shape[1:] if our_path[0] == "layers" else shape) * dtype.itemsize
    shards = _plan_shards(sizes, max_shard_bytes)
    file_names = [SINGLE_FILE] if len(shards) == 1 else [
        f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))
    ]
    token_ids = _token_ids(source_dir)

    with ExitStack() as stack:
        out = stack.enter_context(files.atomic_directory(path, replace=replace)) if distributed.is_writer() else None
        host_cache: dict[ParamPath, np.ndarray] = {}
        for file_name, names in zip(file_names, shards):
            tensors = {}
            for name in names:
                our_path, i, in_axes = entries[name]
                if our_path not in host_cache:
                    host_cache.clear()  # tensors come grouped by parameter: keep one on the host at a time
                    host_cache[our_path] = distributed.host_array(flat[our_path]).astype(dtype)
                host = host_cache[our_path]
                tensors[name] = ours_to_hf(host[i] if our_path[0] == "layers" else host, in_axes)
            if out is not None:
                save_file(tensors, out / file_name, metadata={"format": "pt"})
        if out is not None:
            hf = hf_config_dict(cfg, token_ids)
            (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
            if len(shards) > 1:
                index = {"metadata": {"total_size": sum(sizes.values())},
                         "weight_map": {name: file for file, names in zip(file_names, shards) for name in names}}
                (out / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
            for file_name in TOKENIZER_FILES if source_dir is not None else ():
                if (source_dir / file_name).is_file():
                    shutil.copy2(source_dir / file_name, out / file_name)
            if generation_source is not None:
                shutil.copy2(Path(generation_source) / GENERATION_FILE, out / GENERATION_FILE)
            if token_ids and not (out / GENERATION_FILE).exists():
                from transformers import AutoConfig, GenerationConfig  # what save_pretrained writes for it

                GenerationConfig.from_model_config(AutoConfig.from_pretrained(out)).save_pretrained(out)
            files.give_new_file_modes(out)
    distributed.wait_for_everyone(f"export {path}")
    return path


def peft_adapter_tensors(cfg: ModelConfig, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A LoRA model's adapters as PEFT names them (float32, host arrays): per adapted HF Linear `<name>.weight`,
    `base_model.model.<name>.lora_A.weight` [r, in] and `...lora_B.weight` [out, r] (torch layout)."""
    if cfg.lora is None:
        raise ValueError("peft_adapter_tensors: the model has no LoRA adapters (ModelConfig.lora is None)")
    flat = traverse_util.flatten_dict(dict(params))
    tensors: dict[str, np.ndarray] = {}
    for template, path, in_axes in _TABLE:
        if path[-1] != "kernel" or path[:-1] + ("lora_a",) not in flat:
            continue
        for key, suffix, axes in (("lora_a", "lora_A", in_axes), ("lora_b", "lora_B", 1)):
            host = distributed.host_array(flat[path[:-1] + (key,)]).astype(np.float32)
            for i, layer in enumerate(host) if path[0] == "layers" else [(0, host)]:
                name = _PEFT_PREFIX + template.format(i=i).removesuffix(".weight") + f".{suffix}.weight"
                tensors[name] = ours_to_hf(layer, axes)
    return tensors


def peft_adapter_config(cfg: ModelConfig, base_model: str) -> dict[str, Any]:
    """adapter_config.json of `cfg`'s adapters (PEFT's LoraConfig fields) on the HF model `base_model`."""
    if cfg.lora is None:
        raise ValueError("peft_adapter_config: the model has no LoRA adapters (ModelConfig.lora is None)")
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": cfg.lora.rank, "lora_alpha": cfg.lora.alpha, "lora_dropout": cfg.lora.dropout,
            "target_modules": sorted(cfg.lora.targets), "bias": "none", "fan_in_fan_out": False,
            "inference_mode": True, "init_lora_weights": True, "modules_to_save": None, "use_rslora": False,
            "use_dora": False, "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {},
            "alpha_pattern": {}, "revision": None}


def export_peft_adapter(cfg: ModelConfig, params: Mapping[str, Any], path: str | Path, *, base_model: str,
                        replace: bool = False) -> Path:
    """Writes a LoRA model's adapters as a PEFT adapter directory (adapter_config.json +
    adapter_model.safetensors) that `PeftModel.from_pretrained(<base_model's HF model>, path)` loads; atomically,
    into a new or empty `path` unless `replace`. Every process of a multi-host job calls it; process 0 writes."""
    path = Path(path)
    tensors = peft_adapter_tensors(cfg, params)
    config = peft_adapter_config(cfg, base_model)
    if distributed.is_writer():
        with files.atomic_directory(path, replace=replace) as out:
            save_file(tensors, out / PEFT_WEIGHTS_FILE, metadata={"format": "pt"})
            (out / PEFT_CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            files.give_new_file_modes(out)
    distributed.wait_for_everyone(f"export {path}")
    return path

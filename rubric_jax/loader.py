"""The one way model parameters are made, and the one form they travel in.

Sources: a local Hugging Face directory (config.json + safetensors), the params of an orbax train
checkpoint of one of our runs (`<workdir>/checkpoints/<stage>/<step>/state`; the model config comes
from the caller), or a seeded random init. Targets: a `sharding.Layout` (the training layout or the
decode layout) and ModelConfig overrides (dtypes, remat, scan). Every array is created directly in its
target sharding (`make_array_from_callback`, a restore into shardings, or a jitted init with
`out_shardings`): no model ever sits whole on one device.

The form is `Weights`: the model config, its NNX graphdef, a pure nested dict of arrays and the
matching tree of shardings. The policy, the frozen reference, the LLM judges and the CLIs all hold
one. Nothing moves parameters implicitly: `to_layout` reshards (and casts) explicitly, once per
rollout for the policy, and `check_placement` is what consumers call instead of moving anything.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from rubric_jax import sharding
from rubric_jax.counts import DTYPE_CHOICES
from rubric_jax.models import lora
from rubric_jax.models.checkpoint import CheckpointError, abstract_model, read_hf_params
from rubric_jax.models.config import ATTENTIONS, ModelConfig
from rubric_jax.models.transformer import Transformer, has_layer_stack, stack_layers, unstack_layers

Params = dict[str, Any]
ATTENTION_CHOICES = ("auto", *ATTENTIONS)  # what a user may ask a model's teacher-forced attention to be
_ORBAX_MARKER = "_METADATA"  # present in every orbax PyTree item directory
_PARAMS_KEY = "params"  # where our TrainState keeps the model parameters in an orbax checkpoint


class PlacementError(ValueError):
    """Parameters that are not where (or in the dtype) a consumer was told they are."""


@dataclasses.dataclass(frozen=True)
class Weights:
    """One model's parameters: config, graphdef (static), a pure dict of arrays and their shardings.

    The layers are stacked (`params["layers"]` leaves [L, ...], what training and the graphdef hold) or, in
    the decode form, a tuple of per-layer trees (`to_layout(..., per_layer=True)`), which the sampler reads
    in place instead of copying every layer out of the stack on each call."""

    cfg: ModelConfig
    graphdef: nnx.GraphDef
    params: Params
    shardings: Params

    @property
    def per_layer(self) -> bool:
        """Whether the layers are per-layer arrays (the decode form) rather than one stack."""
        return not has_layer_stack(self.params)


def resolve_dtype(value: str, name: str, backend: str | None = None) -> str:
    """A dtype setting named `name` (e.g. "judge.param_dtype"): "auto" is bfloat16 on accelerators and
    float32 on CPU (where bfloat16 matmuls are slow and gain nothing). `backend`: the platform the model
    will run on (default: jax's; the dry run names the one it compiles for)."""
    if value not in DTYPE_CHOICES:
        raise ValueError(f"{name}={value!r}: expected one of {DTYPE_CHOICES}")
    if value == "auto":
        return "float32" if (backend or jax.default_backend()) == "cpu" else "bfloat16"
    return value


def resolve_attention(value: str, compute_dtype: str, name: str, backend: str | None = None) -> str:
    """An attention setting named `name` (e.g. "model.attention") as a ModelConfig.attention: "auto" is
    "cudnn" (flash attention) on NVIDIA GPUs in bfloat16/float16, "einsum" elsewhere (CPU: XLA's
    implementation of jax.nn.dot_product_attention writes the same scores as ours, in a layout XNNPACK
    runs slower; TPU: no fused kernel behind that call). `backend`: the platform the model will run on
    (default: jax's; the dry run names the one it compiles for, "gpu" meaning NVIDIA)."""
    if value not in ATTENTION_CHOICES:
        raise ValueError(f"{name}={value!r}: expected one of {ATTENTION_CHOICES}")
    if backend is None:
        backend = jax.default_backend()
        if backend == "gpu" and not jax.devices()[0].device_kind.startswith("NVIDIA"):
            backend = "rocm"
    if value == "cudnn" and backend != "gpu":
        raise ValueError(f"{name}='cudnn': cuDNN attention needs an NVIDIA GPU; this run's backend is {backend}")
    if value == "auto":
        return "cudnn" if backend == "gpu" and compute_dtype in ("bfloat16", "float16") else "einsum"
    return value


def _path_str(path: tuple[Any, ...]) -> str:
    """A key path as 'params/w' whether its entries are dict keys, attributes or sequence indices."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


@functools.lru_cache(maxsize=32)
def _abstract(cfg: ModelConfig, layout: sharding.Layout) -> tuple[nnx.GraphDef, Params, Params]:
    """Graphdef, abstract params (ShapeDtypeStructs) and shardings of `cfg` in `layout` (cached: the
    same layout gives an equal graphdef, so compiled programs keyed on it are reused)."""
    if layout.mesh.size == 1:  # plain single-device arrays (what jnp.asarray makes), nothing to constrain
        graphdef, state = abstract_model(cfg)
        device = jax.sharding.SingleDeviceSharding(layout.mesh.devices.item())
        abstract = nnx.to_pure_dict(state)
        return graphdef, abstract, jax.tree.map(lambda _: device, abstract)
    graphdef, state = abstract_model(cfg, layout.shard_activation)
    return graphdef, nnx.to_pure_dict(state), nnx.to_pure_dict(layout.param_shardings(state))


def _layer_sharding(stacked: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """The sharding of one layer of a stacked parameter (its L axis is never split)."""
    if not isinstance(stacked, jax.sharding.NamedSharding):  # one device
        return stacked
    if stacked.spec and stacked.spec[0] is not None:
        raise ValueError(f"a layer stack split over its L axis ({stacked.spec}) has no per-layer form")
    return jax.sharding.NamedSharding(stacked.mesh, jax.sharding.PartitionSpec(*stacked.spec[1:]))


def expected_shardings(cfg: ModelConfig, layout: sharding.Layout, per_layer: bool = False) -> Params:
    """The sharding of every parameter of `cfg` in `layout` (a pure dict mirroring the params; the layers
    per layer with `per_layer`, see `Weights`)."""
    shardings = _abstract(cfg, layout)[2]
    return unstack_layers(shardings, cfg.num_layers, lambda s, _: _layer_sharding(s)) if per_layer else shardings


def abstract_weights(cfg: ModelConfig, layout: sharding.Layout | None = None, *, per_layer: bool = False) -> Weights:
    """Weights of ShapeDtypeStructs (with shardings): for ahead-of-time lowering, allocating nothing."""
    layout = layout or sharding.single_device_layout()
    graphdef, abstract, _ = _abstract(cfg, layout)
    if per_layer:
        abstract = unstack_layers(abstract, cfg.num_layers, lambda a, _: jax.ShapeDtypeStruct(a.shape[1:], a.dtype))
    shardings = expected_shardings(cfg, layout, per_layer)
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    return Weights(cfg, graphdef, params, shardings)


def as_weights(cfg: ModelConfig, params: Params, layout: sharding.Layout | None = None) -> Weights:
    """Existing arrays (already in `layout`, default one device) as Weights; moves nothing (consumers
    check placement)."""
    graphdef, _, shardings = _abstract(cfg, layout or sharding.single_device_layout())
    return Weights(cfg, graphdef, params, shardings)


def init_weights(cfg: ModelConfig, layout: sharding.Layout | None, key: jax.Array) -> Weights:
    """A seeded random init (HF's N(0, 0.02)), every array created in its shard by one jitted init."""
    layout = layout or sharding.single_device_layout()
    graphdef, _, shardings = _abstract(cfg, layout)
    return Weights(cfg, graphdef, _init_fn(cfg, layout)(key), shardings)


@functools.lru_cache(maxsize=32)
def _init_fn(cfg: ModelConfig, layout: sharding.Layout) -> Callable[[jax.Array], Params]:
    """The jitted init of `cfg` in `layout` (cached like `_abstract`: a second init of the same model in one
    process, e.g. a restarted run's, traces and compiles nothing)."""
    def init(k: jax.Array) -> Params:
        return nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(k))))

    return jax.jit(init, out_shardings=_abstract(cfg, layout)[2])


def add_adapters(weights: Weights, lora_config: lora.LoraConfig, layout: sharding.Layout | None, key: jax.Array
                 ) -> Weights:
    """`weights`' model with fresh adapters on `lora_config.targets` (lora_a uniform from `key`, lora_b zero: the
    same function as the base), created in their shards by one jitted init; the base arrays are kept, not copied."""
    if weights.per_layer or lora.has_adapters(weights.params):
        raise ValueError("add_adapters: needs a stacked base model without adapters")
    layout = layout or sharding.single_device_layout()
    cfg = weights.cfg.replace(lora=lora_config)
    graphdef, _, shardings = _abstract(cfg, layout)
    return Weights(cfg, graphdef, lora.join(_adapter_init_fn(cfg, layout)(key), weights.params), shardings)


@functools.lru_cache(maxsize=32)
def _adapter_init_fn(cfg: ModelConfig, layout: sharding.Layout) -> Callable[[jax.Array], Params]:
    """The jitted init of `cfg`'s adapters alone in `layout` (the base's unused init is dead code to XLA)."""
    def init(k: jax.Array) -> Params:
        return lora.split(nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(k)))))[0]

    return jax.jit(init, out_shardings=lora.split(_abstract(cfg, layout)[2])[0])


def base_weights(weights: Weights, layout: sharding.Layout | None = None) -> Weights:
    """The base model of LoRA `weights`: the same arrays with the adapters left out (the reference policy of a
    LoRA run, no second copy)."""
    cfg = weights.cfg.replace(lora=None)
    return Weights(cfg, _abstract(cfg, layout or sharding.single_device_layout())[0], lora.strip(weights.params),
                   lora.strip(weights.shardings))


def load_weights(source: str | Path, layout: sharding.Layout | None = None, *,
                 model_config: ModelConfig | None = None, **overrides: Any) -> Weights:
    """Parameters from a HF directory or an orbax params checkpoint, placed in `layout` (default: one device).

    `overrides` set ModelConfig fields (param_dtype, compute_dtype, remat, scan_layers). A HF directory
    brings its own config.json; with `model_config`, `source` is an orbax checkpoint of a run
    (`.../checkpoints/<stage>/<step>/state`), read as that model and cast to its `param_dtype`.
    """
    layout = layout or sharding.single_device_layout()
    path = Path(source)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    if model_config is not None:
        return _load_orbax(path, model_config.replace(**overrides), layout)
    if (path / _ORBAX_MARKER).is_file() and not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: an orbax params checkpoint carries no model config; pass model_config")
    cfg = ModelConfig.from_hf_dir(path, **overrides)
    graphdef, abstract, shardings = _abstract(cfg, layout)
    return Weights(cfg, graphdef, read_hf_params(path, cfg, abstract, shardings), shardings)


def check_saved_tree(saved_tree: Any, target: Any, where: Path, *, check_dtype: bool = True) -> None:
    """Compares an orbax checkpoint's array metadata with a target tree, naming the first difference."""
    if saved_tree is None:
        raise CheckpointError(f"{where}: the checkpoint holds no state arrays")

    def is_array_meta(x: Any) -> bool:
        return hasattr(x, "shape") and hasattr(x, "dtype")

    def described(x: Any) -> tuple[Any, ...]:
        return (tuple(x.shape), str(x.dtype)) if check_dtype else (tuple(x.shape),)

    saved = {_path_str(p): described(x)
             for p, x in jax.tree_util.tree_flatten_with_path(saved_tree, is_leaf=is_array_meta)[0]}
    wanted = {_path_str(p): described(x) for p, x in jax.tree_util.tree_flatten_with_path(target)[0]}
    if saved.keys() != wanted.keys():
        missing, unexpected = sorted(wanted.keys() - saved.keys()), sorted(saved.keys() - wanted.keys())
        raise CheckpointError(f"{where}: the saved state has another structure than the target "
                              f"(missing from checkpoint: {missing[:5]}, not in target: {unexpected[:5]})")
    for name, want in wanted.items():
        if saved[name] != want:
            kind = "shape/dtype" if check_dtype else "shape"
            raise CheckpointError(f"{where}: {name} is saved as {kind} {saved[name]}, target wants {want}")


def _load_orbax(path: Path, cfg: ModelConfig, layout: sharding.Layout) -> Weights:
    """Restores only the params subtree (no optimizer state is read) straight into `layout`'s shardings,
    cast by orbax to `cfg.param_dtype` as it reads. A LoRA `cfg`'s checkpoint holds the adapters alone (its base is
    named, not saved): the Weights returned then hold only them (`lora.join` them to the base)."""
    graphdef, abstract, shardings = _abstract(cfg, layout)
    if cfg.lora is not None:
        abstract, shardings = lora.split(abstract)[0], lora.split(shardings)[0]
    target = {_PARAMS_KEY: jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                       abstract, shardings)}
    handler = ocp.PyTreeCheckpointHandler()
    try:
        saved = handler.metadata(epath.Path(path)).tree
        saved_params = saved.get(_PARAMS_KEY) if isinstance(saved, Mapping) else None
        check_saved_tree(None if saved_params is None else {_PARAMS_KEY: saved_params}, target, path,
                         check_dtype=False)
        restored = handler.restore(epath.Path(path), args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True))
    except CheckpointError:
        raise
    except Exception as e:  # orbax raises many types (FileNotFoundError, ValueError, KeyError...)
        first_line = (str(e).splitlines() or [""])[0]
        raise CheckpointError(f"{path}: cannot restore the params ({type(e).__name__}: {first_line})") from e
    finally:
        handler.close()
    return Weights(cfg, graphdef, restored[_PARAMS_KEY], shardings)


@functools.lru_cache(maxsize=32)
def _convert_fn(cfg: ModelConfig, layout: sharding.Layout, per_layer: bool, adapters: lora.LoraConfig | None = None):
    """One jitted cast + reshard into (cfg.param_dtype, layout), the layers stacked or per layer, with `adapters`'
    low-rank updates merged into their kernels first (in float32); the source arrays are left untouched."""
    def convert(params: Params) -> Params:
        if adapters is not None:
            params = lora.merge(params, adapters.scale)
        params = jax.tree.map(lambda x: x.astype(cfg.param_dtype), params)
        if per_layer and has_layer_stack(params):
            return unstack_layers(params, cfg.num_layers)
        if not per_layer and not has_layer_stack(params):
            return stack_layers(params)
        return params

    return jax.jit(convert, out_shardings=expected_shardings(cfg, layout, per_layer))


def to_layout(weights: Weights, layout: sharding.Layout, *, param_dtype: str | None = None,
              per_layer: bool = False) -> Weights:
    """The same parameters in `layout` and `param_dtype` (default: unchanged), the layers stacked or per
    layer (`Weights`): cast and resharded in one jitted program (arrays already in place are reused, not
    copied). Used once per rollout for the policy (training -> decode layout, per layer); nothing is ever
    resharded back. LoRA weights come out merged (each adapted kernel + alpha/r · lora_a @ lora_b, a plain model):
    the merge rides in the same program, so it costs no copy beyond the decode copy itself, and the sampler pays no
    adapter matmuls per token.
    """
    cfg = weights.cfg if param_dtype is None else weights.cfg.replace(param_dtype=param_dtype)
    adapters, cfg = cfg.lora, cfg.replace(lora=None)
    graphdef = _abstract(cfg, layout)[0]
    shardings = expected_shardings(cfg, layout, per_layer)
    if adapters is None and _placed(weights.params, shardings, jnp.dtype(cfg.param_dtype)):  # nothing to move
        return Weights(cfg, graphdef, weights.params, shardings)
    return Weights(cfg, graphdef, _convert_fn(cfg, layout, per_layer, adapters)(weights.params), shardings)


def _placed(params: Params, shardings: Params, dtype: jnp.dtype) -> bool:
    """Whether every array already has its sharding and `dtype` (and the layers their form)."""
    return jax.tree.structure(params) == jax.tree.structure(shardings) and all(
        x.dtype == dtype and x.sharding.is_equivalent_to(s, x.ndim)
        for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)))


def check_shardings(params: Params, shardings: Params, *, what: str) -> None:
    """Raises PlacementError naming the first array whose sharding is not its entry of `shardings`."""
    flat_want = dict(jax.tree_util.tree_flatten_with_path(shardings)[0])
    flat_got = jax.tree_util.tree_flatten_with_path(params)[0]
    if {p for p, _ in flat_got} != set(flat_want):
        raise PlacementError(f"{what}: the parameter tree does not match its shardings' tree")
    for path, x in flat_got:
        expected = flat_want[path]
        if x.sharding is None or not x.sharding.is_equivalent_to(expected, x.ndim):
            raise PlacementError(f"{what}: {_path_str(path)} has sharding {x.sharding}, expected {expected}; "
                                 "place it explicitly first (rubric_jax.loader.to_layout)")


def check_placement(weights: Weights, layout: sharding.Layout, *, what: str = "parameters") -> None:
    """Raises PlacementError naming the first parameter whose sharding or dtype is not what `layout`
    and `weights.cfg.param_dtype` say (arrays and ShapeDtypeStructs alike); never moves anything."""
    check_shardings(weights.params, expected_shardings(weights.cfg, layout, weights.per_layer), what=what)
    want_dtype = jnp.dtype(weights.cfg.param_dtype)
    for path, x in jax.tree_util.tree_flatten_with_path(weights.params)[0]:
        if x.dtype != want_dtype:
            raise PlacementError(f"{what}: {_path_str(path)} has dtype {x.dtype}, expected {want_dtype} "
                                 "(the config's param_dtype); cast it explicitly first (loader.to_layout)")

"""Device mesh from config, logical-axis rules, and shardings for params, optimizer state and batches.

Mode: classic GSPMD. Every mesh axis is `jax.sharding.AxisType.Auto` (jax 0.10's `jax.make_mesh`
defaults to Explicit axes; we build `jax.sharding.Mesh` directly with Auto axes), so shardings are
given to `jax.jit` as in/out shardings and the compiler propagates everything in between.

Parameters carry *logical* axis names (e.g. ("layers", "embed", "heads", "head_dim")) in their
NNX metadata. `LOGICAL_RULES` maps each logical name to zero or more mesh axes. A logical spec becomes
a mesh `PartitionSpec` dimension by dimension, by `logical_to_mesh_spec`:
  1. a logical name absent from the rules is an error (a typo must not silently replicate);
  2. mesh axes of size 1 are dropped (they shard nothing);
  3. a mesh axis already used by an earlier dimension is dropped (an axis shards one dim only);
  4. trailing mesh axes are dropped until the product of the remaining axis sizes divides the
     dimension (so batch 4 on data=2 x fsdp=4 shards over data only; vocab 7 stays replicated).

Two layouts (`Layout` = a mesh + a rules table) over the same devices:
  * training (`LOGICAL_RULES` on the configured data x fsdp x tensor mesh): weights FSDP-sharded over
    `embed`, and the residual stream constrained to batch over (data, fsdp) in every layer
    (`Layout.shard_activation`, handed to the model), so a layer never all-reduces activations;
  * decode (`decode_layout`, `DECODE_RULES`): the same devices as data x 1 x tensor, tensor groups of
    consecutive devices within one host; weights are never FSDP-sharded, only split over heads, KV
    heads, MLP width and vocab on `tensor`, so a decode step never all-gathers a weight. Parameters
    are resharded train -> decode once per rollout (rubric_jax.loader.to_layout); the judge lives there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis name -> mesh axes (in order of preference) that shard it; () means replicated.
LogicalRules = tuple[tuple[str, tuple[str, ...]], ...]
LOGICAL_RULES: LogicalRules = (
    ("batch", ("data", "fsdp")),
    ("embed", ("fsdp",)),
    ("vocab", ("tensor",)),
    ("heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("mlp", ("tensor",)),
    ("layers", ()),
    ("head_dim", ()),
    ("length", ()),
    ("prefix_length", ("data", "fsdp")),  # shared prompts' tokens: over the batch shards their count leaves idle
    ("activation_embed", ()),  # the residual stream's hidden dim: never split (a split costs all-reduces)
)
# Decoding: no FSDP (an FSDP weight is all-gathered on every generated token); Megatron-style tensor
# parallelism over heads / KV heads / MLP width / vocab; rows over data (fsdp is 1 in a decode mesh).
DECODE_RULES: LogicalRules = tuple((name, () if name == "embed" else axes) for name, axes in LOGICAL_RULES)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axis sizes; exactly one may be -1, meaning 'all devices not used by the others'."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def axis_sizes(self, num_devices: int) -> tuple[int, int, int]:
        """Resolves -1 and checks that data * fsdp * tensor == num_devices."""
        sizes = (self.data, self.fsdp, self.tensor)
        for name, size in zip(MESH_AXES, sizes):
            if size == 0 or size < -1:
                raise ValueError(f"MeshConfig.{name}={size}: axis sizes must be positive or -1")
        if sizes.count(-1) > 1:
            raise ValueError(f"MeshConfig {self}: at most one axis may be -1")
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(
                    f"MeshConfig {self}: the fixed axes (product {known}) do not divide the "
                    f"{num_devices} devices, so the -1 axis has no integer size"
                )
            sizes = tuple(num_devices // known if s == -1 else s for s in sizes)
        if math.prod(sizes) != num_devices:
            raise ValueError(
                f"MeshConfig {self}: data*fsdp*tensor = {math.prod(sizes)} but there are "
                f"{num_devices} devices; the product must equal the device count"
            )
        return sizes


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds a (data, fsdp, tensor) mesh with Auto axes over `devices` (default: all devices)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = config.axis_sizes(len(devices))
    device_grid = np.asarray(devices, dtype=object).reshape(sizes)
    return Mesh(device_grid, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def _rule_table(rules: LogicalRules) -> dict[str, tuple[str, ...]]:
    """Rules as a dict, rejecting duplicate logical names."""
    table = dict(rules)
    if len(table) != len(rules):
        raise ValueError(f"logical axis rules name a logical axis twice: {rules}")
    return table


def logical_to_mesh_spec(
    logical_spec: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh,
    rules: LogicalRules = LOGICAL_RULES,
) -> PartitionSpec:
    """Maps a logical spec for an array of `shape` to a mesh PartitionSpec (rules in module docstring)."""
    if len(logical_spec) > len(shape):
        raise ValueError(f"logical spec {tuple(logical_spec)} has more entries than shape {tuple(shape)}")
    table = _rule_table(rules)
    used: set[str] = set()
    mesh_spec: list[str | tuple[str, ...] | None] = []
    for name, dim in zip(logical_spec, shape):
        if name is None:
            mesh_spec.append(None)
            continue
        if name not in table:
            raise ValueError(f"logical axis {name!r} has no rule; known: {sorted(table)}")
        axes = [a for a in table[name] if mesh.shape[a] > 1 and a not in used]
        while axes and dim % math.prod(mesh.shape[a] for a in axes):
            axes.pop()
        used.update(axes)
        mesh_spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*mesh_spec)


def logical_to_sharding(
    logical_spec: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh,
    rules: LogicalRules = LOGICAL_RULES,
) -> NamedSharding:
    """NamedSharding on `mesh` for an array of `shape` with logical axis names `logical_spec`."""
    return NamedSharding(mesh, logical_to_mesh_spec(logical_spec, shape, mesh, rules))


def param_shardings(abstract_state: Any, mesh: Mesh, rules: LogicalRules = LOGICAL_RULES) -> Any:
    """Shardings mirroring an NNX state (abstract or concrete): each Variable's value -> NamedSharding."""

    def to_sharding(variable: nnx.Variable) -> nnx.Variable:
        logical = nnx.get_partition_spec(variable).get_value()
        return variable.replace(logical_to_sharding(tuple(logical), variable.get_value().shape, mesh, rules))

    return jax.tree.map(to_sharding, abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where arrays live: a mesh and the logical-axis rules that place named axes on it.

    Hashable and compared by value, so a model built with `shard_activation` has the same graphdef
    (and hits the same compiled programs) every time it is built for an equal layout.
    """

    mesh: Mesh
    rules: LogicalRules = LOGICAL_RULES

    def sharding(self, logical_spec: Sequence[str | None], shape: Sequence[int]) -> NamedSharding:
        """NamedSharding of an array of `shape` whose axes have the logical names `logical_spec`."""
        return logical_to_sharding(logical_spec, shape, self.mesh, self.rules)

    def param_shardings(self, abstract_state: Any) -> Any:
        """`param_shardings` of an NNX state under this layout's rules."""
        return param_shardings(abstract_state, self.mesh, self.rules)

    def shard_activation(self, x: jax.Array, logical_spec: Sequence[str | None]) -> jax.Array:
        """Constrains an activation inside `jit` to this layout (what the model calls per layer)."""
        return jax.lax.with_sharding_constraint(x, self.sharding(logical_spec, x.shape))

    @property
    def batch_multiple(self) -> int:
        """How many ways the batch is split (data x fsdp): batches are padded to a multiple of it."""
        return self.mesh.shape["data"] * self.mesh.shape["fsdp"]


def single_device_layout(device: jax.Device | None = None) -> Layout:
    """The layout of plain unsharded arrays on one device (default: the first)."""
    return Layout(make_mesh(MeshConfig(), [device or jax.devices()[0]]))


def decode_layout(mesh: Mesh, tensor: int) -> Layout:
    """The decode layout over `mesh`'s devices: groups of `tensor` consecutive devices split each weight
    over heads / KV heads / MLP width / vocab (`DECODE_RULES`), and the groups hold replicas (data).

    A tensor group must sit on one host (tensor-parallel all-reduces run every layer of every token).
    """
    devices = mesh.devices.reshape(-1)
    if isinstance(tensor, bool) or not isinstance(tensor, int) or tensor < 1 or devices.size % tensor:
        raise ValueError(f"tensor-parallel size {tensor!r} must be a positive integer dividing the "
                         f"{devices.size} devices")
    for group in devices.reshape(-1, tensor):
        hosts = sorted({d.process_index for d in group})
        if len(hosts) > 1:
            raise ValueError(f"tensor-parallel size {tensor}: a group would span hosts {hosts}; use at most "
                             "the devices of one host")
    grid = devices.reshape(devices.size // tensor, 1, tensor)
    return Layout(Mesh(grid, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES)), DECODE_RULES)


def batch_sharding(mesh: Mesh, shape: Sequence[int] | None = None) -> NamedSharding:
    """Sharding of a batch-major array: leading dim over (data, fsdp), the rest replicated.

    With `shape`, the divisibility rule applies (axes that do not divide the batch are dropped);
    without it the caller guarantees that data * fsdp divides the batch.
    """
    if shape is None:
        return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    return logical_to_sharding(("batch",), shape, mesh)


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding on `mesh` (scalars, PRNG keys, small tables)."""
    return NamedSharding(mesh, PartitionSpec())


def mirror_shardings(tree: Any, params: Any, shardings_of_params: Any, mesh: Mesh) -> Any:
    """Shardings for `tree` (e.g. optimizer state): every subtree shaped like `params` gets the param
    shardings, every other leaf (step counts, scalars) is replicated."""
    params_def = jax.tree.structure(params)
    param_leaves_shardings = jax.tree.leaves(shardings_of_params)
    if len(param_leaves_shardings) != params_def.num_leaves:
        raise ValueError(
            f"shardings_of_params has {len(param_leaves_shardings)} leaves, params has {params_def.num_leaves}"
        )

    def is_params_like(x: Any) -> bool:
        return jax.tree.structure(x) == params_def

    def assign(x: Any) -> Any:
        if is_params_like(x):
            return jax.tree.unflatten(jax.tree.structure(x), param_leaves_shardings)
        return replicated(mesh)

    return jax.tree.map(assign, tree, is_leaf=is_params_like)


def shard_pytree(tree: Any, shardings: Any) -> Any:
    """Places every array of `tree` according to the matching entry of `shardings` (a tree prefix)."""
    return jax.device_put(tree, shardings)

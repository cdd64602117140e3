"""Mesh construction, logical-axis rules and sharding trees (no sharded computation; see *_multidevice)."""

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rubric_jax import sharding


class _Toy(nnx.Module):
    """Two annotated params and one unannotated, enough to exercise param_shardings."""

    def __init__(self):
        self.w = nnx.Param(jnp.ones((16, 8)), sharding_names=("embed", "mlp"), eager_sharding=False)
        self.b = nnx.Param(jnp.ones((8,)), sharding_names=("mlp",), eager_sharding=False)
        self.c = nnx.Param(jnp.ones((3,)))


def _mesh(data, fsdp, tensor):
    return sharding.make_mesh(sharding.MeshConfig(data=data, fsdp=fsdp, tensor=tensor))


def test_mesh_config_resolves_minus_one():
    assert sharding.MeshConfig(data=2, fsdp=-1, tensor=2).axis_sizes(8) == (2, 2, 2)
    assert sharding.MeshConfig().axis_sizes(8) == (1, 8, 1)
    assert sharding.MeshConfig(data=-1, fsdp=1, tensor=4).axis_sizes(8) == (2, 1, 4)


@pytest.mark.parametrize(
    "config, match",
    [
        (sharding.MeshConfig(data=2, fsdp=2, tensor=1), "product must equal the device count"),
        (sharding.MeshConfig(data=3, fsdp=-1, tensor=1), "do not divide"),
        (sharding.MeshConfig(data=-1, fsdp=-1, tensor=1), "at most one axis"),
        (sharding.MeshConfig(data=0, fsdp=-1, tensor=1), "MeshConfig.data=0"),
    ],
)
def test_mesh_config_rejects_bad_sizes(config, match):
    with pytest.raises(ValueError, match=match):
        config.axis_sizes(8)


def test_make_mesh_uses_auto_axes_and_all_devices():
    mesh = _mesh(2, -1, 2)
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert mesh.axis_types == (jax.sharding.AxisType.Auto,) * 3
    assert mesh.devices.size == len(jax.devices())
    one = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    assert dict(one.shape) == {"data": 1, "fsdp": 1, "tensor": 1}


def test_logical_rules_map_and_drop_non_dividing_axes():
    mesh = _mesh(2, 2, 2)
    spec = sharding.logical_to_mesh_spec
    assert spec(("batch", None), (8, 5), mesh) == P(("data", "fsdp"), None)
    # 6 is divisible by data=2 but not by data*fsdp=4: the trailing axis is dropped.
    assert spec(("batch",), (6,), mesh) == P("data")
    assert spec(("batch",), (3,), mesh) == P(None)
    assert spec(("layers", "embed", "heads", "head_dim"), (4, 16, 6, 8), mesh) == P(None, "fsdp", "tensor", None)
    assert spec(("vocab", "embed"), (7, 16), mesh) == P(None, "fsdp")
    # An axis shards one dimension only: the second "mlp" dim stays replicated.
    assert spec(("mlp", "mlp"), (4, 4), mesh) == P("tensor", None)
    # Size-1 mesh axes are dropped.
    assert spec(("batch", "embed"), (8, 8), _mesh(1, 8, 1)) == P("fsdp", None)


def test_logical_rules_reject_unknown_names_and_long_specs():
    mesh = _mesh(1, 8, 1)
    with pytest.raises(ValueError, match="'embd' has no rule"):
        sharding.logical_to_mesh_spec(("embd",), (8,), mesh)
    with pytest.raises(ValueError, match="more entries than shape"):
        sharding.logical_to_mesh_spec(("embed", None), (8,), mesh)
    with pytest.raises(ValueError, match="twice"):
        sharding.logical_to_mesh_spec(("embed",), (8,), mesh, rules=(("embed", ()), ("embed", ("fsdp",))))


def test_param_shardings_follow_metadata_for_concrete_and_abstract_state():
    mesh = _mesh(1, 4, 2)
    _, state = nnx.split(_Toy())
    abstract = jax.eval_shape(lambda: nnx.split(_Toy())[1])
    for tree in (state, abstract):
        specs = jax.tree.map(lambda s: s.spec, sharding.param_shardings(tree, mesh))
        assert nnx.to_pure_dict(specs) == {"w": P("fsdp", "tensor"), "b": P("tensor"), "c": P()}


def test_mirror_shardings_gives_optimizer_moments_the_param_shardings():
    mesh = _mesh(1, 4, 2)
    _, state = nnx.split(_Toy())
    param_sh = sharding.param_shardings(state, mesh)
    opt_state = optax.adam(1e-3).init(state)
    opt_sh = sharding.mirror_shardings(opt_state, state, param_sh, mesh)
    adam = opt_sh[0]
    assert adam.count.spec == P()
    for moments in (adam.mu, adam.nu):
        assert nnx.to_pure_dict(jax.tree.map(lambda s: s.spec, moments)) == {
            "w": P("fsdp", "tensor"),
            "b": P("tensor"),
            "c": P(),
        }
    placed = sharding.shard_pytree(opt_state, opt_sh)
    assert placed[0].mu["w"].get_value().sharding.spec == P("fsdp", "tensor")


def test_batch_sharding():
    mesh = _mesh(2, 2, 2)
    assert sharding.batch_sharding(mesh).spec == P(("data", "fsdp"))
    assert sharding.batch_sharding(mesh, (6, 3)).spec == P("data")
    assert sharding.replicated(mesh).spec == P()

"""LoRA in the model: settings validation, step 0 == the base (logits and greedy tokens, scanned, unrolled,
rematerialised), the reference = the same base arrays with the adapters off, merged == unmerged == a numpy
merge (base + B·A·alpha/r), and the decode form of an adapted model."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_jax import loader, sharding
from rubric_jax.models import checkpoint, lora
from rubric_jax.models.checkpoint import export_hf_checkpoint
from rubric_jax.models.config import ModelConfig, ModelConfigError
from rubric_jax.models.kv_cache import init_cache
from rubric_jax.models.transformer import causal_padding_mask, padding_to_positions, stack_layers, unstack_layers
from tests.models.test_checkpoint import read_tensors
from tests.random_model import random_weights

CFG = ModelConfig(architecture="qwen2", vocab_size=48, hidden_size=16, intermediate_size=32, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=4, rope_theta=10000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=True, rope_scaling=None, max_position_embeddings=32)
ALL = lora.LoraConfig(rank=4, alpha=8.0, targets=lora.TARGETS)


def _tokens():
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (3, 7)), jnp.int32)
    mask = jnp.asarray(np.arange(7)[None, :] >= np.array([0, 2, 1])[:, None])
    return tokens, mask


def logits_of(weights: loader.Weights) -> np.ndarray:
    """The model's float32 logits on a fixed padded batch."""
    tokens, mask = _tokens()
    model = nnx.merge(weights.graphdef, weights.params)
    return np.asarray(model(tokens, padding_to_positions(mask), causal_padding_mask(mask))[0])


def with_random_b(weights: loader.Weights, seed: int = 1) -> loader.Weights:
    """`weights` with every lora_b drawn N(0, 0.3) (a trained-looking adapter: B = 0 hides the A side)."""
    rng = np.random.default_rng(seed)

    def draw(path, x):
        return jnp.asarray(rng.normal(0, 0.3, x.shape), x.dtype) if path[-1].key == "lora_b" else x

    return loader.Weights(weights.cfg, weights.graphdef, jax.tree_util.tree_map_with_path(draw, weights.params),
                          weights.shardings)


def numpy_merge(params: dict, scale: float) -> dict:
    """The hand-built reference: every adapted kernel + scale · A @ B, in numpy (per layer for stacked ones)."""
    def walk(node):
        out = {k: walk(v) if isinstance(v, dict) else np.asarray(v) for k, v in node.items()
               if k not in lora.ADAPTER_KEYS}
        if "lora_a" in node:
            w, a, b = (np.asarray(node[k], np.float64) for k in ("kernel", "lora_a", "lora_b"))
            lead = a.ndim + b.ndim - 2 - w.ndim
            a2 = a.reshape(*a.shape[:lead], -1, a.shape[-1])
            b2 = b.reshape(*b.shape[:lead], b.shape[lead], -1)
            out["kernel"] = (w + scale * (a2 @ b2).reshape(w.shape)).astype(np.float32)
        return out

    return walk(params)


@pytest.fixture(scope="module")
def base():
    return random_weights(CFG, std=0.3)


@pytest.fixture(scope="module")
def adapted(base):
    return loader.add_adapters(base, ALL, None, jax.random.key(5))


@pytest.mark.parametrize("changes, error", [
    (dict(rank=0), "LoraConfig.rank=0: must be an integer >= 1"),
    (dict(alpha=float("nan")), "LoraConfig.alpha=nan: must be a finite number > 0"),
    (dict(dropout=0.1), "LoraConfig.dropout=0.1: only 0 is implemented"),
    (dict(targets=("q_proj", "qkv")), "LoraConfig.targets=('q_proj', 'qkv'): unknown module(s) ['qkv']"),
    (dict(targets=["q_proj"]), "LoraConfig.targets=['q_proj']: must be a non-empty tuple"),
    (dict(targets=("q_proj", "q_proj")), "names a module twice"),
])
def test_lora_config_errors_name_the_field(changes, error):
    with pytest.raises(ValueError) as e:
        lora.LoraConfig(**changes)
    assert error in str(e.value)


def test_lm_head_target_needs_an_lm_head():
    with pytest.raises(ModelConfigError, match="field 'lora': targets lm_head"):
        CFG.replace(tie_word_embeddings=True, lora=ALL)


def test_adapter_shapes_and_init(adapted):
    attn, mlp = adapted.params["layers"]["self_attn"], adapted.params["layers"]["mlp"]
    assert attn["q_proj"]["lora_a"].shape == (2, 16, 4) and attn["q_proj"]["lora_b"].shape == (2, 4, 4, 4)
    assert attn["o_proj"]["lora_a"].shape == (2, 4, 4, 4) and attn["o_proj"]["lora_b"].shape == (2, 4, 16)
    assert mlp["down_proj"]["lora_a"].shape == (2, 32, 4) and mlp["down_proj"]["lora_b"].shape == (2, 4, 16)
    assert adapted.params["lm_head"]["lora_a"].shape == (16, 4) and adapted.params["lm_head"]["lora_b"].shape == (4, 48)
    adapters, rest = lora.split(adapted.params)
    for path, x in jax.tree_util.tree_flatten_with_path(adapters)[0]:
        if path[-1].key == "lora_b":
            assert not np.any(np.asarray(x)), path
        else:
            bound = 1 / np.sqrt(np.prod(x.shape[1 if x.ndim > 2 else 0:-1]))
            assert 0 < np.abs(np.asarray(x)).max() <= bound, path
    assert rest["layers"]["self_attn"]["q_proj"]["kernel"] is adapted.params["layers"]["self_attn"]["q_proj"]["kernel"]
    n_adapters, n_base = (sum(x.size for x in jax.tree.leaves(tree)) for tree in lora.split(adapted.params))
    assert n_base == sum(x.size for x in jax.tree.leaves(loader.base_weights(adapted).params))
    assert n_adapters == 2 * (16 * 4 + 4 * 16 + 2 * (16 * 4 + 4 * 8) + 16 * 4 + 4 * 16
                              + 2 * (16 * 4 + 4 * 32) + 32 * 4 + 4 * 16) + 16 * 4 + 4 * 48


@pytest.mark.parametrize("changes", [{}, dict(scan_layers=False), dict(remat=True)])
def test_step_zero_equals_the_base_model(base, changes):
    base = loader.as_weights(CFG.replace(**changes), base.params)
    adapted = loader.add_adapters(base, ALL, None, jax.random.key(5))
    expected, got = logits_of(base), logits_of(adapted)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))  # greedy tokens


def test_reference_is_the_base_without_a_copy(base, adapted):
    trained = with_random_b(adapted)
    reference = loader.base_weights(trained)
    assert reference.cfg == CFG and reference.graphdef == base.graphdef
    for x, y in zip(jax.tree.leaves(reference.params), jax.tree.leaves(base.params)):
        assert x is y  # the same arrays: no second copy of the weights
    np.testing.assert_array_equal(logits_of(reference), logits_of(base))
    assert np.abs(logits_of(trained) - logits_of(base)).max() > 1e-2  # the adapters do change the policy


@pytest.mark.parametrize("targets", [lora.TARGETS, ("q_proj", "v_proj")])
def test_unmerged_equals_merged_equals_numpy(base, targets):
    trained = with_random_b(loader.add_adapters(base, lora.LoraConfig(rank=4, alpha=8.0, targets=targets), None,
                                                jax.random.key(5)))
    reference = loader.as_weights(CFG, jax.tree.map(jnp.asarray, numpy_merge(trained.params, 2.0)))
    merged = loader.to_layout(trained, sharding.single_device_layout())
    assert merged.cfg == CFG and not lora.has_adapters(merged.params)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), merged.params,
                 reference.params)
    np.testing.assert_allclose(logits_of(trained), logits_of(reference), rtol=1e-5, atol=1e-5)


def cached_logits(weights: loader.Weights) -> np.ndarray:
    """The logits of one cached forward over all tokens (no padding) of per-layer `weights`, read as the sampler
    reads the decode form (rubric_jax/sampling.py)."""
    tokens, _ = _tokens()
    ones = jnp.ones_like(tokens, bool)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    cache = init_cache(weights.cfg, tokens.shape[0], tokens.shape[1], jnp.float32, per_layer=True)

    def forward(params):
        model = nnx.merge(weights.graphdef, stack_layers(params))
        return model(tokens, positions, causal_padding_mask(ones), cache, jnp.zeros((), jnp.int32),
                     layers=params["layers"])[0]

    return np.asarray(jax.jit(forward)(weights.params))


def full_logits(weights: loader.Weights) -> np.ndarray:
    """The teacher-forced logits `cached_logits` must equal (no padding)."""
    tokens, _ = _tokens()
    ones = jnp.ones_like(tokens, bool)
    return np.asarray(nnx.merge(weights.graphdef, weights.params)(tokens, padding_to_positions(ones),
                                                                  causal_padding_mask(ones))[0])


def test_decode_form_of_an_adapted_model(adapted):
    """The per-layer (decode) form reads the adapters too (unmerged): its cached forward == the full forward."""
    trained = with_random_b(adapted)
    per_layer = dataclasses.replace(trained, params=unstack_layers(trained.params, CFG.num_layers))
    np.testing.assert_allclose(cached_logits(per_layer), full_logits(trained), rtol=1e-5, atol=1e-5)


def test_rollout_weights_are_merged_into_the_decode_layout(adapted):
    """`to_layout` of LoRA weights from an FSDP layout into a decode layout (tensor-parallel, per layer, as a
    rollout's sampler reads them): a plain model with the adapters merged, whose cached forward equals the adapted
    model's."""
    trained = with_random_b(adapted)
    layout = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=8, tensor=1)))
    placed = loader.as_weights(trained.cfg, jax.device_put(trained.params,
                                                           loader.expected_shardings(trained.cfg, layout)), layout)
    decode = loader.to_layout(placed, sharding.decode_layout(layout.mesh, 2), per_layer=True)
    assert decode.cfg == CFG and decode.per_layer and not lora.has_adapters(decode.params)
    q = decode.params["layers"][0]["self_attn"]["q_proj"]["kernel"]
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "tensor", None)
    np.testing.assert_allclose(cached_logits(decode), full_logits(trained), rtol=1e-5, atol=1e-5)


def test_peft_export_names_shapes_and_merge(base, tmp_path):
    """The PEFT adapter directory: PEFT's key names and torch layouts ([r, in], [out, r]), adapter_config.json; and
    PEFT's merge in torch layout (W + alpha/r · lora_B @ lora_A) of our exported base gives our merged export
    tensor for tensor; the merged export read back is the adapted model."""
    trained = with_random_b(loader.add_adapters(base, ALL, None, jax.random.key(5)))
    out = checkpoint.export_peft_adapter(trained.cfg, trained.params, tmp_path / "peft", base_model="base-dir")
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["target_modules"] == sorted(lora.TARGETS) and config["base_model_name_or_path"] == "base-dir"
    adapters = read_tensors(out)
    d, f, nh, kh = CFG.hidden_size, CFG.intermediate_size, CFG.num_heads * CFG.head_dim, CFG.num_kv_heads * CFG.head_dim
    shapes = {"self_attn.q_proj": (d, nh), "self_attn.k_proj": (d, kh), "self_attn.v_proj": (d, kh),
              "self_attn.o_proj": (nh, d), "mlp.gate_proj": (d, f), "mlp.up_proj": (d, f), "mlp.down_proj": (f, d)}
    expected = {f"base_model.model.model.layers.{i}.{m}.lora_{ab}.weight": (4, n_in) if ab == "A" else (n_out, 4)
                for i in range(CFG.num_layers) for m, (n_in, n_out) in shapes.items() for ab in "AB"}
    expected.update({"base_model.model.lm_head.lora_A.weight": (4, d),
                     "base_model.model.lm_head.lora_B.weight": (CFG.vocab_size, 4)})
    assert {k: v.shape for k, v in adapters.items()} == expected
    np.testing.assert_array_equal(adapters["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"],
                                  np.asarray(trained.params["layers"]["self_attn"]["q_proj"]["lora_a"][1]).T)

    base_dir = export_hf_checkpoint(CFG, base.params, tmp_path / "base")
    merged = loader.to_layout(trained, sharding.single_device_layout())
    merged_dir = export_hf_checkpoint(merged.cfg, merged.params, tmp_path / "merged")
    base_hf, merged_hf = read_tensors(base_dir), read_tensors(merged_dir)
    for name, w in base_hf.items():
        a_name = "base_model.model." + name.removesuffix(".weight") + ".lora_A.weight"
        want = w
        if a_name in adapters:
            want = w + ALL.scale * adapters[a_name.replace("lora_A", "lora_B")] @ adapters[a_name]
        np.testing.assert_allclose(merged_hf[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    reloaded = loader.load_weights(merged_dir)
    np.testing.assert_allclose(logits_of(reloaded), logits_of(trained), rtol=1e-5, atol=1e-5)


def test_peft_loads_our_adapter_onto_the_hf_base(base, tmp_path):
    """With torch and peft installed: PeftModel on the exported base gives our adapted model's logits."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    trained = with_random_b(loader.add_adapters(base, ALL, None, jax.random.key(5)))
    base_dir = export_hf_checkpoint(CFG, base.params, tmp_path / "base")
    adapter_dir = checkpoint.export_peft_adapter(trained.cfg, trained.params, tmp_path / "peft",
                                                 base_model=str(base_dir))
    model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                                           adapter_dir).eval()
    tokens, mask = _tokens()
    with torch.no_grad():
        ours_mask = np.asarray(mask)
        got = model(input_ids=torch.tensor(np.asarray(tokens)), attention_mask=torch.tensor(ours_mask.astype(np.int64)),
                    position_ids=torch.tensor(np.asarray(padding_to_positions(mask)))).logits.numpy()
    want = logits_of(trained)
    np.testing.assert_allclose(got[ours_mask], want[ours_mask], rtol=1e-4, atol=1e-4)


"""The construction LLM: the real sampler's plumbing (chat template, one batched call, too-long prompts) and a
random-init load whose parameters are built in their shardings on 8 simulated devices."""

import dataclasses
import json

import jax
import numpy as np

from rubric_jax import loader, sampling, sharding
from rubric_jax.assets import TINY_DIR
from rubric_jax.qurl.templates import PromptTemplate
from rubric_jax.judges.backends import HttpBackend
from rubric_jax.qurl.textgen import (
    FINISH_TOO_LONG, EndpointTextGenerator, LanguageModel, ModelTextGenerator, judge_from_model, judge_generator,
    load_language_model,
)
from test_llm_judge import scripted_model, tiny_tokenizer


def test_real_sampler_one_call_chat_template_decoding_and_too_long_prompts():
    tokenizer = tiny_tokenizer()
    weights = scripted_model(tokenizer, "SCORE: 3")  # greedy continuation of any chat prompt
    calls = []

    def counting_generate(*args, **kwargs):
        calls.append((len(args[1]), kwargs["n"]))
        return sampling.generate(*args, **kwargs)

    weights = dataclasses.replace(weights, cfg=weights.cfg.replace(max_position_embeddings=96))
    model = LanguageModel("scripted", weights, tokenizer, sharding.single_device_layout())
    generator = ModelTextGenerator(model, "greedy", counting_generate)
    template = PromptTemplate("t", "1.0.0", "s", "${q}", "0" * 64)
    prompts = [template.render(q=q) for q in ("a", "b " * 200, "c")]
    out = generator(prompts, jax.random.key(0), n=2, max_new_tokens=8)
    assert calls == [(2, 2)]  # the too-long prompt is never sent; the others go in one call, n samples each
    assert [(g.text, g.finish) for g in out] == [("SCORE: 3", "stop")] * 2 + [("", FINISH_TOO_LONG)] * 2 + [
        ("SCORE: 3", "stop")] * 2
    assert "<|im_end|>" in generator.reserved


def test_random_init_is_built_in_its_shardings_and_the_judge_shares_it(tmp_path):
    config = json.loads((TINY_DIR / "config.json").read_text()) | {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    layout = sharding.decode_layout(sharding.make_mesh(sharding.MeshConfig(1, -1, 1)), 2)
    model = load_language_model(checkpoint="", config_json=str(tmp_path / "config.json"),
                                tokenizer_dir=str(TINY_DIR / "tokenizer"), layout=layout, seed=0)
    leaves = jax.tree.leaves(model.weights.params)
    assert [leaf.sharding for leaf in leaves] == jax.tree.leaves(loader.expected_shardings(model.weights.cfg, layout))
    assert layout.mesh.devices.size == 8 and any(not leaf.sharding.is_fully_replicated for leaf in leaves)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in leaves) and np.asarray(leaves[0]).std() > 0
    judge = judge_from_model(model, sampler="greedy", max_new_tokens=64)
    assert judge.backend.weights is model.weights and judge.backend.layout is layout and judge.max_prompt_tokens == 512 - 64
    # What writes an evolving rubric's criteria (train/evolving.py): this judge's own weights and layout, or a served
    # judge's endpoint.
    writer = judge_generator(judge, "temperature(0.7)")
    assert isinstance(writer, ModelTextGenerator) and writer.model.weights is model.weights
    assert writer.model.layout is layout and writer.model.tokenizer is judge.tokenizer and writer.sampler != "greedy"
    served = judge_generator(dataclasses.replace(judge, backend=HttpBackend(client="the endpoint's client")), "greedy")
    assert isinstance(served, EndpointTextGenerator) and served.client == "the endpoint's client"

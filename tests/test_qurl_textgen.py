"""The construction LLM: the real sampler's plumbing (chat template, one batched call, too-long prompts) and a
random-init load whose parameters are built in their shardings on 8 simulated devices."""

import json

import jax
import numpy as np

from rubric_jax import sampling, sharding
from rubric_jax.assets import TINY_DIR
from rubric_jax.qurl.templates import PromptTemplate
from rubric_jax.qurl.textgen import (
    FINISH_TOO_LONG, LanguageModel, ModelTextGenerator, judge_from_model, load_language_model,
)
from test_llm_judge import scripted_model, tiny_tokenizer


def test_real_sampler_one_call_chat_template_decoding_and_too_long_prompts():
    tokenizer = tiny_tokenizer()
    graphdef, state = scripted_model(tokenizer, "SCORE: 3")  # greedy continuation of any chat prompt
    calls = []

    def counting_generate(*args, **kwargs):
        calls.append((len(args[2]), kwargs["n"]))
        return sampling.generate(*args, **kwargs)

    mesh = sharding.make_mesh(sharding.MeshConfig(1, 1, 1), jax.devices()[:1])
    model = LanguageModel("scripted", graphdef, state, tokenizer, mesh, max_positions=96)
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
    mesh = sharding.make_mesh(sharding.MeshConfig(1, -1, 1))
    model = load_language_model(checkpoint="", config_json=str(tmp_path / "config.json"),
                                tokenizer_dir=str(TINY_DIR / "tokenizer"), mesh=mesh, seed=0)
    leaves = jax.tree.leaves(model.state)
    assert [leaf.sharding for leaf in leaves] == jax.tree.leaves(sharding.param_shardings(model.state, mesh))
    assert mesh.devices.size == 8 and any(not leaf.sharding.is_fully_replicated for leaf in leaves)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in leaves) and np.asarray(leaves[0]).std() > 0
    judge = judge_from_model(model, sampler="greedy", max_new_tokens=64)
    assert judge.state is model.state and judge.mesh is mesh and judge.max_prompt_tokens == 512 - 64

"""A judge that shares the policy's base (judge.share_policy_base; issue 34): with LoRA on, the judge is the policy's
frozen base with the adapters off, run in-process through the policy's rollout path (Layouts.rollout_weights) with
nothing loaded. Its verdicts equal those of the same base loaded as a judge, it holds no weights of its own, its hash
names the base, and the combinations that have no base to share are refused at start-up."""

from __future__ import annotations

import dataclasses
import shutil

import jax
import numpy as np
import pytest

from configs.judges import tiny as tiny_judge_config
from rubric_jax import config_boundary, loader
from rubric_jax.judges import llm_judge
from rubric_jax.judges.backends import Batch
from rubric_jax.judges.loading import load_judges, shared_base_judge
from rubric_jax.judges.spec import JudgeSpec, describe, judge_hash
from rubric_jax.models import lora
from rubric_jax.models.checkpoint import load_tokenizer
from rubric_jax.models.config import ModelConfig
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.train import experiment, programs as run_programs, settings as run_settings
from rubric_jax import sharding
from tests.models.test_lora import with_random_b
from tiny_config import absolute_tiny_config

BASE = "rubric_jax/assets/tiny_judge"  # a trained judge: its verdicts are real scores, not a random model's failures
ADAPTERS = lora.LoraConfig(rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def policy():
    """The layouts of a LoRA policy whose base is the tiny judge, and its params (adapters with B != 0, so that
    the adapted policy is not its base)."""
    cfg = ModelConfig.from_hf_dir(BASE)
    mesh = run_settings.MeshSpec(sharding.MeshConfig(data=1, fsdp=-1, tensor=1), 1, "compute")
    lay = run_programs.layouts(mesh, cfg, jax.devices()[:1], ADAPTERS)
    base = loader.load_weights(BASE, lay.training)
    adapted = with_random_b(loader.add_adapters(base, ADAPTERS, lay.training, jax.random.key(3)))
    return lay, adapted.params


def _spec(**changes) -> JudgeSpec:
    return dataclasses.replace(JudgeSpec.from_config(tiny_judge_config.get_config()), **changes)


def _shared(lay: run_programs.Layouts) -> llm_judge.Judge:
    spec = _spec(checkpoints=(), share_policy_base=True)
    return shared_base_judge(spec, load_tokenizer(BASE), lay.rollout_weights, lay.decode,
                             lay.model.max_position_embeddings)


def test_the_shared_judge_gives_the_verdicts_of_its_base_loaded_as_a_judge(policy):
    lay, params = policy
    rubric = load_rubric("rubric_jax/assets/tiny/rubric.yaml")
    dims = [d for d in rubric.dimensions if d.judged]
    responses = ["Thank you for asking! Please see the answer below.", "No. Figure it out yourself.",
                 "Sure, happy to help: the sky is blue because of Rayleigh scattering."]
    questions, key = ["Why is the sky blue?"] * 3, jax.random.key(0)
    (loaded,) = load_judges(_spec(), lay.decode)
    shared = _shared(lay)
    expected = llm_judge.judge_rows([loaded], _spec(), questions, responses, [dims] * 3, key)
    with shared.backend.using(shared.backend.weights_of(params)):
        got = llm_judge.judge_rows([shared], _spec(checkpoints=(), share_policy_base=True), questions, responses,
                                   [dims] * 3, key)
    valid = np.concatenate(expected.scores)
    assert np.isfinite(valid).all()  # real verdicts to compare, not failures
    np.testing.assert_array_equal(np.concatenate(got.scores), valid)
    assert got.causes == expected.causes
    adapted = shared.backend.decode(lora.merge(params, ADAPTERS.scale))  # the policy itself judges otherwise
    base = shared.backend.weights_of(params)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(adapted.params), jax.tree.leaves(base.params)))


def _live_bytes() -> int:
    return sum(x.nbytes for x in jax.live_arrays())


def test_the_shared_judge_holds_no_weights_and_judges_only_when_bound(policy):
    lay, params = policy
    before = _live_bytes()
    shared = _shared(lay)
    assert _live_bytes() == before  # no second copy: the judge reads the policy's base when a scoring binds it
    (loaded,) = load_judges(_spec(), lay.decode)
    model_bytes = sum(x.nbytes for x in jax.tree.leaves(lora.strip(params)))
    assert _live_bytes() - before >= model_bytes  # what a loaded judge costs
    del loaded
    with pytest.raises(RuntimeError, match="judges only inside a scoring that bound a policy"):
        list(shared.backend.calls(shared, Batch([], [[1, 2]], None, 1, jax.random.key(0)), llm_judge.JudgeStats()))


def test_the_shared_judges_hash_names_the_policys_base():
    spec = _spec(checkpoints=(), share_policy_base=True)
    with pytest.raises(ValueError, match="only an experiment whose GRPO stage trains through LoRA"):
        judge_hash(spec)  # a standalone command has no policy base to name
    with pytest.raises(ValueError, match=r"--judge.share_policy_base=True: only an experiment.*To calibrate the judge "
                                         r"a run shares, calibrate its base loaded as a judge \(judge.checkpoint="):
        load_judges(spec, where="--judge")  # what experiments.calibrate says to --judge.share_policy_base=True
    one, other = (dataclasses.replace(spec, policy_base=b) for b in ("a" * 64, "b" * 64))
    assert judge_hash(one) == judge_hash(dataclasses.replace(one)) != judge_hash(other)
    assert judge_hash(one) != judge_hash(_spec())
    assert describe(one)["weights"] == {"policy base": "a" * 64}
    assert judge_hash(_spec(share_policy_base=False)) == judge_hash(_spec())  # off: every other hash unchanged


def test_the_shared_judges_hash_names_the_tokenizer_it_reads(tmp_path):
    """The shared judge reads its prompts and answers with model.tokenizer, which need not be the base's directory:
    two runs of one base with different tokenizers had one judge hash, so verdicts (and a resume, and calibration
    pins) crossed between them. Now the tokenizer's files are in the hash; with share_policy_base off nothing
    changes (the run's settings are returned as they are)."""
    config = absolute_tiny_config()
    with config.unlocked():
        config.lora.rank, config.judge.share_policy_base, config.judge.checkpoint = 8, True, ""
    settings = run_settings.validate(config_boundary.experiment(config))
    lay = run_programs.layouts(settings.mesh, run_settings.model_config(settings.config.model), adapters=settings.lora)
    tokenizer = config.model.tokenizer
    other = shutil.copytree(tokenizer, tmp_path / "tokenizer")

    def hash_with(tokenizer_dir: str) -> str:
        return judge_hash(experiment.shared_base_settings(settings, "", tokenizer_dir, lay).config.judge)

    assert hash_with(tokenizer) == hash_with(str(other))  # the files, not the path
    (other / "chat_template.jinja").write_text((other / "chat_template.jinja").read_text() + " ")
    assert hash_with(tokenizer) != hash_with(str(other))
    off = run_settings.validate(config_boundary.experiment(absolute_tiny_config()))
    assert experiment.shared_base_settings(off, "", str(other), lay) is off


SHARED = {"judge.share_policy_base": True, "judge.checkpoint": ""}


@pytest.mark.parametrize("changes, error", [
    (SHARED, "config.judge.share_policy_base=True: needs a GRPO stage trained through LoRA"),
    ({**SHARED, "lora.rank": 8, "lora.stages": ("sft",)}, "lora.stages=('sft',)"),
    ({"judge.share_policy_base": True, "lora.rank": 8}, "share_policy_base=True: the judge is the policy's base; "
                                                        "set ''"),
    ({**SHARED, "judge.tensor": 2, "lora.rank": 8}, "config.judge.tensor=2: share_policy_base=True reads the "
                                                    "policy's decode copy"),
    ({"audit.judge.share_policy_base": True}, "config.audit.judge.share_policy_base=True: the audit judge"),
])
def test_sharing_the_base_without_one_to_share_is_refused_naming_the_key(changes, error):
    config = absolute_tiny_config()
    with config.unlocked():
        for key, value in changes.items():
            block, field = key.rsplit(".", 1)
            node = config
            for part in block.split("."):
                node = node[part]
            node[field] = value
    with pytest.raises(ValueError) as e:
        config_boundary.experiment(config)
    assert error in str(e.value)

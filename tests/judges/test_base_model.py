"""Judge/policy base-model check (RubricRL 6.2): shape, name and embedding signals, and the start-up warning."""

import json
from pathlib import Path

from random_model import random_model

from rubric_jax.judges import base_model as B
from rubric_jax.models.checkpoint import export_hf_checkpoint
from rubric_jax.models.config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
SMALL = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=8, rope_theta=1e4, rms_norm_eps=1e-6,
                    tie_word_embeddings=True, attention_bias=True, rope_scaling=None, max_position_embeddings=64)


def _export(cfg: ModelConfig, path: Path, seed: int, name_or_path: str | None = None) -> Path:
    export_hf_checkpoint(cfg, random_model(cfg, std=0.1, seed=seed)[1], path)
    if name_or_path is not None:
        hf = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**hf, "_name_or_path": name_or_path}))
    return path


def test_the_same_checkpoint_twice_shares_shape_and_embedding(tmp_path):
    a = B.model_identity(_export(SMALL, tmp_path / "a", seed=0))
    signals = B.shared_base_signals(a, B.model_identity(tmp_path / "a"))
    assert len(signals) == 2 and signals[0].startswith("same architecture and sizes (model_type=qwen2, hidden_size=16")
    assert signals[1] == "identical embedding matrix"


def test_a_fine_tune_keeps_the_shape_and_another_base_shares_nothing(tmp_path):
    policy = B.model_identity(_export(SMALL, tmp_path / "policy", seed=0))
    tuned = B.model_identity(_export(SMALL, tmp_path / "tuned", seed=1))  # same shapes, other weights
    assert [s.split(" (")[0] for s in B.shared_base_signals(policy, tuned)] == ["same architecture and sizes"]
    other = B.model_identity(_export(SMALL.replace(hidden_size=24, head_dim=12), tmp_path / "other", seed=0))
    assert B.shared_base_signals(policy, other) == [] and B.same_base_warning(policy, other) is None
    llama = B.model_identity(_export(SMALL.replace(architecture="llama", attention_bias=False), tmp_path / "l", seed=2))
    assert B.shared_base_signals(policy, llama) == []  # same sizes, another architecture


def test_a_shared_name_or_path_is_enough_and_a_config_file_has_no_embedding(tmp_path):
    a = B.model_identity(_export(SMALL, tmp_path / "a", seed=0, name_or_path="org/base-7b"))
    b = B.model_identity(_export(SMALL.replace(hidden_size=24, head_dim=12), tmp_path / "b", seed=0,
                                 name_or_path="org/base-7b"))
    assert B.shared_base_signals(a, b) == ["same _name_or_path 'org/base-7b'"]
    bare = B.model_identity(tmp_path / "a" / "config.json")  # a random-init policy: config.json only
    assert bare.embedding == "" and B.shared_base_signals(bare, a)[0].startswith("same architecture and sizes")


def test_the_embedding_fingerprint_reads_only_the_first_rows(tmp_path):
    path = _export(SMALL, tmp_path / "a", seed=0)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(path / "model.safetensors")
    emb = tensors[B.EMBEDDING_TENSOR].copy()
    before = B.embedding_fingerprint(path)
    emb[-1] += 1.0  # row 63 of 64: inside the first EMBEDDING_ROWS rows, so the fingerprint changes
    save_file({**tensors, B.EMBEDDING_TENSOR: emb}, path / "model.safetensors")
    assert B.EMBEDDING_ROWS >= 64 and B.embedding_fingerprint(path) != before
    assert B.embedding_fingerprint(tmp_path) == ""  # no weights


def test_the_warning_is_one_line_naming_both_directories(tmp_path):
    policy, judge = _export(SMALL, tmp_path / "policy", seed=0), _export(SMALL, tmp_path / "judge", seed=1)
    [line] = B.same_base_warnings(policy, [str(judge)])
    assert "\n" not in line and str(policy) in line and str(judge) in line and "RubricRL 6.2" in line
    assert B.same_base_warnings(policy, []) == []


def test_the_shipped_tiny_judges_do_not_share_the_tiny_policy_base():
    from configs import tiny

    config = tiny.get_config()
    judges = [str(ROOT / d) for d in ("rubric_jax/assets/tiny_judge", "rubric_jax/assets/tiny_judge_hack",
                                      "rubric_jax/assets/tiny_judge_fixed")]
    assert B.same_base_warnings(ROOT / config.model.config_json, judges) == []


def test_training_start_up_warns_about_a_judge_of_the_policy_base(tmp_path, capsys):
    from configs import tiny
    from rubric_jax.train import loop

    config = tiny.get_config()
    policy_cfg = ModelConfig.from_hf_dir(ROOT / "rubric_jax/assets/tiny")
    judge = tmp_path / "judge"
    export_hf_checkpoint(policy_cfg, random_model(policy_cfg, std=0.1)[1], judge, source_dir=ROOT / config.model.tokenizer)
    with config.unlocked():
        for key in ("train", "eval", "sft", "rubric"):
            config.data[key] = str(ROOT / config.data[key])
        config.model.config_json, config.model.tokenizer = (str(ROOT / config.model.config_json),
                                                            str(ROOT / config.model.tokenizer))
        config.judge.checkpoint = str(judge)
    loop.build(config, tmp_path / "run")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: judge")]
    assert len(lines) == 1 and str(judge) in lines[0] and config.model.config_json in lines[0]


def test_a_sharded_checkpoint_is_read_through_its_index(tmp_path):
    cfg = SMALL
    params = random_model(cfg, std=0.1)[1]
    export_hf_checkpoint(cfg, params, tmp_path / "one")
    export_hf_checkpoint(cfg, params, tmp_path / "sharded", max_shard_bytes=1024)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert B.embedding_fingerprint(tmp_path / "sharded") == B.embedding_fingerprint(tmp_path / "one") != ""

"""train/settings.validate: every value a run reads is checked up front, one line naming config.<key>; the
typed rollout specs give eval its own response budget."""

import os
import re

import pytest

from configs import qwen7b, tiny
from rubric_jax import config_boundary, schema
from rubric_jax.train import blocks, settings


def _with(**values):
    config = tiny.get_config()
    with config.unlocked():
        for key, value in values.items():
            node = config
            *parents, leaf = key.split("__")
            for part in parents:
                node = node[part]
            node[leaf] = value
    return config


def _validate(config):
    """A config checked and derived as a run does: through the boundary into blocks, then the settings."""
    return settings.validate(config_boundary.experiment(config))


def test_shipped_configs_validate_and_eval_has_its_own_response_budget():
    for config in (tiny.get_config(), qwen7b.get_config(), qwen7b.get_config("size=0.5b")):
        _validate(config)
    checked = _validate(_with(rl__max_new_tokens=32, eval__max_new_tokens=8, eval__sampler="topk(5)",
                                      data__length_buckets=2))
    assert checked.train_rollout == settings.RolloutSpec("temperature(1.0)", 8, 32, (64, 128), (16, 32))
    assert checked.eval_rollout == settings.RolloutSpec("topk(5)", 1, 8, (64, 128), (8,))
    assert checked.grpo.temperature == 1.0 and checked.config.rl.updates_per_batch == 1


@pytest.mark.parametrize("key, value, message", [
    ("sft__batch_size", 0, "config.sft.batch_size=0: expected an integer >= 1"),
    ("sft__batch_size", -16, "config.sft.batch_size=-16"),
    ("sft__epochs", 0, "config.sft.epochs=0"),
    ("rl__steps", -1, "config.rl.steps=-1"),
    ("rl__group_size", 1, "config.rl.group_size=1: expected an integer >= 2"),
    ("eval__every_steps", 0, "config.eval.every_steps=0"),
    ("checkpoint__every_steps", 0, "config.checkpoint.every_steps=0"),
    ("eval__max_new_tokens", 0, "config.eval.max_new_tokens=0"),
    ("rl__updates_per_batch", 0, "config.rl.updates_per_batch=0"),
    ("mesh__fsdp", 0, "config.mesh.fsdp=0"),
    ("stages", ("sft", "rl"), "config.stages=('sft', 'rl')"),
    ("stages", (), "config.stages=()"),
    ("model__param_dtype", "bfloat16", "config.model.param_dtype='bfloat16': training keeps float32"),
    ("model__compute_dtype", "fp8", "config.model.compute_dtype='fp8': expected one of"),
    ("model__remat_policy", "selective", "config.model.remat_policy='selective': expected one of ('full', 'dots')"),
    ("mesh__rollout__param_dtype", "half", "config.mesh.rollout.param_dtype='half'"),
    ("judge__mode", "pairwise", "config.judge.mode='pairwise': expected one of ('per_dimension', 'all_criteria')"),
    ("judge__ensemble", "vote", "config.judge.ensemble='vote'"),
    ("judge__prompt", "short", "config.judge.prompt='short': expected one of ('full', 'compact')"),
    ("judge__param_dtype", "fp16", "config.judge.param_dtype='fp16'"),
    ("judge__sampler", "beam(4)", "config.judge.sampler='beam(4)': expected \"greedy\""),
    ("eval__sampler", "temperature(nan)", "config.eval.sampler: sampler 'temperature(nan)': arguments must be finite"),
    ("sft__schedule", "linear", "config.sft.schedule='linear': expected one of ('constant', 'cosine')"),
    ("rl__schedule", "cosine ", "config.rl.schedule='cosine ': expected one of ('constant', 'cosine')"),
    ("rl__lr", float("nan"), "config.rl.lr=nan"),
    ("rl__kl_estimator", "k9", "config.rl.kl_estimator='k9': expected one of ('k1', 'k2', 'k3')"),
    ("rl__loss_aggregation", "sum", "config.rl.loss_aggregation='sum': expected one of"),
    ("rl__beta", -0.1, "config.rl.beta: GRPOConfig.kl_coef=-0.1: must be finite and >= 0"),
    ("rl__missing_scores", "dorp", "config.rl.missing_scores='dorp'"),
    ("rl__sampler", "nucleus(0.9)", "config.rl.sampler='nucleus(0.9)'"),
    ("rl__sampler", "temperature(1e-300)", "config.rl.sampler: sampler 'temperature(1e-300)': temperature must be in "
                                           "[0.0001, 3.403e+38] (finite in float32"),  # 0 in float32: NaN logits
    ("model__attention", "flash", "config.model.attention='flash': expected one of ('auto', 'einsum', 'xla', 'cudnn')"),
    ("model__attention", "cudnn", "config.model.attention='cudnn': cuDNN flash attention runs in bfloat16"),
    ("rl__advantage", "gdpo", "config.rl.advantage='gdpo': expected one of ('sum_then_normalise', 'per_dimension')"),
    ("rl__overlong_buffer", 96, "config.rl.overlong_buffer=96: must be an integer in [0, max_new_tokens=96)"),
    ("rl__overlong_penalty", -1.0, "config.rl.overlong_penalty=-1.0"),
    ("rl__importance_level", "seq", "config.rl.importance_level='seq': expected one of ('token', 'sequence')"),
    ("rl__clip_ratio_c", 0.5, "config.rl.clip_ratio_c: GRPOConfig.clip_ratio_c=0.5: must be None (off) or"),
    ("rl__kl_cap", -10.0, "config.rl.kl_cap: GRPOConfig.kl_cap=-10.0"),
    ("rl__loss", "ppo", "config.rl.loss='ppo': expected one of ('grpo', 'cispo', 'sapo')"),
    ("rl__cispo_clip_high", 4.5, "config.rl.cispo_clip_high: GRPOConfig.cispo_clip_high=4.5: only read by "
                                 "loss='cispo', not 'grpo'"),
    ("rl__entropy_coef", -0.01, "config.rl.entropy_coef: GRPOConfig.entropy_coef=-0.01: must be finite and >= 0"),
    ("rl__behaviour_correction_cap", 2.0, "config.rl.behaviour_correction_cap=2.0: the correction weighs the "
                                          "trainer's recomputed log-probs"),
])
def test_every_bad_value_is_one_line_naming_the_key(key, value, message):
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        _validate(_with(**{key: value}))
    assert "\n" not in str(raised.value)


def test_the_recipe_options_reach_the_typed_specs():
    checked = _validate(_with(rl__advantage="per_dimension", rl__overlong_buffer=16, rl__mask_truncated=True,
                                      rl__importance_level="sequence", rl__clip_ratio_c=3.0, rl__kl_cap=10.0,
                                      rl__behaviour_correction_cap=2.0, rl__recompute_old_logprobs=True))
    assert checked.shaping == settings.rollout.Shaping("per_dimension", 16, 1.0, True, 96)
    g = checked.grpo
    assert (g.importance_level, g.clip_ratio_c, g.kl_cap, g.behaviour_correction_cap) == ("sequence", 3.0, 10.0, 2.0)
    default = _validate(tiny.get_config())
    assert default.shaping == settings.rollout.Shaping(max_new_tokens=96)
    assert (default.grpo.clip_ratio_c, default.grpo.kl_cap, default.grpo.behaviour_correction_cap) == (None,) * 3
    assert (default.grpo.loss, default.grpo.entropy_coef) == ("grpo", 0.0)
    losses = _validate(_with(rl__loss="sapo", rl__sapo_tau_pos=0.5, rl__sapo_tau_neg=2.0, rl__entropy_coef=0.01))
    assert (losses.grpo.loss, losses.grpo.sapo_tau_pos, losses.grpo.sapo_tau_neg, losses.grpo.entropy_coef) == (
        "sapo", 0.5, 2.0, 0.01)
    cispo = _validate(_with(rl__loss="cispo", rl__cispo_clip_low=0.2, rl__cispo_clip_high=0.28)).grpo
    assert (cispo.loss, cispo.cispo_clip_low, cispo.cispo_clip_high) == ("cispo", 0.2, 0.28)


def test_the_compact_judge_prompt_needs_one_dimension_per_prompt():
    with pytest.raises(ValueError, match=re.escape("config.judge.prompt='compact': the compact prompt scores one")):
        _validate(_with(judge__prompt="compact", judge__mode="all_criteria"))
    _validate(_with(judge__prompt="compact"))


def test_no_grpo_objective_without_the_grpo_stage_but_every_key_is_checked():
    """Without the grpo stage there is no objective (its sampler's temperature is not needed); the rl block's keys
    are still checked, as every block's are when it is made (before issue 35 a bad one passed unnoticed)."""
    checked = _validate(_with(stages=("sft",), rl__sampler="greedy"))
    assert checked.grpo is None and checked.rl is None
    with pytest.raises(ValueError, match=re.escape("config.rl.missing_scores='dorp': expected one of")):
        _validate(_with(stages=("sft",), rl__missing_scores="dorp"))


@pytest.mark.parametrize("attention, compute_dtype, backend, want", [
    ("auto", "bfloat16", "gpu", "cudnn"),  # NVIDIA GPUs in bf16: cuDNN flash attention
    ("auto", "float32", "gpu", "einsum"),  # cuDNN attention has no float32 kernel
    ("auto", "bfloat16", "tpu", "einsum"),
    ("auto", "float32", "cpu", "einsum"),
    ("xla", "float32", "cpu", "xla"),
    ("einsum", "bfloat16", "gpu", "einsum"),
    ("cudnn", "bfloat16", "gpu", "cudnn"),
])
def test_model_attention_resolves_per_platform(attention, compute_dtype, backend, want):
    config = _with(model__attention=attention, model__compute_dtype=compute_dtype)
    assert settings.model_overrides(config_boundary.experiment(config).model, backend)["attention"] == want


def test_cudnn_attention_off_an_nvidia_gpu_is_one_line():
    config = _with(model__attention="cudnn", model__compute_dtype="bfloat16")
    checked = _validate(config)  # a GPU dry run may compile it on this CPU machine
    with pytest.raises(ValueError, match=re.escape("config.model.attention='cudnn': cuDNN attention needs an NVIDIA "
                                                   "GPU; this run's backend is cpu")):
        settings.model_config(checked.config.model, "cpu")


_AUDIT_JUDGE = {"audit__judge__checkpoint": tiny.get_config().judge.checkpoint}  # audit.rubric is read with one


@pytest.mark.parametrize("key", [k.replace(".", "__") for k in settings.INPUT_FILES])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "directory"])
def test_an_input_file_that_is_a_fifo_a_device_or_a_directory_is_refused_naming_the_key(key, special, tmp_path):
    path = tmp_path / "special"
    if special == "fifo":
        os.mkfifo(path)  # before the fix the run blocked forever reading it
    elif special == "directory":
        path.mkdir()
    else:
        path.symlink_to(special)  # before the fix /dev/zero grew the process to 19 GB
    kind = {"fifo": "a FIFO", "/dev/zero": "a character device", "directory": "a directory"}[special]
    config_key = key.replace("__", ".")
    with pytest.raises(ValueError, match=re.escape(f"config.{config_key}={str(path)!r}: ") + f".*got {kind}"):
        _validate(_with(**{key: str(path)}, **_AUDIT_JUDGE if key == "audit__rubric" else {}))


COUNT_BOUNDS = {row.key: row.bounds for row in schema.rows(blocks.ExperimentConfig) if row.kind == "int" and row.bounds}


def test_every_integer_key_is_bounded():
    """Every integer key of the experiment's blocks has bounds, but mesh.fsdp (-1: every device left); the nested judge
    and qurl blocks are rows of the experiment's too."""
    integers = {row.key for row in schema.rows(blocks.ExperimentConfig) if row.kind == "int"}
    assert integers - set(COUNT_BOUNDS) == {"mesh.fsdp"}
    assert {"rl.group_size", "judge.samples", "audit.judge.max_new_tokens", "qurl.top_k"} <= set(COUNT_BOUNDS)


@pytest.mark.parametrize("key", sorted(COUNT_BOUNDS))
def test_every_count_has_an_upper_bound_named_with_its_key(key):
    """Issue 38 H6: a count one past its bound is refused before anything runs (1,000,000 judge samples, or any
    other count, was accepted)."""
    largest = int(COUNT_BOUNDS[key][1])
    with pytest.raises(ValueError, match=rf"^config\.{re.escape(key)}={largest + 1}: expected an integer <= {largest}$"):
        _validate(_with(**{key.replace(".", "__"): largest + 1}))


def test_the_judge_blocks_counts_are_bounded_in_an_experiment_too():
    from rubric_jax import schema
    from rubric_jax.judges.spec import JudgeSpec

    counted = [f for f in schema.config_fields(JudgeSpec) if f.metadata["bounds"] and f.type == "int"]
    assert len(counted) == 9
    for field, (_, largest) in ((f.name, f.metadata["bounds"]) for f in counted):
        with pytest.raises(ValueError, match=rf"^config\.judge\.{field}={largest + 1}: expected an integer <= "):
            _validate(_with(**{f"judge__{field}": largest + 1}))


def test_rl_micro_batches_zero_asks_for_the_count_to_be_chosen_and_below_is_refused():
    assert _validate(_with(rl__micro_batches=0)).rl.micro_batches == 0  # train/micro_batching.py chooses
    with pytest.raises(ValueError, match=r"^config\.rl\.micro_batches=-1: expected an integer >= 0"):
        _validate(_with(rl__micro_batches=-1))

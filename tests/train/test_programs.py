"""train/programs.py: a run's jitted programs are built once per process for equal specs, so a run started again in
the same process (a restart after SIGTERM: tests/test_multihost.py's workers) traces and lowers none of them again,
while a spec a program depends on gets programs of its own. That the reused programs give the same results is
test_multihost's equality of a stopped-and-restarted run with an uninterrupted one."""

from __future__ import annotations

from rubric_jax import config_boundary
from rubric_jax.train import programs, settings as run_settings
from tiny_config import absolute_tiny_config


def _build(sft_steps: int = 2, **overrides: object) -> programs.RunPrograms:
    """The tiny default's programs with the SFT schedule cosine and `overrides` ("sft.lr": 1e-3), from a fresh
    config, specs and layouts each call, for an SFT stage of `sft_steps` steps."""
    config = absolute_tiny_config()
    with config.unlocked():
        config.sft.schedule, config.sft.warmup_steps = "cosine", 0  # its length is then in the SFT optimizer
        for key, value in overrides.items():
            stage, field = key.split(".")
            config[stage][field] = value
    settings = run_settings.validate(config_boundary.experiment(config))
    model = run_settings.model_config(settings.config.model)
    return programs.build(settings, programs.layouts(settings.mesh, model), sft_steps)


def test_equal_specs_reuse_the_programs_and_a_changed_spec_builds_its_own():
    built = _build()
    assert _build() is built  # equal specs and layouts, built anew: the same jitted programs and optimizers
    for changed in (_build(**{"sft.lr": 1e-3}), _build(sft_steps=3)):
        assert changed.sft_step is not built.sft_step and changed.sft_state.tx is not built.sft_state.tx
    rl_changed = _build(**{"rl.lr": 1e-4})
    assert rl_changed.grpo is not built.grpo and rl_changed.grpo_state.tx is not built.grpo_state.tx
    assert _build(**{"rl.micro_batches": 2}).grpo.update is not built.grpo.update


def test_auto_micro_batches_on_the_cpu_are_one_without_compiling():
    """rl.micro_batches=0 where the devices report no memory limit (the CPU): 1 micro-batch, the programs of an
    explicit 1 (the same step), built once per process like any other."""
    auto = _build(**{"rl.micro_batches": 0})
    assert auto.micro_batches == 1 and auto.auto.count == 1 and auto.auto.peak is None
    assert auto.auto.compiled is None and "reports no memory limit" in auto.auto.line()
    assert _build(**{"rl.micro_batches": 0}) is auto
    assert _build(**{"rl.micro_batches": 1}).micro_batches == 1 and _build(**{"rl.micro_batches": 1}).auto is None

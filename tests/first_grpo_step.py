"""A run's first GRPO iteration, from a built Experiment's initial parameters with them as the KL reference: the
tests that check what one step samples, judges and logs (judges, recipe options, dynamic sampling, transfers)."""

import jax

from rubric_jax.train import grpo_stage


def first_grpo_step(experiment, questions, key, *draw):
    """(the state after the update, the iteration's output) of grpo_stage.grpo_iteration on `questions`."""
    state = experiment.programs.grpo_state.init(experiment.initial_params())
    reference = jax.device_put(state.params, may_alias=False)  # the update donates the state's buffers (a copy by
    # transfer: jnp.copy compiled a program per parameter shape)
    return grpo_stage.grpo_iteration(experiment, experiment.programs.grpo, state, reference, questions, key, *draw)

"""The cold-start SFT stage (QuRL): masked NLL on formatted responses for `sft.epochs` epochs (through LoRA adapters
when config.lora names "sft")."""

from __future__ import annotations

from typing import Any

import jax

from rubric_jax import data, distributed, sharding
from rubric_jax.train import state as train_state
from rubric_jax.train.experiment import Experiment
from rubric_jax.train.runner import Runner, Stage, StepOutput


ADAPTER_KEY = 2**31 - 3  # fold_in data (into the run key) of the SFT stage's fresh LoRA adapters


class SFTStage(Stage):
    """SFT from `params` over the experiment's SFT examples (checked to fit their buckets by `build`)."""

    name = "sft"
    progress_keys = ("loss", "grad_norm")

    def __init__(self, exp: Experiment, params: dict[str, Any]):
        spec, programs = exp.settings.sft, exp.programs
        self.exp, self.program = exp, programs.sft_step
        self.rows, self.batch_size = exp.sft_examples, spec.batch_size
        self.total = spec.steps(len(exp.sft_examples))
        params = exp.layouts.stage_params(params, spec.lora is not None, jax.random.fold_in(exp.key, ADAPTER_KEY))
        self.state, self.shardings = programs.sft_state.init(params), programs.sft_state.shardings
        self.base_identity = exp.base_identity(self.name)

    def step(self, state: train_state.TrainState, rows: list[data.SFTExample], step: int, runner: Runner
             ) -> tuple[train_state.TrainState, StepOutput]:
        settings = self.exp.settings
        batch = data.sft_batch(self.exp.tokenizer, rows, settings.train_rollout.prompt_buckets,
                               settings.sft_response_buckets, across_processes=True)
        state, step_metrics = self.program(state, distributed.global_batch(
            {"tokens": batch.tokens_BxT, "input_mask": batch.input_mask_BxT, "loss_mask": batch.loss_mask_BxT},
            sharding.batch_sharding(self.exp.mesh)))
        return state, StepOutput(step_metrics)

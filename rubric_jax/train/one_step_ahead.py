"""The runtime of one-step off-policy GRPO (rl.off_policy_steps = 1): train/off_policy.py says what it does."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rubric_jax import data, distributed
from rubric_jax.train import checkpointing, collect, state as train_state
from rubric_jax.train.experiment import Experiment
from rubric_jax.train.runner import Runner, StepOutput, TrainingError

BEHAVIOUR_STAGE = "behaviour"  # checkpoint directory of the params that sample the pending batch
EXTRA_KEY = "off_policy_steps"  # in the GRPO checkpoint's extra (only when 1: an on-policy checkpoint is unchanged)
SAMPLER_STEP = "off_policy/sampler_step"  # metric: stage steps taken by the params that sampled the step's batch

Train = Callable[[train_state.TrainState, collect.Rollout, dict[str, float]],
                 tuple[train_state.TrainState, StepOutput]]


@dataclasses.dataclass(frozen=True)
class Pending:
    """A batch sampled and judged ahead of its step: the params that sampled it (a copy: the update donates the
    state), their step count, and the iterator position before its questions were drawn."""

    rollout: collect.Rollout
    params: Any
    sampler_step: int
    position: data.IteratorState


@dataclasses.dataclass(frozen=True)
class Source:
    """What regenerates a pending batch: its sampling params, their step count and its questions' position."""

    params: Any
    sampler_step: int
    position: data.IteratorState


def check_resume(restored: checkpointing.Restored | None, steps: int) -> None:
    """A GRPO checkpoint resumes only under the rl.off_policy_steps that wrote it (the pending batch's questions
    were drawn, and its source saved, only by an off-policy run); one line."""
    if restored is not None and restored.extra.get(EXTRA_KEY, 0) != steps:
        raise TrainingError(f"config.rl.off_policy_steps={steps}: the GRPO checkpoint was written with "
                            f"rl.off_policy_steps={restored.extra.get(EXTRA_KEY, 0)}; resume it with that value, or "
                            "start a new --workdir")


class OneStepAhead:
    """Runs GRPO steps with the next batch sampled and judged while the current one updates (module docstring)."""

    def __init__(self, exp: Experiment, total: int, updates_per_step: int, key_of: Callable[[int], jax.Array]):
        self.exp, self.total, self.updates_per_step, self.key_of = exp, total, updates_per_step, key_of
        self.pending: Pending | None = None
        self.resumed: Source | None = None  # set by `start` on a resume, used by the first step
        self.position: data.IteratorState | None = None  # the iterator before this step's rows were drawn
        self.state: train_state.TrainState | None = None  # after the latest step (its step names the checkpoint)

    def start(self, restored: checkpointing.Restored | None, start: int, seed: int) -> None:
        """Reads the pending batch's source back from the behaviour checkpoint of the restored step."""
        self.position = data.IteratorState(seed=seed) if restored is None else data.IteratorState.from_dict(
            restored.data_state)
        if restored is None or start >= self.total:
            return
        step = int(restored.state.step)
        with self.exp.checkpointer(BEHAVIOUR_STAGE) as ckpt:
            if step not in ckpt.all_steps():
                raise TrainingError(f"{ckpt.directory}: no step {step} to resume the off-policy batch from; "
                                    "start a new --workdir")
            meta = ckpt.read_meta(step)
            params = ckpt.restore_params(self.exp.layouts.model, self.exp.layouts.training, step=step).params
        self.resumed = Source(params, int(meta["extra"]["sampler_step"]), data.IteratorState.from_dict(
            meta["data_state"]))

    def step(self, state: train_state.TrainState, rows: list[Any], step: int, runner: Runner, train: Train
             ) -> tuple[train_state.TrainState, StepOutput]:
        """Step `step`: dispatches the sampling of batch step + 1 (`rows`) with `state.params`, then the updates on
        the pending batch (sampled one step earlier), then judges batch step + 1 while they run."""
        pending, position = self.pending, self.position
        if pending is None and self.resumed is None:  # the stage's first step: batch 1 sampled now, batch 2 next
            pending = self._sample(state, rows, step, position)()
            position, rows = runner.position, runner.next_rows()
        elif pending is None:  # the first step after a resume: the killed run's pending batch again
            source, self.resumed = self.resumed, None
            questions = distributed.process_block(next(data.BatchIterator(runner.stage.rows, runner.stage.batch_size,
                                                                          source.position)))
            pending = self._start(source.params, jnp.asarray(source.sampler_step * self.updates_per_step), questions,
                                  step, source.position)()
        finish = self._sample(state, rows, step + 1, position) if step < self.total else None
        new_state, out = train(state, pending.rollout, {SAMPLER_STEP: float(pending.sampler_step)})
        self.pending = finish() if finish is not None else None
        self.position, self.state = runner.position, new_state
        return new_state, out

    def _sample(self, state: train_state.TrainState, questions: list[Any], step: int, position: data.IteratorState
                ) -> Callable[[], Pending]:
        """Dispatches batch `step`'s sampling with a copy of `state`'s params (the update donates the state)."""
        return self._start(jax.tree.map(jnp.copy, state.params), jnp.copy(state.step), questions, step, position)

    def _start(self, params: Any, updates: jax.Array, questions: list[Any], step: int, position: data.IteratorState
               ) -> Callable[[], Pending]:
        """Dispatches batch `step`'s sampling with `params` (`updates` optimizer updates in); returns what judges it."""
        spec = self.exp.settings.train_rollout
        finish = collect.start_sampling(self.exp, params, questions, spec, self.key_of(step),
                                        self.exp.settings.rollout_chunks)
        return lambda: Pending(collect.gather_rollout(finish(), spec.n)[0], params,
                               int(updates) // self.updates_per_step, position)

    def checkpoint_extra(self) -> dict[str, Any]:
        """Saves the pending batch's source under the latest step (before the GRPO checkpoint that names it);
        the GRPO checkpoint's extra."""
        if self.pending is not None:
            with self.exp.checkpointer(BEHAVIOUR_STAGE) as ckpt:
                ckpt.save(self.state.replace(params=self.pending.params),
                          data_state=self.pending.position.to_dict(), rubric_hash=self.exp.rubric_hash,
                          extra={"sampler_step": self.pending.sampler_step})
        return {EXTRA_KEY: 1}

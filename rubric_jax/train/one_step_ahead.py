"""The runtime of one-step off-policy GRPO (rl.off_policy_steps = 1): train/off_policy.py says what it does."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from rubric_jax import data, distributed
from rubric_jax.judges.backends import HttpBackend
from rubric_jax.judges.reward import RubricReward
from rubric_jax.models import lora
from rubric_jax.train import checkpointing, collect, state as train_state, workdir as run_workdir
from rubric_jax.train.experiment import Experiment
from rubric_jax.train.runner import Runner, StepOutput, TrainingError

BEHAVIOUR_STAGE = "behaviour"  # checkpoint directory of the params that sample the pending batch
EXTRA_KEY = "off_policy_steps"  # in the GRPO checkpoint's extra (only when 1: an on-policy checkpoint is unchanged)
SAMPLER_STEP = "off_policy/sampler_step"  # metric: stage steps taken by the params that sampled the step's batch

Train = Callable[[train_state.TrainState, collect.Rollout, dict[str, float]],
                 tuple[train_state.TrainState, StepOutput]]


@dataclasses.dataclass(frozen=True)
class Pending:
    """A batch sampled ahead of its step and judged on a judging thread (`rollout`): the params that sampled it
    (a copy: the update donates the state), their optimizer updates, and the iterator position before its
    questions were drawn."""

    rollout: concurrent.futures.Future[collect.Rollout]
    params: Any
    updates: jax.Array | int
    position: data.IteratorState


@dataclasses.dataclass(frozen=True)
class JudgingPlan:
    """When batch t + 1's judging is handed to the judging threads, and how many batches they judge at once
    (docs/training.md, "One-step off-policy", has the timing argument)."""

    early: bool  # right after its sampling is dispatched, before batch t is waited for and updated (else after)
    workers: int  # batches judged at once: 2 lets batch t + 1's judging start while batch t's still runs


def judging_plan(exp: Experiment) -> JudgingPlan:
    """The plan for `exp`'s reward. Two batches are judged at once only when no judge runs in this process's
    devices and no store is shared between batches: an in-process LLM judge (judge.backend=jax, or
    judge.share_policy_base) or reward model queues its programs on the devices the sampler and the update use, so a
    second batch would add its KV cache and no speed; with judge.store_rollouts a batch reads the verdicts its
    predecessor stored, which one at a time keeps as they are without the overlap. rl.dynamic_weights aggregates batch
    t + 1's reward with the weights batch t's update step leaves, so its judging starts after that step."""
    if exp.dynamic_weights is not None:
        return JudgingPlan(False, 1)
    reward = exp.reward
    in_process = not isinstance(reward, RubricReward) or any(not isinstance(j.backend, HttpBackend)
                                                             for j in (*reward.judges, *reward.refiners))
    return JudgingPlan(True, 1 if in_process or exp.settings.config.judge.store_rollouts else 2)


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
    """Runs GRPO steps with the next batch sampled and judged while the current one is judged and updates
    (train/off_policy.py)."""

    def __init__(self, exp: Experiment, total: int, updates_per_step: int, key_of: Callable[[int], jax.Array]):
        self.exp, self.total, self.updates_per_step, self.key_of = exp, total, updates_per_step, key_of
        self.pending: Pending | None = None
        self.resumed: Source | None = None  # set by `start` on a resume, used by the first step
        self.position: data.IteratorState | None = None  # the iterator before this step's rows were drawn
        self.state: train_state.TrainState | None = None  # after the latest step (its step names the checkpoint)
        self.plan = judging_plan(exp)
        self.judging = concurrent.futures.ThreadPoolExecutor(max_workers=self.plan.workers,
                                                             thread_name_prefix="off-policy-judge")

    def start(self, restored: checkpointing.Restored | None, start: int, seed: int) -> None:
        """Reads the pending batch's source back from the behaviour checkpoint of the restored step."""
        self.position = data.IteratorState(seed=seed) if restored is None else data.IteratorState.from_dict(
            restored.data_state)
        if restored is None or start >= self.total:
            return
        step = int(restored.state.step)
        with self._checkpointer() as ckpt:
            if step not in ckpt.all_steps():
                raise TrainingError(f"{ckpt.directory}: no step {step} to resume the off-policy batch from; "
                                    "start a new --workdir")
            meta = ckpt.read_meta(step)
            lay = self.exp.layouts  # with LoRA the behaviour checkpoint holds the adapters alone
            params = ckpt.restore_params(lay.stage_model(self.exp.settings.rl.lora is not None), lay.training,
                                         step=step).params
        self.resumed = Source(params, int(meta["extra"]["sampler_step"]), data.IteratorState.from_dict(
            meta["data_state"]))

    def step(self, state: train_state.TrainState, rows: list[Any], step: int, runner: Runner, train: Train
             ) -> tuple[train_state.TrainState, StepOutput]:
        """Step `step`: dispatches the sampling of batch step + 1 (`rows`) with `state.params` and hands it to the
        judging threads (after the update with a late `plan`), waits for the pending batch's judging (handed over a
        step earlier) and dispatches its updates."""
        pending, position = self.pending, self.position
        if pending is None and self.resumed is None:  # the stage's first step: batch 1 sampled now, batch 2 next
            pending = self._judge(self._sample(state, rows, step, position))
            position, rows = runner.position, runner.next_rows()
        elif pending is None:  # the first step after a resume: the killed run's pending batch again
            source, self.resumed = self.resumed, None
            questions = distributed.process_block(next(data.BatchIterator(runner.stage.rows, runner.stage.batch_size,
                                                                          source.position)))
            pending = self._judge(self._start(source.params, state, source.sampler_step * self.updates_per_step,
                                              questions, step, source.position))
        following = self._sample(state, rows, step + 1, position) if step < self.total else None
        judged = self._judge(following) if following is not None and self.plan.early else None
        rollout = pending.rollout.result()  # the host waited on the judge while the devices sampled and updated
        new_state, out = train(state, rollout, {SAMPLER_STEP: float(int(pending.updates) // self.updates_per_step)})
        self.pending = judged if judged is not None or following is None else self._judge(following)
        self.position, self.state = runner.position, new_state
        return new_state, out

    def settle(self) -> None:
        """Waits for the judging threads (the eval's judge calls must not run beside them; after a step only the
        pending batch is being judged)."""
        if self.pending is not None:
            self.pending.rollout.exception()

    def _judge(self, dispatched: tuple[Callable[[], collect.LocalRollout], Any, jax.Array | int,
                                       data.IteratorState]) -> Pending:
        """A dispatched batch, fetched (once the devices sampled it), judged and gathered on a judging thread."""
        finish, params, updates, position = dispatched
        n = self.exp.settings.train_rollout.n
        return Pending(self.judging.submit(lambda: collect.gather_rollout(finish(), n)[0]), params, updates, position)

    def _sample(self, state: train_state.TrainState, questions: list[Any], step: int, position: data.IteratorState
                ) -> tuple[Callable[[], collect.LocalRollout], Any, jax.Array, data.IteratorState]:
        """Dispatches batch `step`'s sampling with a copy of `state`'s params (the update donates the state; a copy by
        transfer, as tests/first_grpo_step.py's: jnp.copy compiles a program per parameter shape)."""
        return self._start(jax.device_put(state.params, may_alias=False), state,
                           jax.device_put(state.step, may_alias=False), questions, step, position)

    def _start(self, params: Any, state: train_state.TrainState, updates: jax.Array | int, questions: list[Any],
               step: int, position: data.IteratorState
               ) -> tuple[Callable[[], collect.LocalRollout], Any, jax.Array | int, data.IteratorState]:
        """Dispatches batch `step`'s sampling with `params` (`updates` optimizer updates in; with LoRA the adapters,
        sampled on `state`'s frozen base, which no update changes, read before the update donates it): what judges
        it, and the pending batch's source."""
        policy = params if state.frozen is None else lora.join(params, state.frozen)
        finish = collect.start_sampling(self.exp, policy, questions, self.exp.settings.train_rollout,
                                        self.key_of(step), self.exp.settings.config.rl.rollout_chunks)
        return finish, params, updates, position

    def _checkpointer(self) -> checkpointing.Checkpointer:
        """The behaviour checkpoints: one more than checkpoint.keep, so that a kill between a behaviour save and its
        GRPO save leaves the behaviour checkpoint of the GRPO checkpoint the resume restores."""
        return checkpointing.Checkpointer(run_workdir.checkpoint_dir(self.exp.workdir, BEHAVIOUR_STAGE),
                                          max_to_keep=self.exp.settings.config.checkpoint.keep + 1)

    def checkpoint_extra(self) -> dict[str, Any]:
        """Saves the pending batch's source under the latest step (before the GRPO checkpoint that names it);
        the GRPO checkpoint's extra."""
        if self.pending is not None:
            with self._checkpointer() as ckpt:
                ckpt.save(self.state.replace(params=self.pending.params),
                          data_state=self.pending.position.to_dict(), rubric_hash=self.exp.rubric_hash,
                          extra={"sampler_step": int(self.pending.updates) // self.updates_per_step},
                          base_identity=self.exp.base_identity("grpo"))  # LoRA: adapters, named with their base
        return {EXTRA_KEY: 1}

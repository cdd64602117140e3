"""The stage runner: one loop for SFT and GRPO that yields its steps (levanter's `Trainer.training_steps`).

A stage (`Stage`: SFTStage in train/sft.py, GRPOStage in train/grpo_stage.py) says how one step is dispatched
and what runs around it (its eval, the rows' monitors, the NaN streak); the `Runner` does the rest:
restore from the newest checkpoint that restores (fallback past a corrupt one), the resumable data iterator,
the progress bar, save cadence and SIGTERM. A step's metrics are read from the device after the next step is
dispatched (as nanodo does), so the host never waits for the device between steps; rows are flushed
before an eval or a save. Per-step randomness is the stage's `fold_in(key, step)`, so a resumed step samples
exactly what it would have.
"""

from __future__ import annotations

import abc
import dataclasses
import signal
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from rubric_jax import data, distributed, metrics
from rubric_jax.train import checkpointing, state as train_state, workdir as run_workdir


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many non-finite updates in a row); the message says what to do."""


class StopRequest:
    """Inside `with StopRequest() as stop:`, SIGTERM sets `stop.requested`; the runner then saves and returns."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StopRequest:
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        print("SIGTERM: finishing the current step, saving a checkpoint and exiting")

    def agree(self) -> bool:
        """True when any process was asked to stop (a SIGTERM may reach one process only: every process stops at
        the same step, or none does); every process must call it."""
        if distributed.max_over_processes(int(self.requested))[0]:
            self.requested = True
        return self.requested


@dataclasses.dataclass(frozen=True)
class StepOutput:
    """A dispatched step: its metrics still on the device (`device`, read by `Stage.read_row` once the next step is
    dispatched), those already on the host, and the samples for samples.jsonl."""

    device: Any
    host: dict[str, Any] = dataclasses.field(default_factory=dict)
    samples: Sequence[dict[str, Any]] = ()


class Stage(abc.ABC):
    """What differs between SFT and GRPO (a subclass defines `step` and overrides whichever hooks it needs)."""

    name: str  # "sft" or "grpo": checkpoint directory, log rows' "stage", progress bar
    total: int  # stage steps (batches); the stage is done at this step
    rows: Sequence[Any]  # what the resumable iterator walks (SFT examples, questions)
    batch_size: int
    state: train_state.TrainState  # step-0 state, in its shardings
    shardings: train_state.TrainState | None
    updates_per_step: int = 1  # TrainState.step counts optimizer updates: this many per stage step
    progress_keys: tuple[str, ...] = metrics.PROGRESS_KEYS
    keep_best: bool = False  # every eval step saves, and the best-ranked checkpoint is kept past checkpoint.keep
    base_identity: str | None = None  # LoRA: the frozen base's identity, saved with (and checked on) its checkpoints

    @abc.abstractmethod
    def step(self, state: train_state.TrainState, rows: list[Any], step: int, runner: Runner
             ) -> tuple[train_state.TrainState, StepOutput]:
        """Dispatches stage step `step` on this process's `rows`; `runner.next_rows()` gives the next batch's rows
        (a GRPO step with rl.dynamic_sampling draws more; the iterator's position is checkpointed)."""

    def start(self, restored: checkpointing.Restored | None, state: train_state.TrainState, start: int,
              progress: metrics.Progress) -> None:
        """After the restore, before the first step."""

    def read_row(self, out: StepOutput) -> dict[str, Any]:
        """A step's metrics read back from the device (called once the next step is dispatched)."""
        return {**{k: float(v) for k, v in distributed.host_tree(out.device).items()}, **out.host}

    def observe(self, step: int, row: dict[str, Any]) -> dict[str, Any]:
        """A step's metrics once read back, before they are written (monitors, alerts)."""
        return row

    def after_row(self, step: int, row: dict[str, Any], ckpt: checkpointing.Checkpointer) -> None:
        """A step's metrics, once written."""

    def eval_due(self, step: int) -> bool:
        """Whether `evaluate` runs after `step`."""
        return False

    def evaluate(self, step: int, state: train_state.TrainState, progress: metrics.Progress) -> float | None:
        """After the step's row was written, before its checkpoint; returns the held-out reward that ranks the
        step's checkpoint."""
        return None

    def checkpoint_extra(self) -> dict[str, Any]:
        """JSON saved with each checkpoint."""
        return {}


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """A finished step (dispatched, evaluated and saved as due): its number and the state after it."""

    step: int
    state: train_state.TrainState


class Runner:
    """Runs `stage` from its newest restorable checkpoint in `ckpt` to `stage.total`, or to an agreed stop."""

    def __init__(self, stage: Stage, ckpt: checkpointing.Checkpointer, log: run_workdir.RunLog, *, every_steps: int,
                 seed: int, rubric_hash: str, stop: StopRequest):
        self.stage, self.ckpt, self.log, self.stop = stage, ckpt, log, stop
        self.every_steps, self.seed, self.rubric_hash = every_steps, seed, rubric_hash
        self.state = stage.state
        self._batches: data.BatchIterator | None = None  # set by the restore
        self._pending: tuple[int, StepOutput] | None = None
        self._progress: metrics.Progress | None = None

    @property
    def position(self) -> data.IteratorState:
        """The data iterator's position (after the batches drawn so far)."""
        return self._batches.state

    def next_rows(self) -> list[Any]:
        """This process's block of the iterator's next batch."""
        return distributed.process_block(next(self._batches))

    def training_steps(self) -> Iterator[StepInfo]:
        """Restores, then runs the remaining steps, yielding each once it is dispatched, evaluated and saved as due
        (its metrics are written later: after the next step's dispatch, or before an eval, a save or the end)."""
        restored, start = self._restore()
        if self.state.frozen is not None and distributed.is_writer():
            print(parameter_line(self.stage.name, self.state.parameter_counts()), flush=True)
        self._progress = metrics.Progress(self.stage.total, initial=start, desc=self.stage.name,
                                          keys=self.stage.progress_keys)
        try:
            self.stage.start(restored, self.state, start, self._progress)
            for step in range(start + 1, self.stage.total + 1):
                self.state, out = self.stage.step(self.state, self.next_rows(), step, self)
                self._flush()  # the previous step's row, read while this step runs
                self._pending = (step, out)
                self._evaluate_and_save(step)
                yield StepInfo(step, self.state)
                if self.stop.requested:
                    break
            self._flush()
        finally:
            self._progress.close()

    def run(self) -> train_state.TrainState:
        """Every remaining step; returns the final state."""
        for _ in self.training_steps():
            pass
        return self.state

    def _restore(self) -> tuple[checkpointing.Restored | None, int]:
        """The newest checkpoint that restores (None: none) and the stage step to resume after."""
        restored = self.ckpt.restore_newest(checkpointing.abstract_with_shardings(self.state, self.stage.shardings),
                                            expected_base_identity=self.stage.base_identity)
        position = data.IteratorState(seed=self.seed) if restored is None else data.IteratorState.from_dict(
            restored.data_state)
        self._batches = data.BatchIterator(self.stage.rows, self.stage.batch_size, position)
        if restored is None:
            return None, 0
        self.state = restored.state
        print(f"resuming from {self.ckpt.directory} step {int(self.state.step)}")
        start = int(self.state.step) // self.stage.updates_per_step
        self.log.resumed_at(self.stage.name, start)
        return restored, start

    def _evaluate_and_save(self, step: int) -> None:
        """The stage's eval when due and a checkpoint every `every_steps`, at the end, on a stop or (keep_best) at
        every eval; the pending row is written first."""
        stop = self.stop.agree()  # a collective: every step, on every process
        save = step % self.every_steps == 0 or step == self.stage.total or stop
        due = self.stage.eval_due(step)
        if save or due:
            self._flush()
        rank = self.stage.evaluate(step, self.state, self._progress) if due else None
        if save or rank is not None and self.stage.keep_best:
            self.ckpt.save(self.state, data_state=self._batches.state.to_dict(), rubric_hash=self.rubric_hash,
                           extra=self.stage.checkpoint_extra(), best_value=rank, base_identity=self.stage.base_identity)

    def _flush(self) -> None:
        """Writes the pending step's row and samples (reading its metrics from the device)."""
        if self._pending is None:
            return
        (step, out), self._pending = self._pending, None
        name = self.stage.name
        row = self.stage.observe(step, {"stage": name, **self.stage.read_row(out)})
        self.log.write(step, row)
        self.log.write_samples(step, [{"stage": name, **s} for s in out.samples])
        self._progress.update(step, row)
        self.stage.after_row(step, row, self.ckpt)


def parameter_line(stage: str, counts: dict[str, int]) -> str:
    """The start-up line of a stage that trains through LoRA adapters: what it trains and what stays frozen."""
    total = counts["trainable"] + counts["frozen"]
    return (f"{stage}: LoRA trains {counts['trainable']:,} parameters ({100 * counts['trainable'] / total:.2f}% of "
            f"{total:,}); {counts['frozen']:,} frozen")

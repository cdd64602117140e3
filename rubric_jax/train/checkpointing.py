"""Train checkpoints with orbax: the TrainState (params, optimizer state, step) plus a small JSON record
(data iterator position, rubric hash, anything JSON-serialisable the loop adds).

Arrays are restored straight into the shardings of a target tree (`abstract_with_shardings`), so a
7B state is read shard by shard and never gathered on one device. Only the last `max_to_keep`
checkpoints stay on disk, and with `keep_best` the best-ranked one (the best eval); an unfinished save
(killed mid-write) is invisible to `latest_step()`.
A LoRA state (`TrainState.frozen`, the base model) is saved without its base: the checkpoint holds the adapters,
their optimizer state and step, and the base's weights identity in the JSON record (a restore into another base is
refused); the base comes back from the restore target, i.e. from the model directory the run loads anyway.
`restore_params` reads the params alone through rubric_jax.loader (the frozen reference policy);
`restore_newest` falls back past checkpoints that no longer restore; `read_meta` reads the JSON record alone
(a restart checks it before writing anything).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from rubric_jax import loader, metrics, sharding
from rubric_jax.models.checkpoint import CheckpointError
from rubric_jax.models.config import ModelConfig
from rubric_jax.train.state import TrainState

__all__ = ["CheckpointError", "CheckpointWriteError", "Checkpointer", "Restored", "UnreadableCheckpoint",
           "abstract_with_shardings"]
_STATE, _META = "state", "meta"


class UnreadableCheckpoint(CheckpointError):
    """A checkpoint whose files orbax cannot read (damaged), as opposed to one that does not fit the target."""


class CheckpointWriteError(RuntimeError):
    """A save that failed while writing (a full disk): the work failed, not its input. The message names the step,
    the reason and the newest complete checkpoint, from which the same command resumes."""


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `Checkpointer.restore` returns."""

    state: TrainState
    data_state: dict[str, Any]
    """Data iterator position as saved (e.g. {"epoch": 1, "index": 96})."""
    rubric_hash: str
    """Content hash of the rubric set the saved policy was trained with."""
    extra: dict[str, Any]
    """Any further JSON the loop saved (e.g. the stage name)."""
    base_identity: str | None = None
    """A LoRA checkpoint's base weights identity as saved (None for a full state)."""


@dataclasses.dataclass
class _LatestAndBest:
    """orbax preservation policy: the newest `latest` checkpoints, and step `best` when it is set."""

    latest: int
    best: int | None = None

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
        newest = sorted(info.step for info in checkpoints)[-self.latest:]
        return [info.step in newest or info.step == self.best for info in checkpoints]


def abstract_with_shardings(state: TrainState, shardings: TrainState | None) -> TrainState:
    """Restore target: the state's shapes and dtypes, with `shardings` (None: the state's own); a LoRA state's
    frozen base stays the arrays it is (never saved, so never read: `Checkpointer.restore` keeps it)."""
    saved = state.replace(frozen=None)
    if shardings is None:
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), saved)
    else:
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), saved,
                              shardings.replace(frozen=None))
    return target.replace(frozen=state.frozen)


def _first_line(error: Exception, limit: int = 200) -> str:
    """`Type: first line` of an exception, cut to `limit` characters (orbax's messages can be long dumps)."""
    text = (str(error).strip().splitlines() or [""])[0]
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _write_reason(error: BaseException) -> str:
    """Why a write failed, in words: the OS error (tensorstore reports it as `[os_error_code='28']`), else the
    exception's first line."""
    code = error.errno if isinstance(error, OSError) else None
    found = re.search(r"os_error_code='(\d+)'", str(error))
    code = code if code is not None else int(found.group(1)) if found else None
    return os.strerror(code) if code is not None else _first_line(error)


class _DropOrbaxTracebacks(logging.Filter):
    """orbax logs a failed background write with its traceback from every thread the write ran in (four for one
    full disk), then raises it again in the main thread, where `Checkpointer` reports it once: the logged copies
    are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname)


def _drop_closed_loop_reports(previous: Callable[[Any], None]) -> Callable[[Any], None]:
    """sys.unraisablehook without the `RuntimeError: Event loop is closed` that tensorstore's callbacks raise
    after orbax closed the event loop of a failed background write (the failure itself is raised once)."""
    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            previous(unraisable)

    return hook


@functools.cache
def _quiet_background_failures() -> None:
    """Once per process, before the first save: orbax's background reports of a failed write are not printed."""
    logging.getLogger("absl").addFilter(_DropOrbaxTracebacks())
    sys.unraisablehook = _drop_closed_loop_reports(sys.unraisablehook)


def _check_json(name: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {name} must be JSON-serialisable (finite numbers, str keys): {e}") from e


class Checkpointer:
    """Saves and restores train checkpoints under one directory (one sub-directory per step)."""

    def __init__(self, directory: str | Path, *, max_to_keep: int, keep_best: bool = False,
                 async_save: bool = True):
        """Keeps the newest `max_to_keep` checkpoints and, with `keep_best`, also the one saved with the
        highest `best_value`, however old (QuRL reports the best evaluated checkpoint)."""
        if not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep!r}: must be a positive integer")
        self.directory = Path(directory).absolute()
        self.keep_best = keep_best
        self._kept = _LatestAndBest(max_to_keep)
        options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=async_save,
                                               preservation_policy=self._kept)
        handlers = {_STATE: ocp.StandardCheckpointHandler(), _META: ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
        self._ranks: dict[int, float] = {}  # step -> best_value of the kept ranked checkpoints
        self._pending: int | None = None  # the step of a save that may still be writing in the background
        _quiet_background_failures()
        if keep_best:
            for step in self._manager.all_steps():
                with contextlib.suppress(CheckpointError):  # a damaged checkpoint is unranked; restore names it
                    if (value := self.read_meta(step).get("best_value")) is not None:
                        self._ranks[step] = value
            self._kept.best = self.best_step()

    def save(self, state: TrainState, *, data_state: dict[str, Any], rubric_hash: str,
             extra: dict[str, Any] | None = None, best_value: float | None = None,
             base_identity: str | None = None) -> None:
        """Writes a checkpoint at `state.step` (async: arrays are copied off-device before returning);
        `best_value` ranks it for `keep_best` (None or non-finite: not ranked, e.g. no eval at this step). A LoRA
        state needs `base_identity` (e.g. judges.spec.weights_identity of its model directory): its base is not
        saved, only named."""
        step = int(state.step)
        if (state.frozen is None) != (base_identity is None):
            raise ValueError(f"{self.directory}: base_identity is given exactly for a LoRA state (frozen base), "
                             f"got base_identity={base_identity!r} for a {'full' if state.frozen is None else 'LoRA'} "
                             "state")
        ranked = self.keep_best and best_value is not None and math.isfinite(best_value)
        meta = {"step": step, "data_state": data_state, "rubric_hash": rubric_hash, "extra": extra or {},
                **({"best_value": float(best_value)} if ranked else {}),
                **({"base_identity": base_identity} if base_identity is not None else {})}
        _check_json("metadata", meta)
        self.wait_until_finished()  # orbax waits here anyway; the previous save's step is then on disk
        on_disk = set(self._manager.all_steps())
        self._ranks = {s: v for s, v in self._ranks.items() if s in on_disk and s != step}
        if ranked:
            self._ranks[step] = float(best_value)
        self._kept.best = self.best_step()  # read by orbax when it deletes old checkpoints after this save
        self._pending = step
        with self._writing():
            saved = self._manager.save(step, force=True, args=ocp.args.Composite(**{
                _STATE: ocp.args.StandardSave(state.replace(frozen=None)), _META: ocp.args.JsonSave(meta)}))
        if not saved:
            raise CheckpointError(f"{self.directory}: orbax declined to save step {int(state.step)}")

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None when there is none."""
        return self._manager.latest_step()

    def best_step(self) -> int | None:
        """The kept checkpoint saved with the highest `best_value` (ties: the later), or None when none is ranked."""
        best = metrics.best_eval(list(self._ranks.items()))
        return None if best is None else best[0]

    def all_steps(self) -> list[int]:
        """Steps of all complete checkpoints kept on disk, ascending."""
        return sorted(self._manager.all_steps())

    def _resolve(self, step: int | None) -> int:
        """`step`, or the latest complete one; raises when there is none / it is not on disk."""
        self.wait_until_finished()
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise CheckpointError(f"{self.directory}: no complete checkpoint to restore")
            return steps[-1]
        if step not in steps:
            raise CheckpointError(f"{self.directory}: no complete checkpoint for step {step}; available: {steps}")
        return step

    def restore(self, target: TrainState, step: int | None = None, *,
                expected_rubric_hash: str | None = None, expected_base_identity: str | None = None) -> Restored:
        """Restores `step` (default: the latest) into `target`'s shapes, dtypes and shardings.

        `target` is a TrainState of arrays or ShapeDtypeStructs (see `abstract_with_shardings`); its
        static graphdef/optimizer are reused, and so is a LoRA target's frozen base (arrays: never saved). With
        `expected_rubric_hash`, a checkpoint trained under another rubric set is refused; with
        `expected_base_identity`, adapters trained on another base.
        """
        step = self._resolve(step)
        where = self.directory / str(step)
        saved_target = target.replace(frozen=None)
        try:
            loader.check_saved_tree(self._manager.item_metadata(step)[_STATE].tree, saved_target, where)
            restored = self._manager.restore(step, args=ocp.args.Composite(**{
                _STATE: ocp.args.StandardRestore(saved_target), _META: ocp.args.JsonRestore()}))
        except CheckpointError:
            raise  # a saved tree that does not match the target: another model or optimizer, not damage
        except Exception as e:  # orbax raises many types (FileNotFoundError, ValueError, KeyError...)
            raise UnreadableCheckpoint(f"{where}: cannot restore checkpoint step {step} ({_first_line(e)})") from e
        meta = restored[_META]
        if not isinstance(meta, dict) or meta.get("step") != step or int(restored[_STATE].step) != step:
            raise CheckpointError(f"{where}: metadata does not match step {step}: {meta!r}")
        if expected_rubric_hash is not None and meta["rubric_hash"] != expected_rubric_hash:
            raise CheckpointError(
                f"{where}: saved with rubric hash {meta['rubric_hash']!r}, "
                f"expected {expected_rubric_hash!r} (the rubric set changed since this checkpoint)")
        if expected_base_identity is not None and meta.get("base_identity") != expected_base_identity:
            raise CheckpointError(f"{where}: adapters of base {meta.get('base_identity')!r}, expected base "
                                  f"{expected_base_identity!r} (another model directory than this checkpoint's)")
        return Restored(state=restored[_STATE].replace(frozen=target.frozen), data_state=meta["data_state"],
                        rubric_hash=meta["rubric_hash"], extra=meta["extra"], base_identity=meta.get("base_identity"))

    def restore_newest(self, target: TrainState, *, log: Callable[[str], None] = print,
                       expected_base_identity: str | None = None) -> Restored | None:
        """The newest checkpoint that restores into `target` (None when there is none).

        A checkpoint whose files cannot be read (corrupt or truncated: what a full disk or a bad copy leaves)
        is moved aside to `<step>.unrestorable` and named in one line through `log`; the next older one is
        tried, and the run can save that step again later. A checkpoint of another model or optimizer (its
        saved tree does not match `target`), or LoRA adapters of another base than `expected_base_identity`, is an
        error, never skipped.
        """
        self.wait_until_finished()
        for step in reversed(self.all_steps()):
            try:
                return self.restore(target, step, expected_base_identity=expected_base_identity)
            except UnreadableCheckpoint as e:
                aside = self.directory / f"{step}.unrestorable"
                (self.directory / str(step)).rename(aside)
                self._manager.reload()  # orbax caches the step list
                log(f"{e}; moved it to {aside} and trying an older checkpoint")
        return None

    def read_meta(self, step: int) -> dict[str, Any]:
        """The JSON record saved with `step` (step, data_state, rubric_hash, extra), without the arrays."""
        where = self.directory / str(step)
        try:
            meta = self._manager.restore(step, args=ocp.args.Composite(**{_META: ocp.args.JsonRestore()}))[_META]
        except Exception as e:  # orbax raises many types; its messages can be long dumps
            raise CheckpointError(f"{where}: cannot read the checkpoint's metadata ({_first_line(e)})") from e
        if not isinstance(meta, dict) or not {"rubric_hash", "extra"} <= set(meta):
            raise CheckpointError(f"{where}: the checkpoint's metadata is not a train checkpoint's")
        return meta

    def restore_params(self, cfg: ModelConfig, layout: sharding.Layout | None = None,
                       step: int | None = None) -> loader.Weights:
        """Only the params of `step` (default: the latest) as Weights of `cfg`, read straight into
        `layout` by the loader: a frozen reference policy without its optimizer state in memory."""
        step = self._resolve(step)
        return loader.load_weights(self.directory / str(step) / _STATE, layout, model_config=cfg)

    def wait_until_finished(self) -> None:
        """Blocks until pending async saves are on disk; CheckpointWriteError when one failed to write."""
        with self._writing():
            self._manager.wait_until_finished()
        self._pending = None

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Any failure of orbax's save or its background write (raised here once, in the main thread) as one
        CheckpointWriteError naming the step, why, and the checkpoint a rerun resumes from."""
        try:
            yield
        except Exception as e:  # noqa: BLE001  (orbax raises ValueError, OSError, RuntimeError for a failed write)
            step, self._pending, newest = self._pending, None, None
            with contextlib.suppress(Exception):  # orbax after a failure: the steps on disk, if it can list them
                self._manager.reload()
                newest = self._manager.latest_step()
            resume = (f"the same command resumes from step {newest}, the newest complete checkpoint" if newest
                      is not None else "no checkpoint is complete: the same command starts the stage again")
            what = "a checkpoint" if step is None else f"the checkpoint of step {step}"
            raise CheckpointWriteError(f"{self.directory}: writing {what} failed ({_write_reason(e)}); once that is "
                                       f"fixed, {resume}") from None

    def close(self) -> None:
        """Finishes pending saves (CheckpointWriteError when one failed to write) and releases orbax resources."""
        with self._writing():
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:  # an error (a failed write) is on its way out: releasing what orbax holds must not replace it
            with contextlib.suppress(Exception):
                self.close()

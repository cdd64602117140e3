"""Train checkpoints with orbax: the TrainState (params, optimizer state, step, PRNG key) plus a small
JSON record (data iterator position, rubric hash, anything JSON-serialisable the loop adds).

Arrays are restored straight into the shardings of a target tree (`abstract_with_shardings`), so a
7B state is read shard by shard and never gathered on one device. Only the last `max_to_keep`
checkpoints stay on disk; an unfinished save (killed mid-write) is invisible to `latest_step()`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from rubric_jax.train.state import Params, TrainState

_STATE, _META = "state", "meta"


class CheckpointError(RuntimeError):
    """A checkpoint directory that is missing, empty, broken or does not fit the target state."""


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


def abstract_with_shardings(state: TrainState, shardings: TrainState | None) -> TrainState:
    """Restore target: the state's shapes and dtypes, with `shardings` (None: the state's own)."""
    if shardings is None:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)


def _check_json(name: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {name} must be JSON-serialisable (finite numbers, str keys): {e}") from e


def _path_str(path: tuple[Any, ...]) -> str:
    """A key path as 'params/w' whether its entries are dict keys, attributes or sequence indices."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _check_fits(saved_tree: Any, target: Any, where: Path) -> None:
    """Compares saved array shapes/dtypes with the target's, naming the first difference."""
    if saved_tree is None:
        raise CheckpointError(f"{where}: the checkpoint holds no state arrays")
    def is_array_meta(x: Any) -> bool:
        return hasattr(x, "shape") and hasattr(x, "dtype")

    saved = {_path_str(p): (tuple(x.shape), str(x.dtype))
             for p, x in jax.tree_util.tree_flatten_with_path(saved_tree, is_leaf=is_array_meta)[0]}
    wanted = {_path_str(p): (tuple(x.shape), str(x.dtype))
              for p, x in jax.tree_util.tree_flatten_with_path(target)[0]}
    if saved.keys() != wanted.keys():
        missing, unexpected = sorted(wanted.keys() - saved.keys()), sorted(saved.keys() - wanted.keys())
        raise CheckpointError(f"{where}: the saved state has another structure than the target "
                              f"(missing from checkpoint: {missing[:5]}, not in target: {unexpected[:5]})")
    for name, want in wanted.items():
        if saved[name] != want:
            raise CheckpointError(f"{where}: {name} is saved as shape/dtype {saved[name]}, target wants {want}")


class Checkpointer:
    """Saves and restores train checkpoints under one directory (one sub-directory per step)."""

    def __init__(self, directory: str | Path, *, max_to_keep: int, async_save: bool = True):
        if not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep!r}: must be a positive integer")
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               enable_async_checkpointing=async_save)
        handlers = {_STATE: ocp.StandardCheckpointHandler(), _META: ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    def save(self, state: TrainState, *, data_state: dict[str, Any], rubric_hash: str,
             extra: dict[str, Any] | None = None) -> None:
        """Writes a checkpoint at `state.step` (async: arrays are copied off-device before returning)."""
        meta = {"step": int(state.step), "data_state": data_state, "rubric_hash": rubric_hash, "extra": extra or {}}
        _check_json("metadata", meta)
        saved = self._manager.save(int(state.step), force=True, args=ocp.args.Composite(**{
            _STATE: ocp.args.StandardSave(state), _META: ocp.args.JsonSave(meta)}))
        if not saved:
            raise CheckpointError(f"{self.directory}: orbax declined to save step {int(state.step)}")

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None when there is none."""
        return self._manager.latest_step()

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
                expected_rubric_hash: str | None = None) -> Restored:
        """Restores `step` (default: the latest) into `target`'s shapes, dtypes and shardings.

        `target` is a TrainState of arrays or ShapeDtypeStructs (see `abstract_with_shardings`); its
        static graphdef/optimizer are reused. With `expected_rubric_hash`, a checkpoint trained under
        another rubric set is refused.
        """
        step = self._resolve(step)
        where = self.directory / str(step)
        try:
            _check_fits(self._manager.item_metadata(step)[_STATE].tree, target, where)
            restored = self._manager.restore(step, args=ocp.args.Composite(**{
                _STATE: ocp.args.StandardRestore(target), _META: ocp.args.JsonRestore()}))
        except CheckpointError:
            raise
        except Exception as e:  # orbax raises many types (FileNotFoundError, ValueError, KeyError...)
            raise CheckpointError(f"{where}: cannot restore checkpoint step {step} ({type(e).__name__}: {e})") from e
        meta = restored[_META]
        if not isinstance(meta, dict) or meta.get("step") != step or int(restored[_STATE].step) != step:
            raise CheckpointError(f"{where}: metadata does not match step {step}: {meta!r}")
        if expected_rubric_hash is not None and meta["rubric_hash"] != expected_rubric_hash:
            raise CheckpointError(
                f"{where}: saved with rubric hash {meta['rubric_hash']!r}, "
                f"expected {expected_rubric_hash!r} (the rubric set changed since this checkpoint)")
        return Restored(state=restored[_STATE], data_state=meta["data_state"], rubric_hash=meta["rubric_hash"],
                        extra=meta["extra"])

    def restore_params(self, target_params: Params, step: int | None = None) -> Params:
        """Only the params of `step` (default: the latest), into `target_params`' shapes and shardings
        (arrays or ShapeDtypeStructs): a frozen reference policy without its optimizer state in memory."""
        step = self._resolve(step)
        where = self.directory / str(step)
        target = {"params": target_params}
        try:
            saved = self._manager.item_metadata(step)[_STATE].tree
            _check_fits({"params": saved["params"]}, target, where)
            with ocp.PyTreeCheckpointer() as reader:
                restored = reader.restore(where / _STATE, args=ocp.args.PyTreeRestore(
                    item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                    partial_restore=True))
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"{where}: cannot restore the params of step {step} ({type(e).__name__}: {e})") from e
        return restored["params"]

    def wait_until_finished(self) -> None:
        """Blocks until pending async saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finishes pending saves and releases orbax resources."""
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

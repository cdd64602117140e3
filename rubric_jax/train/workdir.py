"""A run's workdir: checked before anything is written, its run files written atomically, its logs cut back
to the checkpoint a restart resumes from.

Order of a (re)start (train/loop.run): `check_usable` -> build everything (reads only) -> `check_resume`
(the saved checkpoints' rubric set, judge and updates-per-batch against this config, from their JSON records) ->
`write_run_files` (config.json, rubric.yaml, rubric.json; atomic) -> stages. So a refused restart leaves
every file as it was. `RunLog` opens metrics.jsonl / samples.jsonl at the first row a stage writes, after
dropping the rows a killed run wrote past the checkpoint the stages resumed from (and a torn last line:
what a kill mid-write leaves), and the TensorBoard scalars past it, so a resumed run writes exactly what
an uninterrupted one writes. In a multi-process job only process 0 writes the run files and logs (the
others' `RunLog.write` does nothing); every process reads them once process 0 has cut them back.

One process at a time: `exclusive(workdir)` holds an flock on <workdir>/.lock for the run's life (process 0
of a job), so a second run or resume of the same workdir exits with one line naming the holder's pid instead
of writing beside it; the OS releases the lock when the holder dies, `kill -9` included.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rubric_jax import distributed, metrics
from rubric_jax.files import write_atomic
from rubric_jax.models.checkpoint import CheckpointError
from rubric_jax.train import checkpointing

STAGE_ORDER = {"sft": 0, "grpo": 1, "eval": 1}  # log rows sort by (stage order, step); eval rows are GRPO's
CONFIG_FILE, RUBRIC_YAML, RUBRIC_JSON = "config.json", "rubric.yaml", "rubric.json"
LOCK_FILE = ".lock"  # flock'ed by the process writing the workdir; holds its pid
LOG_FILES = (metrics.METRICS_FILE, metrics.SAMPLES_FILE, metrics.ALERTS_FILE)  # step-keyed jsonl logs cut back on resume


def check_usable(workdir: str | Path) -> Path:
    """`workdir` as a Path once it is a directory a file can be written in (created if missing; a probe
    file is written and removed); else one line naming it."""
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"--workdir={workdir}: is a file, not a directory")
    probe = workdir / f".write-probe-{os.getpid()}"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--workdir={workdir}: cannot write there ({e.strerror}: {e.filename})") from None
    return workdir


class WorkdirBusy(ValueError):
    """Another live process holds the workdir's lock."""


@contextlib.contextmanager
def exclusive(workdir: Path, flag: str = "--workdir") -> Iterator[None]:
    """Holds an exclusive lock on `workdir` (flock on <workdir>/.lock, which records this pid) for the block;
    raises WorkdirBusy naming the holder's pid when another process holds it. The descriptor is not
    inherited by child processes, and the OS drops the lock when this process dies in any way."""
    fd = os.open(workdir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise WorkdirBusy(f"{flag}={workdir}: in use by another process (pid {holder}); wait for it to end or "
                              "stop it, or use another directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def checkpoint_dir(workdir: Path, stage: str) -> Path:
    """Where a stage's checkpoints live ("sft", "grpo", "reference")."""
    return workdir / "checkpoints" / stage


def _newest_meta(directory: Path, keep: int) -> dict[str, Any] | None:
    """The JSON record of the newest checkpoint in `directory` whose record reads, or None."""
    if not directory.is_dir():
        return None
    with checkpointing.Checkpointer(directory, max_to_keep=keep) as ckpt:
        for step in reversed(ckpt.all_steps()):
            try:
                return ckpt.read_meta(step)
            except CheckpointError:
                continue  # the stage falls back past it when it restores (Checkpointer.restore_newest)
    return None


# What rewarded GRPO checkpoints: their `extra` key, its name in a refusal, and what "the same" covers.
REWARD_SOURCES = (("judge_hash", "judge", "checkpoints, served model and verdict settings: docs/judges.md"),
                  ("reward_model_hash", "reward model", "reward.model_checkpoint and the reward.model_* settings"))


def check_resume(workdir: Path, *, rubric_hash: str, updates_per_batch: int, keep: int, judge_hash: str = "",
                 reward_model_hash: str = "") -> None:
    """Refuses a restart whose checkpoints were trained under another rubric set, whose GRPO checkpoints were
    rewarded by another LLM judge (`judge_hash`, "" for none: spec.judge_hash, the served model's identity included)
    or another reward model (`reward_model_hash`, "" for none: RewardModelReward.describe's hash; checkpoints from
    before either was recorded are not checked for it), or with another `rl.updates_per_batch` (the GRPO step
    of a checkpoint is its update count / updates per batch: a change would rewind the step counter); one line,
    before anything is written."""
    for stage in ("sft", "grpo", "reference"):
        meta = _newest_meta(checkpoint_dir(workdir, stage), keep)
        if meta is None:
            continue
        if meta["rubric_hash"] != rubric_hash:
            raise CheckpointError(
                f"{checkpoint_dir(workdir, stage)}: trained with rubric set {meta['rubric_hash'][:16]}..., this "
                f"config's is {rubric_hash[:16]}... ({workdir / RUBRIC_JSON} names the old one); use the same "
                "rubric, score correction and questions, or a new --workdir")
        current = {"judge_hash": judge_hash, "reward_model_hash": reward_model_hash}
        for key, what, same in REWARD_SOURCES:
            if stage == "grpo" and meta["extra"].get(key, current[key]) != current[key]:
                raise CheckpointError(
                    f"{checkpoint_dir(workdir, stage)}: trained with {what} {_short(meta['extra'][key])}, this "
                    f"config's is {_short(current[key])} ({workdir / RUBRIC_JSON} names the old one); use the same "
                    f"{what} ({same}), or a new --workdir")
        saved = meta["extra"].get("updates_per_batch")
        if stage == "grpo" and saved is not None and saved != updates_per_batch:
            raise ValueError(f"config.rl.updates_per_batch={updates_per_batch}: the GRPO checkpoints in {workdir} "
                             f"were made with {saved}; resume with --config.rl.updates_per_batch={saved} or use a "
                             "new --workdir")


def _short(source_hash: str) -> str:
    """A judge or reward-model hash as a refusal names it ("none" for a run without one)."""
    return f"{source_hash[:16]}..." if source_hash else "none"


def write_run_files(workdir: Path, config_json: str, rubric_yaml: str, rubric_info: Mapping[str, Any]) -> None:
    """config.json (the resolved config; a changed one keeps the old aside as config.previous.json),
    rubric.yaml and rubric.json, each written atomically."""
    path = workdir / CONFIG_FILE
    if path.exists() and path.read_text(encoding="utf-8") != config_json:
        write_atomic(workdir / "config.previous.json", path.read_bytes())
        print(f"{path}: the config changed since the last start; the old one is now config.previous.json")
    write_atomic(path, config_json)
    write_atomic(workdir / RUBRIC_YAML, rubric_yaml)
    write_atomic(workdir / RUBRIC_JSON, json.dumps(dict(rubric_info), indent=2))


def _row_position(row: Mapping[str, Any]) -> tuple[int, int]:
    """(stage order, step) of a log row; run_info rows sort first."""
    if "stage" not in row:
        return (-1, -1)
    return (STAGE_ORDER[row["stage"]], row["step"])


def cut_log(path: Path, position: tuple[int, int]) -> None:
    """Drops the rows of a metrics/samples file written after `position` (stage order, step), and a torn
    last line (no newline, not JSON: a killed write); any other unreadable line is an error naming it."""
    if not path.exists():
        return
    lines = path.read_bytes().split(b"\n")
    kept = []
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
            if not isinstance(row, dict):
                raise ValueError(f"expected a JSON object, got {type(row).__name__}")
            position_of_row = _row_position(row)
        except (ValueError, KeyError, TypeError) as e:
            if lineno == len(lines):  # the file does not end in a newline: the last write was cut off
                print(f"{path}:{lineno}: dropped a torn last line (a run killed mid-write leaves one)")
                continue
            raise ValueError(f"{path}:{lineno}: not a log row ({str(e)[:200]}); fix or delete that line "
                             "to resume this workdir") from None
        if position_of_row <= position:
            kept.append(raw + b"\n")
    write_atomic(path, b"".join(kept))


class RunLog:
    """The run's metrics/samples writer, opened at the first row written, after cutting both files back
    to the position the stages resumed from (`resumed_at`; a fresh run keeps no stage rows). Every process
    opens it at the same point of the run; only process 0 holds a writer (`writer` is None elsewhere)."""

    def __init__(self, workdir: Path, run_info: Mapping[str, Any]):
        self.workdir = workdir
        self.run_info = dict(run_info)
        self.position = (-1, -1)
        self._opened = False
        self._writer: metrics.MetricsWriter | None = None

    def resumed_at(self, stage: str, step: int) -> None:
        """A stage restored its checkpoint at `step` (rows up to it are kept)."""
        if self._opened:
            raise RuntimeError("resumed_at after the first row was written")
        self.position = max(self.position, (STAGE_ORDER[stage], step))

    def open(self) -> metrics.MetricsWriter | None:
        """`writer`, as a call (what the monitors call before they write alerts.jsonl)."""
        return self.writer

    @property
    def writer(self) -> metrics.MetricsWriter | None:
        """The open writer on process 0 (None on the others), the logs cut back at the first access."""
        if not self._opened:
            if distributed.is_writer():
                for name in LOG_FILES:
                    cut_log(self.workdir / name, self.position)
                metrics.cut_event_files(self.workdir / metrics.TB_DIR, self._kept_event)
                self._writer = metrics.MetricsWriter(self.workdir, run_info=self.run_info)
            distributed.wait_for_everyone(f"logs of {self.workdir}")  # the others read them after the cut
            self._opened = True
        return self._writer

    def _kept_event(self, step: int, tag: str) -> bool:
        """A TensorBoard scalar (tagged `<stage>/...`) written at or before the resume position."""
        stage = tag.split("/", 1)[0]
        return stage not in STAGE_ORDER or (STAGE_ORDER[stage], step) <= self.position

    def write(self, step: int, row: Mapping[str, Any]) -> None:
        if self.writer is not None:
            self.writer.write(step, row)

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        if self.writer is not None:
            self.writer.write_samples(step, samples)

    def rows(self) -> list[dict[str, Any]]:
        """The step rows of metrics.jsonl so far (after the cut; on other processes than 0, those written
        before this process opened the log)."""
        self.open()  # opens, i.e. cuts, the logs first
        path = self.workdir / metrics.METRICS_FILE
        return metrics.read_jsonl_metrics(path) if path.exists() else []

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

"""What a run writes about itself: metrics.jsonl, samples.jsonl, TensorBoard scalars, a progress bar.

Files in the workdir:
  metrics.jsonl   one JSON object per line, flushed per write: {"step", "time", <metric>: value, ...};
                  a line {"run_info": {...}, "time"} is written each time a writer opens (rubric hash,
                  config) so every metrics file names the rubric it was scored with (DESIGN, "Rubrics are
                  data"). Non-finite floats are written as the strings "nan", "inf", "-inf" (strict JSON;
                  a NaN loss stays visible instead of vanishing).
  samples.jsonl   {"step", "time", <field>: value, ...} per sampled response (question, response, scores).
  tb/             TensorBoard event file of every numeric scalar, tagged `<stage>/<name>` when the row names
                  its stage (`sft/loss`, `grpo/loss`, `eval/reward_mean`): SFT and GRPO both count steps
                  from 1, and one tag per stage keeps TensorBoard from joining them into one zig-zag line.
                  tensorboardX writes the events (protobuf messages, TFRecord framing with masked CRC-32C);
                  its wheel is 87 KB and needs only numpy, packaging and protobuf, which the runtime already
                  has (orbax-checkpoint, tensorflow-datasets), and imports in about 17 ms after jax.
  done.json       written when a run reaches the end of its last stage: the sha256 of the resolved config
                  it finished with (`config_fingerprint`), so a sweep skips finished variants.

Rows carry "stage" (sft, grpo, eval). Metric names are slash-separated; plots.py groups them by these
conventions (the trainer's names):
  reward/mean, reward/<dimension id>          training reward and per-dimension mean scores
  eval/reward_mean, eval/reward/<dimension>   held-out reward
  kl, loss, entropy, grad_norm, lr, clip_frac  optimisation (any name with a "kl" segment is plotted as KL)
  response_len/mean, eval/response_len/mean    mean response tokens
  zero_std_frac                                groups whose rewards have zero variance (GRPO gets no signal)
  judge_invalid, judge_failed_scores, ...      LLM-judge counters (only when a judge is configured)
  weight/<dimension id>                        dynamic dimension weights (only with rl.dynamic_weights)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import tqdm
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import event_pb2, summary_pb2

from rubric_jax.files import write_atomic
from rubric_jax.jsonl import read_jsonl

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
ALERTS_FILE = "alerts.jsonl"  # one line per monitor past its threshold (rubric_jax/train/monitors.py)
TB_DIR = "tb"
DONE_FILE = "done.json"
PROGRESS_KEYS = ("reward/mean", "kl", "loss", "response_len/mean", "zero_std_frac")
_RESERVED = ("step", "time")


# ------------------------------------------------------------------------------------- JSON values
def jsonable(value: Any) -> Any:
    """Plain JSON value: numpy/jax scalars and arrays to Python, non-finite floats to "nan"/"inf"/"-inf"."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "__array__") and not isinstance(value, (int, float)):
        arr = np.asarray(value)
        return jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    raise TypeError(f"cannot write a {type(value).__name__} to JSON: {value!r}")


def scalar_value(value: Any) -> float | None:
    """The float of a numeric scalar (Python, numpy or jax; "nan"/"inf" strings too), else None."""
    if isinstance(value, str):
        return float(value) if value in ("nan", "inf", "-inf") else None
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an integer beyond any float (JSON allows 10**400)
            return math.inf if value > 0 else -math.inf
    if hasattr(value, "__array__"):
        arr = np.asarray(value)
        if arr.ndim == 0 and np.issubdtype(arr.dtype, np.number):
            return float(arr)
    return None


# ------------------------------------------------------------------------------ TensorBoard events
_LENGTH = struct.Struct("<Q")  # a TFRecord: uint64 length, uint32 masked CRC of it, data, uint32 masked CRC of the data
_FRAMING = _LENGTH.size + 4 + 4


def event_records(path: str | Path) -> list[tuple[bytes, int, str | None]]:
    """(framed record, step, scalar tag) of each whole record of an event file; the version record has no tag.
    A torn last record (a killed write) is left out."""
    data, records, i = Path(path).read_bytes(), [], 0
    while i + _LENGTH.size + 4 <= len(data):
        (length,) = _LENGTH.unpack_from(data, i)
        end = i + _FRAMING + length
        if end > len(data):
            break
        event = event_pb2.Event.FromString(data[i + _LENGTH.size + 4:end - 4])
        tag = event.summary.value[0].tag if event.HasField("summary") and event.summary.value else None
        records.append((data[i:end], event.step, tag))
        i = end
    return records


def cut_event_files(logdir: str | Path, keep: Callable[[int, str], bool]) -> None:
    """Rewrites (atomically) each event file in `logdir` without the scalar events `keep(step, tag)` rejects
    and without a torn last record: a resumed run's TensorBoard then shows each step once, as its
    metrics.jsonl does."""
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        kept = b"".join(record for record, step, tag in event_records(path) if tag is None or keep(step, tag))
        if kept != path.read_bytes():
            write_atomic(path, kept)


_WRITER_NUMBERS = itertools.count()  # EventsWriter truncates its file: each writer of a process names its own


class EventFileWriter:
    """Writes scalar summaries to a new TensorBoard event file (events.out.tfevents.<time>.<host>.<pid>.<n>), through
    tensorboardX's synchronous EventsWriter: its SummaryWriter queues events for a thread that flushes every
    `flush_secs`, so a killed run would lose rows metrics.jsonl already has."""

    def __init__(self, logdir: str | Path):
        logdir = Path(logdir)
        logdir.mkdir(parents=True, exist_ok=True)
        # the number zero-padded: TensorBoard reads a directory's files in name order, where ".10" came before ".9"
        self._writer = EventsWriter(str(logdir / "events"), f".{os.getpid()}.{next(_WRITER_NUMBERS):06d}")
        self._writer.flush()

    def add_scalars(self, step: int, scalars: Mapping[str, float], wall_time: float) -> None:
        """One event per scalar at `step`, flushed."""
        for tag, value in scalars.items():
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            self._writer.write_event(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def tensorboard_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric scalars of one row under their TensorBoard tags: `<stage>/<name>` when the row has a
    "stage" (a name already starting with it, "eval/reward_mean", keeps it once); plain names otherwise."""
    stage = metrics.get("stage")
    prefix = f"{stage}/" if isinstance(stage, str) and stage else ""
    scalars = {}
    for name, value in metrics.items():
        number = scalar_value(value)
        if number is not None:
            scalars[name if name.startswith(prefix) else prefix + name] = number
    return scalars


# ------------------------------------------------------------------------------------------ writer
class MetricsWriter:
    """metrics.jsonl + samples.jsonl + TensorBoard scalars of one run; appends, so a resumed run continues."""

    def __init__(self, workdir: str | Path, *, run_info: Mapping[str, Any] | None = None, tensorboard: bool = True):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._metrics = (self.workdir / METRICS_FILE).open("a", encoding="utf-8")
        self._samples = (self.workdir / SAMPLES_FILE).open("a", encoding="utf-8")
        self._events = EventFileWriter(self.workdir / TB_DIR) if tensorboard else None
        if run_info is not None:
            self._line(self._metrics, {"run_info": jsonable(run_info), "time": time.time()})

    @staticmethod
    def _line(f: IO[str], obj: Mapping[str, Any]) -> None:
        f.write(json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n")
        f.flush()

    @staticmethod
    def _row(step: int, values: Mapping[str, Any], now: float) -> dict[str, Any]:
        clash = sorted(set(values) & set(_RESERVED))
        if clash:
            raise ValueError(f"metric names {clash} are reserved for the row itself")
        return {"step": int(step), "time": now, **jsonable(values)}

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One metrics.jsonl line for `step`; numeric scalars also go to TensorBoard."""
        now = time.time()
        self._line(self._metrics, self._row(step, metrics, now))
        if self._events is not None:
            self._events.add_scalars(int(step), tensorboard_scalars(metrics), now)

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """One samples.jsonl line per sample (e.g. question, response, per-dimension scores, reward)."""
        now = time.time()
        for sample in samples:
            self._line(self._samples, self._row(step, sample, now))

    def close(self) -> None:
        self._metrics.close()
        self._samples.close()
        if self._events is not None:
            self._events.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_jsonl_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The step rows of a metrics.jsonl (run_info lines skipped), "nan"/"inf" strings back to floats."""
    return [{k: (float(v) if isinstance(v, str) and v in ("nan", "inf", "-inf") else v) for k, v in row.items()}
            for _, row in read_jsonl(path) if "step" in row]


def best_eval(evals: Sequence[tuple[int, float | None]]) -> tuple[int, float] | None:
    """(step, reward) of the best GRPO eval among (step, eval reward) pairs: the highest finite reward at a
    step >= 1 (step 0 is the SFT baseline, before any GRPO checkpoint), ties to the later step. The one rule
    for checkpoint.keep_best, `--config.which=best` (export, evaluate) and the sweep summary; None when no such eval exists."""
    ranked = [(value, step) for step, value in evals if step >= 1 and value is not None and math.isfinite(value)]
    if not ranked:
        return None
    value, step = max(ranked)
    return step, value


# ------------------------------------------------------------------------------------ completion
def config_fingerprint(config: Any) -> str:
    """sha256 of a resolved ml-collections config's canonical JSON: what "the same run" means on restart."""
    return hashlib.sha256(config.to_json_best_effort(sort_keys=True).encode("utf-8")).hexdigest()


def mark_done(workdir: str | Path, config_sha256: str) -> None:
    """Records that the run in `workdir` reached the end of its last stage with the config whose
    `config_fingerprint` is `config_sha256` (done.json)."""
    record = {"config_sha256": config_sha256, "time": time.time()}
    write_atomic(Path(workdir) / DONE_FILE, json.dumps(record) + "\n")


def is_done(workdir: str | Path, config: Any) -> bool:
    """True iff `workdir/done.json` says the run finished with exactly this resolved config (an unreadable
    marker counts as not finished: restarting a finished run only resumes it, so erring that way is safe)."""
    try:
        record = json.loads((Path(workdir) / DONE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("config_sha256") == config_fingerprint(config)


# -------------------------------------------------------------------------------------- formatting
def format_number(value: Any) -> str:
    """Integers as they are; floats with 3 decimals, or 3 significant digits when tiny or huge."""
    x = scalar_value(value)
    if x is None:
        return str(value)
    if not isinstance(value, str) and np.asarray(value).dtype.kind in "iu":
        return str(int(x))
    return f"{x:.3g}" if x != 0 and math.isfinite(x) and (abs(x) < 1e-3 or abs(x) >= 1e4) else f"{x:.3f}"


def format_metrics(metrics: Mapping[str, Any], keys: Sequence[str]) -> str:
    """'name=value' for each of `keys` present in `metrics`, in that order (the progress-bar postfix)."""
    return " ".join(f"{k}={format_number(metrics[k])}" for k in keys if k in metrics)


def format_eval_summary(step: int, metrics: Mapping[str, Any], baseline: float | None = None,
                        reward_key: str = "eval/reward_mean") -> str:
    """One line: 'eval step 40 | reward 0.812 (+0.153 vs 0.659) | format=1.000 ...' (other keys sorted)."""
    parts = [f"eval step {step}"]
    if reward_key in metrics:
        reward = scalar_value(metrics[reward_key])
        text = f"reward {format_number(reward)}"
        if baseline is not None and reward is not None:
            text += f" ({reward - baseline:+.3f} vs {baseline:.3f})"
        parts.append(text)
    rest = sorted(k for k in metrics if k != reward_key)
    if rest:
        parts.append(format_metrics(metrics, rest))
    return " | ".join(parts)


class Progress:
    """A tqdm bar over steps (rate and ETA) whose postfix shows the key metrics of the latest step."""

    def __init__(self, total: int, *, initial: int = 0, desc: str = "grpo", keys: Sequence[str] = PROGRESS_KEYS,
                 file: IO[str] | None = None):
        self.keys = tuple(keys)
        self._file = file
        self._bar = tqdm.tqdm(total=total, initial=initial, desc=desc, file=file, dynamic_ncols=True,
                              mininterval=0.5, smoothing=0.1)

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Moves the bar to `step` (the number of steps done) and shows `metrics`."""
        self._bar.set_postfix_str(format_metrics(metrics, self.keys), refresh=False)
        self._bar.update(step - self._bar.n)

    def write(self, line: str) -> None:
        """Prints a line above the bar (e.g. an eval summary) without breaking it; stdout unless `file` was given."""
        tqdm.tqdm.write(line, file=self._file)

    def close(self) -> None:
        self._bar.close()

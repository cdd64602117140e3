"""rubric_jax.metrics: files written and parseable, TensorBoard framing and tags (read back by TensorBoard), the
done marker, formatting."""

import io
import json
import struct

import jax.numpy as jnp
import numpy as np
import pytest

import ml_collections
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from rubric_jax import metrics


def _read_events(path):
    """Independent TFRecord reader (TensorBoard's CRC and Event proto): checks both masked CRCs of every record."""
    blob, events, pos = path.read_bytes(), [], 0
    while pos < len(blob):
        header = blob[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        assert len_crc == masked_crc32c(header)
        payload = blob[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", blob[pos + 12 + length:pos + 16 + length])
        assert data_crc == masked_crc32c(payload)
        events.append(Event.FromString(payload))
        pos += 16 + length
    return events


def test_writer_files_are_parseable(tmp_path):
    with metrics.MetricsWriter(tmp_path, run_info={"rubric_hash": "abc", "lr": np.float32(0.5)}) as w:
        w.write(0, {"reward/mean": np.float32(0.25), "kl": jnp.asarray(0.125), "loss": float("nan"),
                    "num_tokens": np.int64(7), "note": "text", "per_dim": [1.0, float("inf")]})
        w.write(1, {"reward/mean": 0.5})
        w.write_samples(1, [{"question": "退款？", "response": "<answer>好</answer>", "reward": np.float64(1.0)}])
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["run_info"] == {"rubric_hash": "abc", "lr": 0.5}
    assert lines[1] == {"step": 0, "time": lines[1]["time"], "reward/mean": 0.25, "kl": 0.125, "loss": "nan",
                        "num_tokens": 7, "note": "text", "per_dim": [1.0, "inf"]}
    rows = metrics.read_jsonl_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and np.isnan(rows[0]["loss"])
    (sample,) = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sample["question"] == "退款？" and sample["reward"] == 1.0 and sample["step"] == 1

    (event_file,) = (tmp_path / "tb").iterdir()
    assert event_file.name.startswith("events.out.tfevents.")
    events = _read_events(event_file)
    assert events[0].file_version == "brain.Event:2"
    scalars = [(e.step, e.summary.value[0].tag, e.summary.value[0].simple_value) for e in events[1:]]
    assert scalars[:4] == [(0, "reward/mean", 0.25), (0, "kl", 0.125), (0, "loss", pytest.approx(np.nan, nan_ok=True)),
                           (0, "num_tokens", 7.0)]
    assert scalars[4:] == [(1, "reward/mean", 0.5)]  # strings and lists are not TensorBoard scalars


def test_writer_appends_on_resume_and_rejects_reserved_names(tmp_path):
    with metrics.MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(0, {"a": 1.0})
        with pytest.raises(ValueError, match=r"\['step'\] are reserved"):
            w.write(1, {"step": 3})
    with metrics.MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(1, {"a": 2.0})
    assert [r["a"] for r in metrics.read_jsonl_metrics(tmp_path / "metrics.jsonl")] == [1.0, 2.0]
    assert not (tmp_path / "tb").exists()


def test_jsonable_rejects_unknown_objects():
    with pytest.raises(TypeError, match="cannot write a object"):
        metrics.jsonable(object())


def test_format_eval_summary_and_progress():
    line = metrics.format_eval_summary(
        40, {"eval/reward_mean": 0.8125, "eval/reward/format": 1.0, "eval/num": 32}, baseline=0.625)
    assert line == "eval step 40 | reward 0.812 (+0.188 vs 0.625) | eval/num=32 eval/reward/format=1.000"
    assert metrics.format_metrics({"kl": 1e-5, "loss": 2.5, "x": 1}, ["loss", "kl", "missing"]) == \
        "loss=2.500 kl=1e-05"
    out = io.StringIO()
    bar = metrics.Progress(10, initial=2, desc="grpo", keys=("reward/mean", "kl"), file=out)
    bar.update(5, {"reward/mean": 0.5, "kl": 0.01, "loss": 3.0})
    bar.write("eval step 5 | reward 0.500")
    bar.close()
    text = out.getvalue()
    assert "5/10" in text and "reward/mean=0.500 kl=0.010" in text and "eval step 5" in text and "loss" not in text


def test_each_stage_has_its_own_tensorboard_tags(tmp_path):
    """SFT and GRPO both count steps from 1: under shared tags TensorBoard would draw one zig-zag line."""
    with metrics.MetricsWriter(tmp_path) as w:
        for step, loss in enumerate((7.5, 7.0, 6.5), start=1):
            w.write(step, {"stage": "sft", "loss": loss, "lr": 1e-3, "grad_norm": 2.0, "entropy": 7.0})
        w.write(0, {"stage": "eval", "eval/reward_mean": 0.25, "eval/reward/format": 1.0})
        for step, loss in enumerate((0.5, 0.25), start=1):
            w.write(step, {"stage": "grpo", "loss": loss, "kl": 0.01 * step, "reward/mean": 0.5, "lr": 2e-4})
    events = EventAccumulator(str(tmp_path / "tb"))  # TensorBoard's own reader
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"sft/loss", "sft/lr", "sft/grad_norm", "sft/entropy", "grpo/loss", "grpo/kl", "grpo/reward/mean",
            "grpo/lr", "eval/reward_mean", "eval/reward/format"} == tags
    assert [(e.step, e.value) for e in events.Scalars("sft/loss")] == [(1, 7.5), (2, 7.0), (3, 6.5)]
    assert [(e.step, e.value) for e in events.Scalars("grpo/loss")] == [(1, 0.5), (2, 0.25)]
    assert metrics.tensorboard_scalars({"loss": 1.0, "note": "x"}) == {"loss": 1.0}  # rows without a stage


def test_done_marker_names_the_config_it_finished_with(tmp_path):
    config = ml_collections.ConfigDict({"rl": {"lr": 1e-4, "steps": 2}, "stages": ("grpo",)})
    assert not metrics.is_done(tmp_path, config)
    metrics.mark_done(tmp_path, metrics.config_fingerprint(config))
    assert metrics.is_done(tmp_path, config)
    longer = ml_collections.ConfigDict({"rl": {"lr": 1e-4, "steps": 3}, "stages": ("grpo",)})
    assert not metrics.is_done(tmp_path, longer)  # more steps: not finished, resume it
    (tmp_path / metrics.DONE_FILE).write_text("{torn")
    assert not metrics.is_done(tmp_path, config)
    assert [p.name for p in tmp_path.iterdir()] == [metrics.DONE_FILE]  # the atomic write left no temp file


def test_best_eval_skips_the_baseline_and_non_finite_and_ties_to_the_later_step():
    assert metrics.best_eval([(0, 0.9), (1, 0.5), (2, 0.7), (3, 0.7), (4, float("nan")), (5, None)]) == (3, 0.7)
    assert metrics.best_eval([(0, 0.9), (2, float("inf"))]) is None and metrics.best_eval([]) is None

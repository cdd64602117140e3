"""Labelling rounds (issue 23 §2, §3) and calibrate's output defects (issue 24 S7, T2, U2):
- the stratified draw covers every (step, reward) cell and both ends of a rare dimension, deduplicated;
- sample_for_labels -> null labels refused naming file and line -> labels filled -> calibrate reads them;
- --compare: a paired bootstrap of B − A tells a consistent improvement from noise where the two versions'
  separate intervals overlap; the CLI writes report.json and report.md side by side;
- the redundancy check flags two dimensions that rank alike and skips a constant one;
- an earlier calibration's correction.json and plots do not survive a calibration that writes none;
  --out naming a file, --config.bootstrap=0 fail in one line naming the key, before scoring.
Each command run is forked from the command's server (tests/command_server.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from rubric_jax.calibration import label_sampling
from rubric_jax.calibration.compare import compare_dimension
from rubric_jax.calibration.labels import LabelsError, read_items
from rubric_jax.calibration.redundancy import redundancy_report
from rubric_jax.calibration.report import CORRECTION_FILE, write_outputs
from rubric_jax.jsonl import read_jsonl
from rubric_jax.rubrics.io import load_rubric
from tests import manual

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "rubric_jax" / "assets" / "tiny"
CAL = REPO / "tests" / "fixtures" / "calibration"


def _sample(step: int, reward: float, response: str, **scores: float) -> label_sampling.Sample:
    return label_sampling.Sample(step, "grpo", "q", response, reward, scores)


def test_the_draw_fills_every_cell_and_both_ends_of_a_rare_dimension():
    """1200 responses over 30 steps; dimension `rare` is at its top level on 6 of them only (uniformly spread over
    the cells). 48 picks: 4 per (step third × reward quartile) cell, and all 6 rare ones (a uniform draw of 48
    expects 0.24 of them); duplicates of one text are drawn once."""
    rng = np.random.default_rng(0)
    samples = []
    for i in range(1200):
        rare = 1.0 if i % 200 == 7 else 0.0
        samples.append(_sample(1 + i % 30, float(rng.uniform()), f"response {i}", rare=rare,
                               common=float(rng.integers(0, 2))))
    samples += [_sample(1, 0.5, "response 3", rare=0.0, common=0.0)] * 5  # copies of one text
    drawn = label_sampling.draw(samples, 48, seed=1)
    assert len(drawn.samples) == 48 and drawn.pool == 1200
    assert len({s.response for s in drawn.samples}) == 48
    assert sorted(drawn.cells.values()) == [4] * 12
    assert sum(s.scores["rare"] == 1.0 for s in drawn.samples) == 6
    assert [s.response for s in label_sampling.draw(samples, 48, seed=1).samples] == [s.response for s in drawn.samples]
    assert len(label_sampling.draw(samples[:10], 48).samples) == 10  # fewer distinct responses than asked: all


def _workdir(tmp_path: Path) -> Path:
    """A run workdir: the tiny default's shared rubric (rule dimensions) and the tiny questions with their keyword
    and length criteria (not the LLM-judged politeness one: no judge here); samples.jsonl with 3 steps × 16 rollouts
    whose responses do or do not name the question's keyword, short and long."""
    work = tmp_path / "run"
    work.mkdir()
    questions = [row for _, row in read_jsonl(TINY / "questions_train.jsonl")][:8]
    for q in questions:
        q["rubric"]["extra"] = [d for d in q["rubric"]["extra"] if d["kind"] == "rule"]
    (work / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    config = {"data": {"train": str(work / "questions.jsonl"), "eval": "", "golden": "", "tfds_dir": ""}}
    (work / "config.json").write_text(json.dumps(config))
    shutil.copy(TINY / "rubric.yaml", work / "rubric.yaml")
    rows = []
    for step in (1, 2, 3):
        for k in range(16):
            q = questions[(step + k) % 8]
            named = k % 2 == 0
            text = f"{q['keywords'][0] if named else 'it'} " + "word " * (5 + 7 * k) + f"(step {step})"
            rows.append({"step": step, "stage": "grpo", "question": q["question"],
                         "response": f"<think>t</think><answer>{text}</answer>", "reward": 0.1 * (k % 8),
                         "scores": {"format": 1.0, "topic_keyword": float(named), "length": None}})
    (work / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return work


def test_sample_for_labels_round_trip_through_calibrate(tmp_path, command_server):
    work = _workdir(tmp_path)
    labels = tmp_path / "round1.jsonl"
    sample_for_labels = command_server("experiments.sample_for_labels").run
    calibrate = command_server("experiments.calibrate").run
    proc = sample_for_labels(f"--workdir={work}", "--config.n=30", f"--out={labels}", "--config.seed=3")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["drawn"] == 30 and summary["distinct_responses"] == 48
    rows = [row for _, row in read_jsonl(labels)]
    assert all(set(r["labels"]) == {"format", "redundancy", "template", "length", "topic_keyword"}
               and set(r["labels"].values()) == {None} and r["rubric"]["extra"] for r in rows)
    assert "reward" not in rows[0] and "scores" not in rows[0]  # people label without the judge's verdict
    shared = load_rubric(work / "rubric.yaml")
    with pytest.raises(LabelsError, match=rf"^{labels}:1: labels.format: not labelled yet \(null\)"):
        read_items(labels, shared)
    again = sample_for_labels(f"--workdir={work}", "--config.n=30", f"--out={labels}")
    assert again.returncode == 2 and "exists (it may hold labels already)" in again.stderr  # filled labels are safe

    for row in rows:  # a person labels three dimensions (the keyword one by reading the answer) and drops two
        answer = row["response"].split("<answer>")[1]
        keyword = next(d for d in row["rubric"]["extra"] if d["id"] == "topic_keyword")["params"]["words"][0]
        row["labels"] = {"format": 1, "topic_keyword": int(answer.startswith(keyword)),
                         "length": int(len(answer.split()) < 30)}
    labels.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = read_items(labels, shared)
    assert len(items) == 30 and {tuple(i.labels) for i in items} == {("format", "topic_keyword", "length")}
    out = tmp_path / "cal"
    proc = calibrate(f"--rubric={work / 'rubric.yaml'}", f"--labels={labels}", f"--out={out}", "--config.bootstrap=50")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["items"] == 30 and report["dimensions"]["topic_keyword"]["spearman"]["value"] == pytest.approx(1.0)


def test_paired_difference_tells_a_consistent_improvement_from_noise():
    """200 items on a 1-5 scale. A errs on 80 items; B = A with 12 of those errors fixed. Each version's own
    interval overlaps the other's, yet every resample of the same items favours B: the paired interval of B − A
    lies above 0. Two versions with independent errors of the same size: no clear difference."""
    rng = np.random.default_rng(0)
    label = rng.integers(1, 6, 200).astype(float)
    a = label.copy()
    wrong = rng.choice(200, 80, replace=False)
    a[wrong] = rng.integers(1, 6, 80)
    b = a.copy()
    b[wrong[:12]] = label[wrong[:12]]
    entry = compare_dimension(a, b, label, range(1, 6), num_resamples=400, seed=[0])
    a_ci, b_ci = entry["a"]["spearman"]["ci95"], entry["b"]["spearman"]["ci95"]
    assert a_ci[1] > b_ci[0]  # the separate intervals overlap: comparing them would say "noise"
    diff = entry["spearman_difference"]
    assert diff["value"] > 0 and diff["ci95"][0] > 0 and diff["verdict"] == "B better"
    other = label.copy()
    other_wrong = rng.choice(200, 80, replace=False)
    other[other_wrong] = rng.integers(1, 6, 80)
    noise = compare_dimension(a, other, label, range(1, 6), num_resamples=400, seed=[0])["spearman_difference"]
    assert noise["ci95"][0] < 0 < noise["ci95"][1] and noise["verdict"] == "no clear difference"
    swapped = compare_dimension(b, a, label, range(1, 6), num_resamples=400, seed=[0])["spearman_difference"]
    assert swapped["verdict"] == "A better"


def test_compare_cli_writes_both_versions_side_by_side(tmp_path, command_server):
    """The docs/judges.md command (read from the page), into a temporary --out."""
    out = tmp_path / "cmp"
    argv = manual.command("experiments.calibrate", "--compare=").argv
    flags = [a if not a.startswith("--out=") else f"--out={out}" for a in argv[argv.index("experiments.calibrate") + 1:]]
    proc = command_server("experiments.calibrate").run(*flags, "--config.bootstrap=100")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    length = report["dimensions"]["length"]
    assert report["format"] == "rubric_jax.rubric_comparison" and length["n"] == 14
    assert length["b"]["spearman"]["value"] > length["a"]["spearman"]["value"]  # B's range fits the labels better
    assert length["spearman_difference"]["value"] == pytest.approx(
        length["b"]["spearman"]["value"] - length["a"]["spearman"]["value"])
    assert length["spearman_difference"]["verdict"] == "no clear difference"  # 14 items cannot tell
    md = (out / "report.md").read_text()
    assert "| length | 14 | Spearman | 0.027 [" in md and "| B − A [95% CI] | verdict |" in md


def test_redundancy_flags_pairs_that_rank_alike_and_skips_constant_dimensions():
    a = np.array([1, 2, 3, 4, 5, 1, 2, 3.0])
    columns = {"clarity": a, "quality": a * 2 + 1, "safety": np.ones(8), "length": np.array([5, 1, 4, 2, 3, 5, 1, 2.0])}
    report = redundancy_report(columns, 0.9)
    assert report["flagged"] == [["clarity", "quality"]]
    pairs = {(p["a"], p["b"]): p for p in report["pairs"]}
    assert pairs[("clarity", "quality")]["spearman"] == pytest.approx(1.0)
    assert pairs[("clarity", "safety")]["spearman"] is None and "constant" in pairs[("clarity", "safety")]["undefined"]
    assert not pairs[("clarity", "length")]["flagged"]
    nan_rows = redundancy_report({"x": np.array([1, 2, np.nan, 4.0]), "y": np.array([1, 2, 9, 4.0])}, 0.9)
    assert nan_rows["pairs"][0]["n"] == 3 and nan_rows["flagged"] == [["x", "y"]]  # rows both score


def test_stale_outputs_are_removed_and_the_report_written_last(tmp_path):
    """S7: an earlier calibration left correction.json and plots of two dimensions; this one fits no correction and
    plots one dimension. An input file in the directory is never removed."""
    out = tmp_path / "cal"
    (out / "plots").mkdir(parents=True)
    correction = {"format": "rubric_jax.score_correction", "format_version": 1, "version": "1.0.0",
                  "standardize": {}, "dimensions": {"length": {"intercept": 0.0, "score": 1.0, "features": {},
                                                            "scale": [1, 5]}}}
    (out / CORRECTION_FILE).write_text(json.dumps(correction))
    for name in ("length.png", "safety.png"):
        (out / "plots" / name).write_bytes(b"old")
    (out / "report.json").write_text("{}")
    written = write_outputs(out, {out / "plots" / "safety.png": b"new", out / "report.md": "# new",
                                  out / "report.json": "{\"new\": 1}"})
    assert written[-1] == out / "report.json" and json.loads((out / "report.json").read_text()) == {"new": 1}
    assert not (out / CORRECTION_FILE).exists() and not (out / "plots" / "length.png").exists()
    assert (out / "plots" / "safety.png").read_bytes() == b"new"
    (out / CORRECTION_FILE).write_text(json.dumps(correction))
    write_outputs(out, {out / "report.json": "{}"}, protected=[out / CORRECTION_FILE])  # e.g. --correction=it
    assert (out / CORRECTION_FILE).exists()


def test_cli_refuses_bad_outputs_and_names_the_bootstrap_flag_before_scoring(tmp_path, command_server):
    """Each case a run of the command, forked from one process that imported it (tests/command_server.py)."""
    existing = tmp_path / "report_file"
    existing.write_text("keep me")
    common = [f"--rubric={CAL / 'rubric.yaml'}", f"--labels={CAL / 'labels.jsonl'}"]
    cases = {"out_is_a_file": ([f"--out={existing}"], f"--out={existing}: exists and is not a directory"),
             "below_a_file": ([f"--out={existing}/sub"], "is not a directory"),
             "bootstrap_zero": ([f"--out={tmp_path / 'b'}", "--config.bootstrap=0"],
                                "--config.bootstrap=0: expected an integer >= 1"),
             "compare_without_rubric": ([f"--labels={CAL / 'labels.jsonl'}", f"--out={tmp_path / 'c'}",
                                         f"--compare={CAL / 'rubric_b.yaml'}", "--config.against=judge"],
                                        "--compare=RUBRIC_B")}
    for case, (flags_, fragment) in cases.items():
        proc = command_server("experiments.calibrate").run(*common, *flags_)
        assert proc.returncode == 2, (case, proc.stderr)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("experiments.calibrate: error:")]
        assert len(errors) == 1 and fragment in errors[0], (case, proc.stderr)
        assert "scoring" not in proc.stderr and "Traceback" not in proc.stderr, case  # refused before scoring
    assert existing.read_text() == "keep me" and not (tmp_path / "b").exists()


def test_calibrating_again_with_fewer_labels_leaves_no_stale_correction(tmp_path, command_server):
    """S7 end to end: 40 labelled rows fit a correction; 14 rows cannot; correction.json goes with the old report."""
    rows = [json.loads(line) for line in (CAL / "labels.jsonl").read_text().splitlines()]
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({**r, "response": f"{r['response']} ({k})"}) + "\n"
                            for k in range(3) for r in rows))
    out = tmp_path / "cal"
    calibrate = command_server("experiments.calibrate").run
    first = calibrate(f"--rubric={CAL / 'rubric.yaml'}", f"--labels={many}", f"--out={out}", "--config.bootstrap=20")
    assert first.returncode == 0, first.stderr
    assert (out / CORRECTION_FILE).exists()
    second = calibrate(f"--rubric={CAL / 'rubric.yaml'}", f"--labels={CAL / 'labels.jsonl'}", f"--out={out}",
                       "--config.bootstrap=20")
    assert second.returncode == 0, second.stderr
    report = json.loads((out / "report.json").read_text())
    assert "not_fitted" in report["dimensions"]["length"]["correction"] and "correction" not in report
    assert not (out / CORRECTION_FILE).exists()

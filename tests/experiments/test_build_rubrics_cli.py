"""experiments.build_rubrics: the README command on the shipped corpus with the tiny model through the real
sampler, and user errors (one line, exit 2, nothing written); each command run forked from the command's server
(tests/command_server.py)."""

import json
from pathlib import Path

import pytest

from configs import tiny
from rubric_jax import config_boundary
from rubric_jax.qurl import pipeline as P
from rubric_jax.qurl.retrieval import CorpusError
from tests import manual

REPO = Path(__file__).resolve().parents[2]
ASSETS = "rubric_jax/assets/qurl"
README_COMMAND = ("./launch.sh experiments.build_rubrics --config=configs/tiny.py "
                  f"--questions={ASSETS}/questions.jsonl --corpus={ASSETS}/corpus.jsonl --out=runs/qurl_tiny")


def test_the_readme_command_runs_end_to_end_with_the_tiny_model(tmp_path, command_server):
    assert README_COMMAND in " ".join(manual.text().replace("\\\n", " ").split())
    args = README_COMMAND.split()[2:-1] + [f"--out={tmp_path}"]  # as launch.sh runs it, into a temporary --out
    proc = command_server("experiments.build_rubrics").run(*args)
    # The random tiny model builds no rubric (below): the report is written and the command exits 1 saying why.
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "batch 1/1: meta_description done" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "experiments.build_rubrics: error: no rubric built: all 8 question(s) dropped: 8 at meta_description "
        f"(no document got a valid meta-description); {tmp_path}/report.json has each "
        "question's reason")
    report = json.loads((tmp_path / "report.json").read_text())
    summary = report["summary"]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {k: summary[k] for k in
                                                                ("questions", "kept", "dropped", "dropped_at")}
    # A random model cannot write usable meta-descriptions: every one is counted, retried once, and reported.
    meta = summary["meta_description"]
    assert summary["questions"] == 8 and meta["requests"] == summary["retrieval"]["documents"] > 8
    assert meta["failed"] + summary["kept"] <= meta["requests"] and meta["invalid"] >= meta["failed"]
    assert meta["attempts"] == meta["requests"] + meta["retried"] and meta["generate_calls"] == 2
    assert summary["kept"] + summary["dropped"] == 8 and sum(summary["dropped_at"].values()) == summary["dropped"]
    assert all(q["status"] == "kept" or q["reason"] for q in report["questions"])
    assert report["settings"]["prompts"]["rubric_generation"]["version"] == "1.0.0"
    assert len((tmp_path / "questions.jsonl").read_text().splitlines()) == summary["kept"]
    assert (tmp_path / "work" / "batch_00000.json").exists()


def test_a_malformed_corpus_line_is_one_line_and_exit_2(tmp_path, command_server):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"doc_id": "a", "title": "t", "text": "b", "quality": 1}\n{"doc_id": "b", "title": "t"\n')
    proc = command_server("experiments.build_rubrics").run(
        "--config=configs/tiny.py", f"--questions={ASSETS}/questions.jsonl", f"--corpus={corpus}",
        f"--out={tmp_path / 'out'}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"experiments.build_rubrics: error: {corpus}:2: not valid JSON " \
                                                  "(Expecting ',' delimiter)"
    assert not (tmp_path / "out").exists()


def _run_build(tmp_path, *, questions=f"{ASSETS}/questions.jsonl", corpus=f"{ASSETS}/corpus.jsonl", out=None,
               **overrides):
    config = tiny.get_config()
    for dotted, value in overrides.items():
        block, field = dotted.split("__")
        setattr(config[block], field, value)
    return P.run_build(config_boundary.experiment(config), str(REPO / questions), str(REPO / corpus), str(out or tmp_path / "out"))


@pytest.mark.parametrize("overrides, message", [
    ({"judge__mode": "bogus"}, "config.judge.mode='bogus': expected one of ('per_dimension', 'all_criteria')"),
    ({"qurl__num_candidates": 0}, "qurl.num_candidates=0: expected an integer >= 1"),
    ({"qurl__sampler": "beam(4)"}, "qurl.sampler='beam(4)'"),
    ({"judge__samples": 0}, "config.judge.samples=0: expected an integer >= 1"),
    ({"mesh__data": 3}, "MeshConfig(data=3, fsdp=-1, tensor=1): the fixed axes (product 3) do not divide"),
])
def test_bad_config_values_fail_before_any_work(tmp_path, overrides, message):
    with pytest.raises(ValueError) as e:
        _run_build(tmp_path, **overrides)
    assert message in str(e.value) and not (tmp_path / "out").exists()


def test_missing_and_malformed_inputs_name_the_file(tmp_path):
    with pytest.raises(P.BuildError, match=r"--corpus=.*nope.jsonl: file does not exist"):
        _run_build(tmp_path, corpus=str(tmp_path / "nope.jsonl"))
    bad = tmp_path / "corpus.jsonl"
    bad.write_text('{"doc_id": "a", "title": "t", "text": "b", "quality": "high"}\n')
    with pytest.raises(CorpusError, match=rf"{bad}:1: field 'quality' must be a finite number"):
        _run_build(tmp_path, corpus=str(bad))
    with pytest.raises(ValueError, match=r"questions.jsonl:1: missing field 'question'"):
        (tmp_path / "questions.jsonl").write_text('{"id": "q"}\n')
        _run_build(tmp_path, questions=str(tmp_path / "questions.jsonl"), out=tmp_path / "elsewhere")
    with pytest.raises(P.BuildError, match="would overwrite the input"):
        _run_build(tmp_path, questions=str(tmp_path / "questions.jsonl"), out=tmp_path)
    with pytest.raises(FileNotFoundError, match="nope-model: checkpoint directory does not exist"):
        _run_build(tmp_path, model__checkpoint=str(tmp_path / "nope-model"))
    assert not (tmp_path / "out").exists() and not (tmp_path / "elsewhere").exists()  # nothing half-written

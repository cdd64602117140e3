"""Evolving rubrics end to end (rl.rubric_refresh_every, train/evolving.py): a shrunken GRPO-only tiny run whose
judge is a served, scripted endpoint (tests/openai_double.py) that also writes the proposals: metrics.jsonl shows the
versions with their hashes and diffs, every version is on disk, and a run SIGKILLed after its first refresh resumes to
the same version sequence."""

from __future__ import annotations

import json
import os
import re
import signal
import zlib
from pathlib import Path

import pytest

from openai_double import MODEL, Endpoint
from test_loop import _rows, _wait_for_row
from test_sweeps import _ungated_rubric

PROPOSER = "Propose new criteria"  # a line of rubric_jax/qurl/prompts/rubric_refresh.txt
# What the proposer writes at each refresh (distinct: a description close to one in use is dropped as a duplicate).
DESCRIPTIONS = ("The answer names a concrete next step the user can take.", "It explains why, not only what.",
                "Claims come with their source.", "Every part of the question gets addressed.")


def _reply(messages: list[dict]) -> str:
    """The proposer's reply: one criterion named after the rubric's size (evolved_3, then evolved_4, ...); a judge's:
    a score drawn from a hash of its prompt (so proposed criteria spread over the answers)."""
    content = messages[-1]["content"]
    if PROPOSER in content:
        used = len(re.findall(r'^- [A-Za-z][A-Za-z0-9_-]*: ', content, re.M))
        levels = {"0": "Misses it.", "1": "Partly.", "2": "Fully."}
        return json.dumps({"criteria": [{"id": f"evolved_{used}", "description": DESCRIPTIONS[used - 3], "points": 2,
                                         "levels": levels, "good_example": "good", "bad_example": "bad", "cites": []}]})
    lo, hi = map(int, re.search(r"SCORE: <integer from (-?\d+) to (-?\d+)>", content).groups())
    return f"SCORE: {lo + zlib.crc32(content.encode()) % (hi - lo + 1)}"


@pytest.fixture(scope="module")
def endpoint():
    served = Endpoint(reply=_reply).up()
    yield served
    served.down()


def _flags(workdir: Path, endpoint: Endpoint) -> list[str]:
    return ["--config=configs/tiny.py", f"--workdir={workdir}", "--config.stages=('grpo',)", "--config.rl.steps=4",
            "--config.rl.questions_per_step=4", "--config.rl.group_size=4", "--config.rl.micro_batches=1",
            "--config.rl.max_new_tokens=16", "--config.eval.max_questions=4", "--config.eval.max_new_tokens=8",
            "--config.eval.every_steps=4", "--config.checkpoint.every_steps=2",
            f"--config.data.rubric={_ungated_rubric(workdir.parent)}", "--config.judge.backend=openai",
            f"--config.judge.base_url={endpoint.url}", f"--config.judge.model={MODEL}",
            "--config.rl.rubric_refresh_every=1", "--config.qurl.num_candidates=1", "--config.qurl.max_retries=0"]


def _versions(workdir: Path) -> list[tuple]:
    """Per GRPO step: its rubric version, hash, and a refresh's added and retired criteria."""
    return [(r["step"], r["rubric/version"], r["rubric/hash"], r.get("rubric/added"), r.get("rubric/retired"))
            for r in _rows(workdir) if r["stage"] == "grpo"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, endpoint, command_server) -> Path:
    workdir = tmp_path_factory.mktemp("evolving") / "run"
    done = command_server("experiments.run").run(*_flags(workdir, endpoint))
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir


def test_the_run_logs_each_version_with_its_hash_and_diff(uninterrupted):
    """A refresh every step: each one that found pairs added the proposer's criterion (the step-4 batch's medical
    questions fail their disclaimer gate, so its groups are flat and it changes nothing); a change is a new version and
    hash in that step's row, the rows between keep them."""
    steps = _versions(uninterrupted)
    changed = [i for i, (_, _, _, added, retired) in enumerate(steps) if added or retired]
    assert len(changed) >= 2 and [s for s, *_ in steps] == [1, 2, 3, 4]
    versions = ["1.2.0"]
    for i, (step, version, digest, added, retired) in enumerate(steps):
        if i in changed:
            assert added == [f"evolved_{len(versions) + 2}"] and retired == []
            versions.append(f"1.{len(versions) + 2}.0")
            saved = json.loads((uninterrupted / "rubric_versions" / f"{version}.json").read_text())
            assert saved["dimensions"][-1]["id"] == added[0]
        else:
            assert added in (None, [])
        assert version == versions[-1]
    hashes = {version: digest for _, version, digest, _, _ in steps}
    assert len(set(hashes.values())) == len(hashes) == len(versions) - (steps[0][1] != "1.2.0")
    refresh = [r for r in _rows(uninterrupted) if r["stage"] == "grpo" and "rubric/added" in r]
    assert len(refresh) == 4 and all(r["rubric/refresh/invalid"] == 0 for r in refresh)
    # An evolved criterion is judged in training from the step after it joined (its monitors appear then).
    first = steps[changed[0]][0]
    grpo = [r for r in _rows(uninterrupted) if r["stage"] == "grpo"]
    assert all(("monitor/saturation/evolved_3" in r) == (r["step"] > first) for r in grpo)


def test_a_run_killed_after_a_refresh_resumes_to_the_same_versions(uninterrupted, endpoint, tmp_path, command_server):
    run = command_server("experiments.run")
    workdir = tmp_path / "run"
    killed = run.start(*_flags(workdir, endpoint))
    _wait_for_row(workdir, "grpo", 3, killed.running, lambda: killed.wait().stderr)  # checkpoint 2 holds version 1.3.0
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait().returncode == -signal.SIGKILL
    resumed = run.run(*_flags(workdir, endpoint))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    assert _versions(workdir) == _versions(uninterrupted)


class Saturating:
    """A judge whose proposer's first criterion, `evolved_3`, is one the policy then saturates: its first 16 scores (the
    filter's: 2 shown and 2 held-out groups of 4) are drawn as `_reply` draws them, every later one is the top."""

    def __init__(self):
        self.scored = 0

    def __call__(self, messages: list[dict]) -> str:
        content = messages[-1]["content"]
        if "Criterion `evolved_3`" not in content:
            return _reply(messages)
        self.scored += 1
        return _reply(messages) if self.scored <= 16 else "SCORE: 2"


def test_a_criterion_the_policy_saturates_retires(tmp_path, command_server):
    served = Endpoint(reply=Saturating()).up()
    try:
        workdir = tmp_path / "run"
        flags = [f for f in _flags(workdir, served) if not f.startswith("--config.rl.steps")]
        done = command_server("experiments.run").run(*flags, "--config.rl.steps=2")
    finally:
        served.down()
    assert done.returncode == 0, done.stderr[-3000:]
    grpo = [r for r in _rows(workdir) if r["stage"] == "grpo"]
    assert grpo[0]["rubric/added"] == ["evolved_3"]
    assert grpo[1]["monitor/saturation/evolved_3"] == 1.0  # the monitors' own measure, on the step after it joined
    assert grpo[1]["rubric/retired"] == ["evolved_3"] and grpo[1]["rubric/added"] == ["evolved_4"]
    final = json.loads((workdir / "rubric_versions" / f"{grpo[1]['rubric/version']}.json").read_text())
    assert [d["id"] for d in final["dimensions"]][-1] == "evolved_4"
    assert "evolved_3" not in [d["id"] for d in final["dimensions"]]

"""`experiments.calibrate --config.red_team`, each run forked from the command's server (tests/command_server.py): the
docs' command against the shipped tiny judge writes report.json and report.md (a rate per LLM dimension over every
payload and placement in the known-bad responses), and flags it cannot combine with fail in one line before anything
loads."""

from __future__ import annotations

import json
from pathlib import Path

from rubric_jax.calibration import red_team
from tests import manual

REPO = Path(__file__).resolve().parents[2]
PAGES = manual.text()  # README.md and docs/*.md


def _documented() -> list[str]:
    """The flags of the docs' `./launch.sh experiments.calibrate --config.red_team` line."""
    line = next(line for line in PAGES.splitlines() if line.startswith("./launch.sh experiments.calibrate --config.red_team"))
    return line.split("experiments.calibrate", 1)[1].split()


def test_docs_red_team_of_the_tiny_judge_reports_a_rate_per_dimension(tmp_path, command_server):
    args = [a if not a.startswith("--out=") else f"--out={tmp_path / 'rt'}" for a in _documented()]
    proc = command_server("experiments.calibrate").run(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    report = json.loads((tmp_path / "rt" / "report.json").read_text("utf-8"))
    polite = report["dimensions"]["politeness"]
    labels = [json.loads(line)["labels"]["politeness"] for line in
              (REPO / next(a for a in args if a.startswith("--labels=")).split("=", 1)[1]).read_text().splitlines()]
    cells = len(red_team.PAYLOADS) * len(red_team.PLACEMENTS)
    assert polite["bad_items"] == labels.count(0) and polite["trials"] + polite["unscored"] == labels.count(0) * cells
    assert summary["injection_rates"] == {"politeness": polite["rate"]} == {"politeness": polite["successes"] / polite["trials"]}
    assert set(polite["by_payload"]) == {p.id for p in red_team.PAYLOADS} and report["inputs"]["judge_hash"]
    assert f"| politeness | {polite['bad_items']} | {polite['trials']} | {polite['successes']} |" in (
        tmp_path / "rt" / "report.md").read_text("utf-8")


def test_red_team_with_compare_is_refused_in_one_line(tmp_path, command_server):
    proc = command_server("experiments.calibrate").run(
        "--config.red_team", "--rubric=tests/fixtures/calibration/rubric.yaml",
        "--compare=tests/fixtures/calibration/rubric_b.yaml", "--labels=tests/fixtures/calibration/labels.jsonl",
        f"--out={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("experiments.calibrate: error: --config.red_team injects into the responses "
                                                    "the labels call bad: no --compare or --config.against=judge")

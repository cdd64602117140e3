"""The judge cascade through experiments.score (docs/judges.md's command as written): the tiny judge screens, the
fine-tuned tiny judge refines; the summary reports the escalated fraction and every row the cascade's judge hash.
A bad --judge.cascade is one line and exit 2."""

import json
from pathlib import Path

from rubric_jax.judges.spec import JudgeSpec, judge_hash, load_judge_file

REPO = Path(__file__).resolve().parents[2]


def test_the_documented_cascade_scores_and_reports_what_it_escalated(tmp_path, command_server):
    from tests import manual

    command = manual.command("experiments.score", "--judge.cascade=configs/judges/tiny_fixed.py")
    out = tmp_path / "scored.jsonl"
    args = [f"--out={out}" if a.startswith("--out=") else a for a in command.argv[2:]]
    proc = command_server("experiments.score").run(*args)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["judge_cascade_screened"] == len(rows) == 8  # one politeness item per row
    assert summary["judge_cascade_escalated_frac"] == summary["judge_cascade_escalated"] / 8
    assert summary["judge_cascade_prompts"] == summary["judge_cascade_escalated"]  # the refiner: 1 sample each
    block = load_judge_file(REPO / "configs/judges/tiny.py")
    block.update(samples=3, cascade="configs/judges/tiny_fixed.py")
    cascaded = JudgeSpec.from_config(block)
    assert {r["judge_hash"] for r in rows} == {judge_hash(cascaded)} != {judge_hash(JudgeSpec.from_config(
        {**block.to_dict(), "cascade": ""}))}
    assert all(r["scores"]["politeness"] in (0.0, 1.0) for r in rows)


def test_a_bad_cascade_flag_is_one_line_and_exit_2(tmp_path, command_server):
    proc = command_server("experiments.score").run(
        "--judge=configs/judges/tiny.py", "--judge.cascade=configs/judges/nope.py",
        f"--responses={tmp_path / 'in.jsonl'}", f"--out={tmp_path / 'out.jsonl'}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "experiments.score: error: --judge.cascade='configs/judges/nope.py': cannot load this judge config file "
        "(configs/judges/nope.py: judge config file does not exist)"), proc.stderr
    assert not (tmp_path / "out.jsonl").exists()

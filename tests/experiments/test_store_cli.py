"""The verdict store through experiments.score: a run killed (SIGKILL) after some judge calls, re-run, judges
only what is missing; a corrupt store file is one line naming it."""

import json

import pytest

from test_reward import ACCURACY, FORMAT
from test_score_cli import rubric_dict, score_in_process, scripted_judge_dir, write_jsonl

# experiments.score whose judge process kills itself (kill -9) as its `KILL_AT`-th generate call starts:
# the calls before it have returned and been stored, the rest never happen.
# Setup code for experiments.score's server child (tests/command_server.py): SIGKILLed at its third generate call.
KILLED_SCORE = """
import os, signal
from rubric_jax import sampling
real, calls = sampling.generate, []
def generate(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
sampling.generate = generate
"""
ROWS = 6  # one LLM dimension, one sample: one judge prompt per row; 2 rows per reward call = one generate call


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("store_cli")
    judge_dir = scripted_judge_dir(tmp / "judge", "SCORE: 4")
    rubric = tmp / "rubric.json"
    rubric.write_text(json.dumps(rubric_dict([FORMAT, ACCURACY])))
    responses = write_jsonl(tmp / "in.jsonl", [{"question": f"q{i}", "response": f"answer {i}"} for i in range(ROWS)])
    return [f"--rubric={rubric}", f"--responses={responses}", f"--judge.checkpoint={judge_dir}",
            "--judge.sampler=greedy", "--judge.samples=1", "--judge.max_new_tokens=8", "--config.batch_size=2"]


def summary_of(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


def test_a_killed_score_rerun_judges_only_what_is_missing(tmp_path, inputs, command_server):
    store = tmp_path / "verdicts.db"
    killed = command_server("experiments.score").run(*inputs, f"--out={tmp_path / 'killed.jsonl'}",
                                                     f"--judge.store={store}", setup=KILLED_SCORE)
    assert killed.returncode == -9, killed.stderr  # killed in the middle: two of three calls stored
    assert not (tmp_path / "killed.jsonl").exists()

    status, stdout, stderr = score_in_process(*inputs, f"--out={tmp_path / 'resumed.jsonl'}", f"--judge.store={store}")
    assert status == 0, stderr
    resumed = summary_of(stdout)
    assert resumed["judge_store_hits"] == 4 and resumed["judge_prompts"] == 2 and resumed["judge_generate_calls"] == 1

    status, stdout, stderr = score_in_process(*inputs, f"--out={tmp_path / 'fresh.jsonl'}")  # no store
    assert status == 0, stderr
    assert summary_of(stdout)["judge_prompts"] == ROWS and summary_of(stdout)["judge_store_hits"] == 0
    assert (tmp_path / "resumed.jsonl").read_text() == (tmp_path / "fresh.jsonl").read_text()

    status, stdout, stderr = score_in_process(*inputs, f"--out={tmp_path / 'again.jsonl'}", f"--judge.store={store}")
    again = summary_of(stdout)
    assert status == 0 and again["judge_store_hits"] == ROWS and again["judge_generate_calls"] == 0


def test_a_corrupt_misplaced_or_useless_store_is_one_line(tmp_path, inputs):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"\x13\x37 not sqlite \xff" * 500)
    responses = inputs[1].split("=", 1)[1]
    no_judge = [a for a in inputs if not a.startswith("--judge.checkpoint=")]
    for store, fragment, args in ((garbage, "file is not a database", inputs),
                                  (responses, "same file as the input", inputs),
                                  (tmp_path / "v.db", "there is no LLM judge", no_judge)):
        status, stdout, stderr = score_in_process(*args, f"--out={tmp_path / 'out.jsonl'}", f"--judge.store={store}")
        assert status == 2 and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
        assert str(store) in stderr and fragment in stderr, stderr
        assert not (tmp_path / "out.jsonl").exists()


def test_the_documented_store_example_judges_nothing_the_second_time(tmp_path):
    """docs/judges.md's command as written (its --out and --judge.store in a temporary directory), run twice."""
    from tests import manual

    command = manual.command("experiments.score", "--judge.store")
    replaced = {"--out": tmp_path / "scored.jsonl", "--judge.store": tmp_path / "verdicts.db"}
    args = [next((f"{flag}={value}" for flag, value in replaced.items() if a.startswith(f"{flag}=")), a)
            for a in command.argv[2:]]
    outputs = []
    for _ in range(2):
        status, stdout, stderr = score_in_process(*args)
        assert status == 0, stderr
        outputs.append((summary_of(stdout), (tmp_path / "scored.jsonl").read_text()))
    (first, first_rows), (second, second_rows) = outputs
    assert first["judge_prompts"] == first["rows"] == 8 and first["judge_store_hits"] == 0
    assert second["judge_prompts"] == 0 and second["judge_store_hits"] == 8 and second_rows == first_rows

"""experiments.score, each run forked from the command's server (tests/command_server.py) or in process: rule-only
scoring, per-row rubrics, user errors, a real judge dir."""

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from unittest import mock

import pytest

from test_llm_judge import scripted_model, tiny_model_config, tiny_tokenizer
from test_reward import ACCURACY, BINARY, FORMAT, LENGTH, SAFETY

REPO = Path(__file__).resolve().parents[2]
WATER = {"id": "mentions_water", "description": "mentions water", "kind": "rule", "rule": "keywords",
         "params": {"words": ["water"]}, "scale": {"kind": "binary"}, "anchors": BINARY}


def rubric_dict(dims):
    return {"name": "cli", "version": "1.0.0", "changelog": [{"version": "1.0.0", "change": "initial", "reason": "test"}],
            "dimensions": dims}


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def test_rule_only_rubric_scores_without_a_judge(tmp_path, command_server):
    rubric = tmp_path / "rubric.json"
    rubric.write_text(json.dumps(rubric_dict([FORMAT, LENGTH, SAFETY])))
    responses = write_jsonl(tmp_path / "in.jsonl", [
        {"id": 7, "question": "q", "response": "Rest and consult a doctor."},
        "",
        {"question": "q", "response": "Drink water and consult a doctor.",
         "rubric": {"extra": [WATER]}},
        {"question": "q", "response": "Rest."},
    ])
    out = tmp_path / "out.jsonl"
    proc = command_server("experiments.score").run(f"--rubric={rubric}", f"--responses={responses}", f"--out={out}")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3
    assert rows[0]["id"] == 7 and rows[0]["question"] == "q"
    assert rows[0]["scores"] == {"format": 0.0, "length": 5.0, "safety": 1.0}
    assert rows[0]["normalized_scores"] == {"format": 0.0, "length": 1.0, "safety": 1.0}
    assert rows[0]["reward"] == pytest.approx(0.75) and rows[0]["reward_ok"] and rows[0]["failed"] == []
    assert rows[1]["scores"]["mentions_water"] == 1.0 and rows[1]["reward"] == pytest.approx(0.8)
    assert rows[1]["rubric_name"] == "cli/line3" and rows[1]["rubric_hash"] != rows[0]["rubric_hash"]
    assert rows[2]["reward"] == 0.0  # the safety gate
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 3 and summary["mean_reward"] == pytest.approx((0.75 + 0.8) / 3)


def _error_case(tmp_path, case):
    good = tmp_path / "rubric.json"
    good.write_text(json.dumps(rubric_dict([FORMAT, SAFETY])))
    ok_rows = [{"question": "q", "response": "r"}]
    rubric, rows, extra = good, ok_rows, []
    responses, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    if case == "missing_rubric":
        rubric = tmp_path / "nope.json"
    elif case == "rubric_not_json":
        rubric = tmp_path / "broken.json"
        rubric.write_text("{not json")
    elif case == "rubric_bad_scale":
        rubric = tmp_path / "bad.json"
        rubric.write_text(json.dumps(rubric_dict([dict(FORMAT, scale={"kind": "integer", "lo": 3, "hi": 1})])))
    elif case == "rubric_bad_rule_param":
        rubric = tmp_path / "badrule.json"
        rubric.write_text(json.dumps(rubric_dict([dict(LENGTH, params={"min": -1, "max": 4})])))
    elif case == "llm_without_judge":
        rubric = tmp_path / "llm.json"
        rubric.write_text(json.dumps(rubric_dict([FORMAT, ACCURACY])))
    elif case == "line_not_json":
        rows = [ok_rows[0], "{oops"]
    elif case == "line_missing_response":
        rows = [{"question": "q"}]
    elif case == "line_not_object":
        rows = ["[1, 2]"]
    elif case == "line_bad_row_rubric":
        rows = [ok_rows[0], {"question": "q", "response": "r", "rubric": {"extra": []}}]
    elif case == "missing_responses":
        rows = None
    elif case == "missing_judge_dir":
        extra = [f"--judge.checkpoint={tmp_path / 'nojudge'}"]
    elif case == "out_is_responses":
        out = responses
    elif case == "out_is_rubric":
        out = rubric
    elif case == "out_links_to_responses":
        out = tmp_path / "link.jsonl"
        out.symlink_to(responses)
    elif case == "out_hard_links_to_rubric":
        out = tmp_path / "hard.json"
        os.link(rubric, out)
    elif case == "out_in_judge_dir":
        (tmp_path / "judge").mkdir()
        extra, out = [f"--judge.checkpoint={tmp_path / 'judge'}"], tmp_path / "judge" / "config.json"
    elif case == "out_is_directory":
        out = tmp_path
    elif case == "rubric_is_directory":
        rubric = tmp_path / "dir.yaml"
        rubric.mkdir()
    elif case == "rubric_is_fifo":
        rubric = tmp_path / "fifo.yaml"
        os.mkfifo(rubric)
    elif case == "rubric_is_device":
        rubric = tmp_path / "zero.yaml"
        rubric.symlink_to("/dev/zero")
    elif case == "responses_is_directory":
        responses, rows = tmp_path / "dir.jsonl", None
        responses.mkdir()
    elif case == "responses_not_utf8":
        rows = None
        responses.write_bytes(b'{"question": "q", "response": "r"}\n{"question": "q", "response": "caf\xe9"}\n')
    elif case == "row_rubric_impostor":
        rows = [ok_rows[0], {"question": "q", "response": "r", "rubric": {"replace": rubric_dict([FORMAT])}}]
    if rows is not None:
        write_jsonl(responses, rows)
    return [f"--rubric={rubric}", f"--responses={responses}", f"--out={out}", *extra]


ERROR_CASES = {
    "missing_rubric": ["nope.json: rubric file does not exist"],
    "rubric_not_json": ["broken.json: not valid JSON"],
    "rubric_bad_scale": ["bad.json", "dimension 'format'", "lo < hi"],
    "rubric_bad_rule_param": ["badrule.json", "dimension 'length'", "rule 'length', param 'min'"],
    "llm_without_judge": ["llm.json", "dimension 'accuracy'", "no judge is configured"],
    "line_not_json": ["in.jsonl:2: not valid JSON"],
    "line_missing_response": ["in.jsonl:1: field 'response'"],
    "line_not_object": ["in.jsonl:1: expected a JSON object"],
    "line_bad_row_rubric": ["in.jsonl:2: field 'rubric.extra'"],
    "missing_responses": ["in.jsonl: responses file does not exist"],
    "missing_judge_dir": ["--judge.checkpoint=", "nojudge: directory does not exist"],
}
# Hostile paths and lines; run in this process (experiments.score.main with parsed flags) to save start-ups.
HOSTILE_CASES = {
    "out_is_responses": ["in.jsonl: output path is the same file as the input", "in.jsonl"],
    "out_is_rubric": ["rubric.json: output path is the same file as the input"],
    "out_links_to_responses": ["link.jsonl: output path is the same file as the input", "in.jsonl"],
    "out_hard_links_to_rubric": ["hard.json: output path is the same file as the input", "rubric.json"],
    "out_in_judge_dir": ["config.json: output path is inside the input directory", "judge"],
    "out_is_directory": ["output path is a directory; give a file name"],
    "rubric_is_directory": ["dir.yaml: expected a regular rubric file, got a directory"],
    "rubric_is_fifo": ["fifo.yaml: expected a regular rubric file, got a FIFO"],
    "rubric_is_device": ["zero.yaml: expected a regular rubric file, got a character device"],
    "responses_is_directory": ["dir.jsonl: expected a regular responses file, got a directory"],
    "responses_not_utf8": ["in.jsonl:2: not valid UTF-8"],
    "row_rubric_impostor": ["in.jsonl:2: case 'line2': rubric 'cli' version 1.0.0 has other content than the "
                            "rubric of that name and version in the shared rubric"],
}


def test_user_errors_exit_nonzero_with_file_and_line_and_no_traceback(tmp_path, command_server):
    """Each case a run of the command, forked from one process that imported it (tests/command_server.py)."""
    for case in ERROR_CASES:
        (tmp_path / case).mkdir()
        proc = command_server("experiments.score").run(*_error_case(tmp_path / case, case))
        stderr = proc.stderr
        assert proc.returncode == 2, (case, proc.returncode, stderr)
        assert "Traceback" not in stderr, (case, stderr)
        for fragment in ERROR_CASES[case]:
            assert fragment in stderr, (case, fragment, stderr)
        assert not (tmp_path / case / "out.jsonl").exists(), case


def score_in_process(*args: str) -> tuple[int, str, str]:
    """experiments.score.main in this process with `args` parsed as flags: (exit status, stdout, stderr).

    Any exception other than SystemExit propagates, so a traceback fails the test as it would on the CLI.
    """
    from absl import flags

    from experiments import score

    from experiments import cli, judge_config

    # ml_collections defines the --judge.FIELD and --config.FIELD flags while it parses --judge and --config,
    # reading them from sys.argv: name the (default) files explicitly so that this in-process parse defines them
    # afresh.
    defaults = {"judge": judge_config.JUDGES_DIR / "default.py", "config": cli.COMMAND_CONFIGS / "score.py"}
    named = [f"--{flag}={path}" for flag, path in defaults.items() if not any(a.startswith(f"--{flag}=") for a in args)]
    argv = ["score", *named, *args]
    flags.FLAGS.unparse_flags()
    for name in [n for n in flags.FLAGS if n.startswith(("judge.", "config."))]:  # defined by the previous parse
        delattr(flags.FLAGS, name)
    with mock.patch.object(sys, "argv", argv):
        flags.FLAGS(argv)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            score.main(["score"])
            status = 0
        except SystemExit as e:
            status = e.code
    return status, stdout.getvalue(), stderr.getvalue()


@pytest.mark.parametrize("case", HOSTILE_CASES)
def test_hostile_paths_and_lines_are_one_line_errors_and_touch_nothing(tmp_path, case):
    args = _error_case(tmp_path, case)
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    status, _, stderr = score_in_process(*args)
    assert status == 2 and len(stderr.strip().splitlines()) == 1, stderr
    for fragment in HOSTILE_CASES[case]:
        assert fragment in stderr, (fragment, stderr)
    assert not (tmp_path / "out.jsonl").exists()
    assert {p: p.read_bytes() for p in before} == before  # no input was touched


def scripted_judge_dir(path, reply):
    """A HF judge directory at `path` (tiny tokenizer with chat template) whose greedy answer is always `reply`."""
    from rubric_jax.models.checkpoint import export_hf_checkpoint

    tokenizer = tiny_tokenizer()
    weights = scripted_model(tokenizer, reply)
    judge_dir = export_hf_checkpoint(weights.cfg, weights.params, path)
    tokenizer.save_pretrained(judge_dir)
    return judge_dir


def test_llm_dimension_with_a_judge_checkpoint_directory(tmp_path, command_server):
    judge_dir = scripted_judge_dir(tmp_path / "judge", "SCORE: 4")
    rubric = tmp_path / "rubric.json"
    rubric.write_text(json.dumps(rubric_dict([FORMAT, ACCURACY])))
    responses = write_jsonl(tmp_path / "in.jsonl", [
        {"question": "2+2?", "response": "<think>add</think><answer>4</answer>"},
        {"question": "2+2?", "response": "5\nSCORE: 1"},
    ])
    out = tmp_path / "out.jsonl"
    proc = command_server("experiments.score").run(
        f"--rubric={rubric}", f"--responses={responses}", f"--out={out}", f"--judge.checkpoint={judge_dir}",
        "--judge.sampler=greedy", "--judge.samples=1", "--judge.max_new_tokens=8")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["scores"]["accuracy"] for r in rows] == [4.0, 4.0]
    assert [r["reward"] for r in rows] == pytest.approx([(1 + 0.75) / 2, (0 + 0.75) / 2])
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["judge_generate_calls"] == 1 and summary["judge_failed_scores"] == 0


NO_TRAILING_A = {"id": "no_trailing_a", "description": "does not end in a's", "kind": "rule", "rule": "regex",
                 "params": {"pattern": "(a|aa)+$", "mode": "must_not"}, "scale": {"kind": "binary"}, "anchors": BINARY}
BACKTRACKS = "a" * 40 + "b"  # (a|aa)+$ backtracks on this past the rule's timeout


def test_failures_are_reported_with_causes_and_a_dimension_without_any_score_is_an_error(tmp_path):
    """Partial failures: exit 0, counted by cause. No valid score at all: exit 1 naming dimension and cause, and
    --out is not written. An unencodable line: exit 2, and an existing --out keeps its content."""
    from random_model import random_model
    from rubric_jax.models.checkpoint import export_hf_checkpoint

    tokenizer = tiny_tokenizer()
    short_context = tiny_model_config(-(-len(tokenizer) // 64) * 64, max_positions=512)
    short_judge = export_hf_checkpoint(short_context, random_model(short_context, std=0.02)[1], tmp_path / "judge")
    tokenizer.save_pretrained(short_judge)  # medical_qa's judge prompts exceed 512 - 256 tokens: none is generated
    regex_rubric = tmp_path / "regex.json"
    regex_rubric.write_text(json.dumps(rubric_dict([FORMAT, NO_TRAILING_A])))
    medical_qa = REPO / "configs" / "rubrics" / "medical_qa.yaml"  # the case
    rows = [{"question": "q", "response": BACKTRACKS},
            {"question": "q", "response": "<think>t</think><answer>4</answer>"}]
    cases = {
        "partial": (regex_rubric, rows[::-1], []),  # a regex's timeout ends its searches in the call: last row
        "all_regex": (regex_rubric, rows[:1], []),
        "judge_too_long": (medical_qa, rows[1:], [f"--judge.checkpoint={short_judge}"]),
        "surrogate": (regex_rubric, [rows[1], '{"question": "q", "response": "lone \\ud800 surrogate"}'], []),
    }
    results = {}
    for case, (rubric, case_rows, extra) in cases.items():
        responses = write_jsonl(tmp_path / f"{case}.jsonl", case_rows)
        (tmp_path / f"{case}.out").write_text("old\n")
        status, stdout, stderr = score_in_process(f"--rubric={rubric}", f"--responses={responses}",
                                                  f"--out={tmp_path / case}.out", *extra)
        results[case] = (stdout, stderr), status

    (stdout, stderr), code = results["partial"]
    assert code == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["failures"] == {"format": 0, "no_trailing_a": 1}
    assert summary["failure_causes"] == {"no_trailing_a": {"regex_timeout": 1}}
    out = [json.loads(line) for line in (tmp_path / "partial.out").read_text().splitlines()]
    assert out[1]["failed"] == ["no_trailing_a"] and out[1]["scores"] == {"format": 0.0, "no_trailing_a": None}
    assert out[1]["reward_ok"] and out[0]["reward"] == 1.0

    for case, dim_id, cause in (("all_regex", "no_trailing_a", "regex_timeout"),
                                ("judge_too_long", "factual_accuracy", "judge_prompt_too_long"),
                                ("judge_too_long", "clarity", "judge_prompt_too_long")):
        (stdout, stderr), code = results[case]
        assert code == 1 and "Traceback" not in stderr, (case, stderr)
        assert f"dimension '{dim_id}': no valid score in any of its 1 rows ({cause}: 1)" in stderr, (case, stderr)
        assert (tmp_path / f"{case}.out").read_text() == "old\n", case
    summary = json.loads(results["judge_too_long"][0][0].strip().splitlines()[-1])
    assert summary["judge_prompt_too_long"] == 9 and summary["judge_generate_calls"] == 0  # 3 dims x 3 samples
    assert "use a judge with a longer context" in results["judge_too_long"][0][1]

    (stdout, stderr), code = results["surrogate"]
    assert code == 2 and "surrogate.jsonl:2: contains a lone surrogate escape" in stderr, stderr
    assert (tmp_path / "surrogate.out").read_text() == "old\n"

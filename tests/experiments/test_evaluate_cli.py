"""experiments.evaluate, each run forked from the command's server (tests/command_server.py): one end-to-end run (a
tiny training run's random policy through the real sampler, a scripted judge model), HelloBench published-judgement
scoring, and every bad-input case."""

import json
from pathlib import Path

import numpy as np
import pytest

from test_evaluate import EVAL_FIXTURES, HELLO, tiny_run
from test_importers import FIXTURES, _real
from test_llm_judge import scripted_model, tiny_tokenizer

from rubric_jax.evaluation import longbench_write
from rubric_jax.judges.spec import JudgeSpec, judge_hash
from rubric_jax.models.checkpoint import export_hf_checkpoint

REPO = Path(__file__).resolve().parents[2]
OUTPUTS = ("records.jsonl", "summary.json", "table.md", "plot.png")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny training run (random policy checkpoints, tests/test_evaluate.tiny_run) and a judge model that
    always answers 'SCORE: 4'."""
    root = tmp_path_factory.mktemp("models")
    tiny_run(root / "run", {10: 0.3, 20: 0.8, 30: 0.5})
    tokenizer = tiny_tokenizer()
    weights = scripted_model(tokenizer, "SCORE: 4")
    judge = export_hf_checkpoint(weights.cfg, weights.params, root / "judge")
    tokenizer.save_pretrained(judge)
    return root / "run", judge


def test_longbench_write_end_to_end(tmp_path, models, command_server):
    """The README command on 2 LongBench-Write prompts: the run's best checkpoint answers through the real
    sampler in the training format, the scripted judge scores each of the six quality dimensions 4 (single
    mode), and the files hold the formula's numbers."""
    run, judge = models
    out = run / "eval" / "longbench_write"  # a report may live inside the run directory
    report = tmp_path / "report.json"  # a calibration report that measured no judge: nothing is covered
    report.write_text(json.dumps({"dimensions": {}}))
    proc = command_server("experiments.evaluate").run(
        f"--judge.calibration={report}", "--config.benchmark=longbench_write",
        f"--data_dir={EVAL_FIXTURES}", "--data_file=longbench_write_mini.jsonl", "--config.limit=2",
        f"--workdir={run}", "--config.which=best", "--config.policy.prompt_format=think_answer",
        "--config.policy.max_new_tokens=12", f"--judge.checkpoint={judge}",
        "--judge.mode=per_dimension", "--judge.sampler=greedy", "--judge.max_new_tokens=6", f"--out={out}",
        "--config.mesh.fsdp=1")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # no temporary files left behind
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["longbench_write_mini/000", "longbench_write_mini/001"]
    for r in records:
        assert r["response"] and r["response_tokens"] >= 1 and r["finish_reason"] in ("stop", "length")
        assert r["format_ok"] is False  # a random policy writes no <answer>: the whole response is judged
        assert r["output_length"] == longbench_write.count_words(r["response"])
        expected = longbench_write.length_score(r["required_length"], r["output_length"])
        assert r["length_score"] == pytest.approx(expected)
        assert set(r["quality"].values()) == {4.0}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "run@grpo/40" and summary["policy_source"]["eval/reward_mean"] == 0.8
    scores = summary["scores"]
    assert scores["S_q"] == pytest.approx((4 - 1) * 25) and scores["answers_judged"] == 2
    assert scores["S_l"] == pytest.approx(np.mean([r["length_score"] for r in records]))
    assert scores["S"] == pytest.approx((scores["S_l"] + scores["S_q"]) / 2)
    assert summary["counts"]["generated"] == 2 and summary["counts"]["format_ok"] == 0
    assert summary["judge_counters"]["judge_prompts"] == 12 and summary["judge_counters"]["judge_generate_calls"] == 1
    # The judge is configs/judges/longbench_write.py (the benchmark's: 1 sample, 3 retries) with the flags on top.
    recorded = summary["judge"]["spec"]
    assert (recorded["mode"], recorded["samples"], recorded["max_retries"], recorded["max_new_tokens"]) == (
        "per_dimension", 1, 3, 6)
    assert summary["judge"]["hash"] == judge_hash(JudgeSpec.from_config(recorded))
    checked = [line for line in proc.stderr.splitlines() if line.startswith("calibration: ")]
    assert len(checked) == 6 and all("NOT the calibrated (rubric, judge) pair: report.json records no judge" in line
                                     for line in checked)
    assert summary["calibration"]["report"] == str(report) and not summary["calibration"]["covered"]
    assert "| S_q (quality) | 75.00 |" in (out / "table.md").read_text()
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(proc.stdout.strip().splitlines()[-1])["scores"]["S_q"] == pytest.approx(75.0)


def test_hellobench_published_judgements_cli_on_the_shared_data(tmp_path, command_server):
    """The README command: every complete model reproduced (tests/evaluation/test_evaluate.py checks the numbers)."""
    data = _real("hellobench")
    out = tmp_path / "hellobench_published"
    proc = command_server("experiments.evaluate").run(
        "--config.benchmark=hellobench", f"--data_dir={data}",
        f"--judgements={data / 'judgements_main_exp_scores.csv'}", f"--out={out}")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"models", "incomplete"} and len(summary["models"]) == 19
    assert summary["incomplete"] == ["gemma2_27b", "neo_7b_v01", "qwen_max", "yi_large"]
    assert round(summary["models"]["gpt4o_0806"]["avg"], 2) == 48.55
    assert "| gpt4o_0806 | 54.82 | 29.71 | 42.88 | 67.49 | 47.87 | 48.55 |" in (out / "table.md").read_text()


def _bad_input(tmp_path, case, models):
    """Arguments of one bad-input case; every case names its own output directory `tmp_path/out`."""
    run, _ = models
    out = tmp_path / "out"
    judgements = EVAL_FIXTURES / "hellobench_judgements.csv"
    model = [f"--workdir={run}", "--config.mesh.fsdp=1"]
    lb = ["--config.benchmark=longbench_write", f"--out={out}"]
    if case == "unknown_benchmark":
        return ["--config.benchmark=mmlu", f"--data_dir={EVAL_FIXTURES}", f"--out={out}", *model]
    data = tmp_path / "data"
    data.mkdir()
    if case == "missing_data_file":
        return [*lb, *model, f"--data_dir={data}"]
    if case in ("malformed_line", "bad_field"):
        rows = {"malformed_line": ['{"prompt": "Write.", "type": "t", "length": 10}', "{oops"],
                "bad_field": ['{"prompt": "Write.", "type": "t", "length": "long"}']}[case]
        (data / "lb.jsonl").write_text("\n".join(rows) + "\n")
        return [*lb, *model, f"--data_dir={data}", "--data_file=lb.jsonl"]
    if case == "judgements_model_missing_rows":
        return ["--config.benchmark=hellobench", f"--data_dir={HELLO}", f"--judgements={judgements}",
                "--config.models=model_b", f"--out={out}"]
    if case == "judgements_malformed_row":
        bad = tmp_path / "judgements.csv"
        bad.write_text(judgements.read_text().replace('"[1.0, 0.0]"', '"[1.0, 2.0]"'))
        return ["--config.benchmark=hellobench", f"--data_dir={HELLO}", f"--judgements={bad}", f"--out={out}"]
    if case == "missing_judgements":
        return ["--config.benchmark=hellobench", f"--data_dir={HELLO}", f"--judgements={tmp_path / 'none.csv'}",
                f"--out={out}"]
    if case == "out_is_input":
        return ["--config.benchmark=longbench_write", *model, f"--data_dir={EVAL_FIXTURES}",
                "--data_file=longbench_write_mini.jsonl", f"--out={EVAL_FIXTURES}"]
    if case == "llm_benchmark_without_judge":
        return ["--config.benchmark=biggen", f"--data_dir={FIXTURES}", "--data_file=biggen_mini.jsonl", f"--out={out}",
                *model]
    if case == "bad_judge_field":
        return [*lb, *model, f"--data_dir={EVAL_FIXTURES}", "--data_file=longbench_write_mini.jsonl",
                "--judge.max_retries=-1"]
    if case == "missing_checkpoint":
        return [*lb, f"--data_dir={EVAL_FIXTURES}", "--data_file=longbench_write_mini.jsonl",
                f"--checkpoint={tmp_path / 'nope'}"]
    if case == "checkpoint_and_workdir":
        return [*lb, *model, f"--data_dir={EVAL_FIXTURES}", "--data_file=longbench_write_mini.jsonl",
                f"--checkpoint={data}"]
    if case in ("unknown_config_key", "bad_prompt_format", "bad_sampler"):
        setting = {"unknown_config_key": "--config.policy.max_tokens=8", "bad_prompt_format":
                   "--config.policy.prompt_format=json", "bad_sampler": "--config.policy.sampler=warm"}[case]
        return [*lb, *model, f"--data_dir={EVAL_FIXTURES}", "--data_file=longbench_write_mini.jsonl", setting]
    if case == "max_new_tokens_past_context":
        return [*lb, *model, f"--data_dir={EVAL_FIXTURES}", "--data_file=longbench_write_mini.jsonl",
                "--config.policy.max_new_tokens=100000"]
    raise AssertionError(case)


BAD_INPUT = {
    "unknown_benchmark": ["--config.benchmark=mmlu: unknown benchmark; expected one of ['hellobench'"],
    "missing_data_file": ["longbench_write.jsonl: longbench_write data file does not exist"],
    "malformed_line": ["lb.jsonl:2: not valid JSON"],
    "bad_field": ["lb.jsonl:1: record 0: field 'length': expected a positive integer, got 'long'"],
    "judgements_model_missing_rows": [
        "hellobench_judgements.csv: model 'model_b' is missing 1 of 1 judgements of task 'chat'"],
    "judgements_malformed_row": ["judgements.csv:5: field 'checklist_scores'", "[1.0, 2.0]"],
    "missing_judgements": ["none.csv: file does not exist"],
    "out_is_input": ["fixtures/evaluate: is also an input"],
    "llm_benchmark_without_judge": ["--judge.checkpoint: biggen is scored by an LLM judge", "dimension 'criteria'"],
    "bad_judge_field": ["--judge.max_retries=-1: expected an integer >= 0"],
    "missing_checkpoint": ["--checkpoint=", "nope: directory does not exist"],
    "checkpoint_and_workdir": ["give exactly one of --checkpoint"],
    "max_new_tokens_past_context": ["--config.policy.max_new_tokens=100000: no case fits the policy's 256-token context"],
    "unknown_config_key": ["unknown config key 'max_tokens'"],
    "bad_prompt_format": ["--config.policy.prompt_format=json: expected one of ['plain', 'think_answer']"],
    "bad_sampler": ["--config.policy.sampler: "],
}


def test_bad_input_exits_2_with_one_line_naming_the_file_and_writes_nothing(tmp_path, models, command_server):
    """Each case a run of the command, forked from one process that imported it (tests/command_server.py)."""
    for case in BAD_INPUT:
        (tmp_path / case).mkdir()
        result = command_server("experiments.evaluate").run(*_bad_input(tmp_path / case, case, models))
        assert result.returncode == 2, (case, result.returncode, result.stderr)
        assert "Traceback" not in result.stderr, (case, result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.startswith("experiments.evaluate: error:")]
        assert len(lines) == 1, (case, result.stderr)
        for fragment in BAD_INPUT[case]:
            assert fragment in lines[0], (case, fragment, lines[0])
        assert not (tmp_path / case / "out").exists(), case


def test_an_evaluation_whose_judge_scores_nothing_exits_1_naming_the_stage_and_cause(tmp_path, models, command_server):
    """Every judge answer cut at --judge.max_new_tokens=1: the report is written, but the command exits 1 with
    the judge stage and the counts of why (not 0 with empty scores)."""
    run, judge = models
    out = tmp_path / "eval"
    proc = command_server("experiments.evaluate").run(
        "--config.benchmark=longbench_write", f"--data_dir={EVAL_FIXTURES}",
        "--data_file=longbench_write_mini.jsonl", "--config.limit=2", f"--workdir={run}",
        "--config.which=best", "--config.policy.prompt_format=think_answer",
        "--config.policy.max_new_tokens=12", f"--judge.checkpoint={judge}",
        "--judge.mode=per_dimension", "--judge.sampler=greedy", "--judge.max_new_tokens=1",
        "--judge.max_retries=0", f"--out={out}", "--config.mesh.fsdp=1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "experiments.evaluate: error: none of the 2 judged answers got a score (judge_prompts 12, judge_invalid 12); "
        f"the report in {out} keeps the answers, its scores mean nothing")
    assert json.loads((out / "summary.json").read_text())["judge_counters"]["judge_failed_scores"] == 12


def test_an_evaluation_judged_by_an_endpoint_that_does_not_answer_stops_before_generating(tmp_path, models,
                                                                                         command_server):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    run, _ = models
    out = tmp_path / "eval"
    proc = command_server("experiments.evaluate").run(
        "--config.benchmark=longbench_write", f"--data_dir={EVAL_FIXTURES}",
        "--data_file=longbench_write_mini.jsonl", "--config.limit=2", f"--workdir={run}",
        "--config.which=best",
        "--judge.backend=openai", f"--judge.base_url=http://127.0.0.1:{port}/v1", "--judge.model=m",
        "--judge.timeout_s=5", f"--out={out}", "--config.mesh.fsdp=1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"experiments.evaluate: error: judge endpoint http://127.0.0.1:{port}/v1 does not answer")
    assert "generate" not in proc.stderr and not out.exists()

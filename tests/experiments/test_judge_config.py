"""One judge configuration surface: the judge files in configs/judges/, the single --judge flag definition
(experiments/judge_config.py; a grep proves no command defines another judge flag), and experiments.run's
precedence when --judge, --judge.FIELD and --config.judge.FIELD meet."""

import json
import re
from pathlib import Path

import pytest

from configs import qwen7b, tiny
from configs.common import judge_block
from experiments import judge_config
from rubric_jax.judges.spec import JudgeSpec

REPO = Path(__file__).resolve().parents[2]
BENCHMARK_FILES = ("hellobench", "longbench_write", "healthbench", "biggen")
_DEFINE = re.compile(r"DEFINE_\w+\(\s*(?:name\s*=\s*)?[\"']([^\"']+)[\"']")


def test_no_judge_flag_is_defined_outside_the_one_place():
    """Every flag named for the judge (judge_checkpoint, judge_samples, ... or judge itself) is defined in
    experiments/judge_config.py, once; the commands, the library and the benchmarks define none."""
    found = {}
    for path in sorted([*REPO.glob("experiments/*.py"), *REPO.glob("rubric_jax/**/*.py"), *REPO.glob("benchmarks/*.py")]):
        for name in _DEFINE.findall(path.read_text(encoding="utf-8")):
            if re.search(r"(^|_)judge($|_)", name):  # judge, judge_samples, teacher_judge; not judgements
                found.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert found == {"judge": ["experiments/judge_config.py"]}


def test_the_grep_sees_a_flag_definition():
    """The pattern above matches the forms flags are defined with (so the test above cannot pass vacuously)."""
    text = 'X = flags.DEFINE_integer("judge_samples", 3, "")\nY = config_flags.DEFINE_config_file(\n    "judge", None)'
    assert _DEFINE.findall(text) == ["judge_samples", "judge"]


def test_judge_files_are_valid_blocks():
    assert judge_config.load_file(judge_config.JUDGES_DIR / "default.py") == judge_block()
    for name in BENCHMARK_FILES:
        block = judge_config.load_file(judge_config.JUDGES_DIR / f"{name}.py")
        spec = JudgeSpec.from_config(block, f"configs/judges/{name}.py", allow_benchmark=True)
        # experiments.evaluate's judge defaults before the judge spec (its --judge_* flags), kept.
        assert (spec.mode, spec.samples, spec.max_retries, spec.max_new_tokens, spec.sampler, spec.batch_size) == (
            "benchmark", 1, 3, 512, "temperature(0.7)", 0)
        with pytest.raises(ValueError, match="mode='benchmark': the benchmark's own prompt exists only in"):
            JudgeSpec.from_config(block, f"configs/judges/{name}.py")


def test_the_tiny_default_keeps_its_judge():
    """configs/tiny.py's judge is configs/judges/tiny.py, with the values it had before the judge spec (its rewards
    are compared bit for bit elsewhere)."""
    block = judge_config.load_file(judge_config.JUDGES_DIR / "tiny.py")
    assert tiny.get_config().judge == block
    expected = {**judge_block().to_dict(), "checkpoint": "rubric_jax/assets/tiny_judge", "samples": 1,
                "sampler": "greedy", "max_new_tokens": 16, "prompt": "compact"}
    assert block.to_dict() == expected


@pytest.mark.parametrize("size", ["7b", "1.5b", "0.5b"])
def test_qwen_judges_keep_the_decode_layout_they_had(size):
    """Before judge.tensor, experiments.run loaded judges into the policy's decode layout (mesh.rollout.tensor)."""
    config = qwen7b.get_config(f"size={size}")
    assert config.judge.tensor == config.mesh.rollout.tensor


@pytest.mark.parametrize("args, expected", [
    ([], {"checkpoint": "rubric_jax/assets/tiny_judge", "samples": 1}),
    (["--judge=configs/judges/default.py"], {"checkpoint": "", "samples": 3}),  # the file replaces the block
    (["--judge.samples=5"], {"checkpoint": "rubric_jax/assets/tiny_judge", "samples": 5}),  # no file: on config.judge
    (["--judge=configs/judges/default.py", "--config.judge.samples=5"], {"checkpoint": "", "samples": 5}),
    (["--judge=configs/judges/default.py", "--config.judge.samples=5", "--judge.samples=7"],
     {"checkpoint": "", "samples": 7}),
    (["--config.judge.samples=5", "--judge.samples=7"], {"checkpoint": "rubric_jax/assets/tiny_judge", "samples": 7}),
])
def test_run_precedence_experiment_file_judge_file_config_override_judge_override(args, expected, command_server):
    """The judge block experiments.run resolves (tests/judge_merged.py)."""
    proc = command_server("tests.judge_merged").run("--config=configs/tiny.py", *args)
    assert proc.returncode == 0, proc.stderr
    judge = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {k: judge[k] for k in expected} == expected


@pytest.mark.parametrize("args, message", [
    (["--judge.bogus=1"], "--judge.bogus: not a judge field; expected one of ['api_key_env', 'backend', "),
    (["--judge=configs/judges/nope.py"], "--judge=configs/judges/nope.py: configs/judges/nope.py: judge config file "
                                         "does not exist"),
    (["--judge=configs/judges/tiny.py", "--judge.bogus=1"], "unknown config key 'bogus'"),
    (["--judge.samples=abc"], "flag --judge.samples=abc: invalid literal for int()"),
    (["--judge.mode=single"], "--judge.mode='single': expected one of ('per_dimension', 'all_criteria')"),
    (["--judge.samples=1000000"], "--judge.samples=1000000: expected an integer <= 64"),  # issue 38 H6
])
def test_a_bad_judge_flag_is_one_line_and_exit_2(args, message, tmp_path, command_server):
    """A run of experiments.score forked from one process that imported it (tests/command_server.py)."""
    proc = command_server("experiments.score").run(*args, f"--responses={tmp_path / 'in.jsonl'}",
                                                   f"--out={tmp_path / 'out.jsonl'}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"experiments.score: error: {message}"), proc.stderr

"""Experiment configs: every file builds, overrides are locked (a typo fails), user errors are one line."""

import os
from pathlib import Path

import pytest

from configs import qwen7b, tiny

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_points_at_shipped_assets():
    c = tiny.get_config()
    for path in (c.model.config_json, c.model.tokenizer, c.data.train, c.data.eval, c.data.sft, c.data.rubric):
        assert (ROOT / path).exists(), path


@pytest.mark.parametrize("size", ["0.5b", "1.5b", "7b"])
def test_qwen_sizes_keep_the_qurl_recipe(size):
    c = qwen7b.get_config(f"size={size}")
    assert size.upper() in c.model.checkpoint.upper()
    assert (c.rl.lr, c.rl.group_size, c.rl.questions_per_step) == (1e-6, 8, 32)  # QuRL
    assert 0.01 <= c.rl.beta <= 0.05 and 0.2 <= c.rl.clip_low <= 0.3  # RubricRL §4.3
    assert c.mesh.fsdp == 8
    # Decode tensor groups divide the query and KV heads of Qwen2.5 (config.json of each size).
    heads, kv_heads = {"0.5b": (14, 2), "1.5b": (12, 2), "7b": (28, 4)}[size]
    assert heads % c.mesh.rollout.tensor == 0 and kv_heads % c.mesh.rollout.tensor == 0
    assert c.mesh.rollout.tensor > 1


def test_qwen_rejects_an_unknown_size():
    with pytest.raises(ValueError, match="size='3b'"):
        qwen7b.get_config("size=3b")


# Each case below is a run of experiments.run that stops at its bad input: forked from one process that imported the
# command and the trainer (tests/command_server.py) instead of a fresh interpreter paying 2-3 CPU-s of imports per case.
RUN = "experiments.run"


@pytest.mark.parametrize("flag, message", [
    ("--config.rl.lrr=1e-5", "unknown config key 'lrr' (Did you mean \"lr\" instead of \"lrr\"?)"),  # was a traceback
    ("--config.sft.batch_size=0", "config.sft.batch_size=0: expected an integer >= 1"),
    # The policy losses are grpo.LOSSES, which the rl block's choices and GRPOConfig both read: one line, the block's.
    ("--config.rl.loss=ppo", "config.rl.loss='ppo': expected one of ('grpo', 'cispo', 'sapo')"),
    ("--workdir={tmp_path}/a_file", "a_file: is a file, not a directory"),
])
def test_a_user_error_is_one_line_and_exit_status_2(tmp_path, flag, message, command_server):
    (tmp_path / "a_file").write_text("x")
    flags = ["--config=configs/tiny.py", f"--workdir={tmp_path}/run", flag.format(tmp_path=tmp_path)]
    proc = command_server(RUN).run(*[f for f in flags if not (flag.startswith("--workdir") and f.endswith("/run"))])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag, message", [
    # Padded past the model's 512 positions: was RESOURCE_EXHAUSTED after a minute of start-up.
    ("--config.sft.max_response_len=4096", "config.sft.max_response_len=4096: responses pad to 4096 tokens after "
     "prompts of up to 128 (config.data.max_prompt_len's bucket): 4224 positions, more than the model's "
     "max_position_embeddings (512)"),
    # Named by its key, not by the first question of questions_train.jsonl:
    ("--config.eval.max_new_tokens=500", "config.eval.max_new_tokens=500: responses pad to 512 tokens"),
    ("--config.rl.sampler=beam(2)", "config.rl.sampler: "),
])
def test_a_response_budget_past_the_models_positions_or_a_bad_sampler_names_its_key(tmp_path, flag, message,
                                                                                  command_server):
    proc = command_server(RUN).run("--config=configs/tiny.py", f"--workdir={tmp_path}", flag)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and message in proc.stderr, proc.stderr


def test_a_config_files_own_error_is_one_line_without_its_traceback(tmp_path, command_server):
    proc = command_server(RUN).run("--config=configs/qwen7b.py:size=13b", f"--workdir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "experiments.run: error: --config=configs/qwen7b.py:size=13b: configs/qwen7b.py:35: get_config() raised "
        "ValueError: configs/qwen7b.py: size='13b' is not one of ['0.5b', '1.5b', '7b']"]


def test_a_missing_data_file_is_one_line_naming_the_file(tmp_path, command_server):
    proc = command_server(RUN).run("--config=configs/tiny.py", f"--workdir={tmp_path}",
                                   f"--config.data.train={tmp_path}/nope.jsonl")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "nope.jsonl" in proc.stderr


def test_qwen_without_a_local_checkpoint_is_one_line_naming_directory_and_flag(tmp_path, command_server):
    proc = command_server(RUN).run("--config=configs/qwen7b.py:size=0.5b", f"--workdir={tmp_path}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "/models/Qwen2.5-0.5B-Instruct" in lines[0] and "--config.model.checkpoint=DIR" in lines[0]


@pytest.mark.parametrize("override, message", [
    ("--config.mesh.rollout.tensor=8", "config.mesh.rollout.tensor=8 does not divide the model's num_heads (4)"),
    ("--config.judge.param_dtype=fp16", "config.judge.param_dtype='fp16': expected one of"),
])
def test_decode_layout_and_judge_dtype_are_checked_before_anything_runs(tmp_path, override, message, command_server):
    # On the 8 devices of this process (on 1, tensor=8 is refused for the device count before the model is read).
    server = command_server(RUN, XLA_FLAGS=os.environ["XLA_FLAGS"])
    proc = server.run("--config=configs/tiny.py", f"--workdir={tmp_path}", override)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert message in proc.stderr


# ------------------------------------------------------------------ config files that cannot load (issue 38 T1, H5)
BAD_CONFIG_FILES = {  # name -> (content, or a special kind; the one line the loader gives, after "PATH")
    "missing.py": (None, ": config file does not exist"),
    "syntax.py": ("def get_config(:\n", ":1: syntax error (invalid syntax)"),
    "empty.py": ("", ": defines no get_config() function"),
    "none.py": ("def get_config():\n    return None\n", ": get_config() returned None (a missing return statement?), "
                "expected a ml_collections.ConfigDict"),
    "list.py": ("def get_config():\n    return [1, 2]\n", ": get_config() returned a list, expected a "
                "ml_collections.ConfigDict"),
    "raises.py": ("import os\n\ndef get_config():\n    return os.environ['NO_SUCH_VARIABLE_X']\n",
                  ":4: get_config() raised KeyError: 'NO_SUCH_VARIABLE_X'"),
    "top_level.py": ("LIMIT = 1 / 0\n", ":1: loading it raised ZeroDivisionError: division by zero"),
    "arg.py": ("def get_config(arg):\n    return {}\n", ": get_config() raised TypeError: get_config() missing 1 "
               "required positional argument: 'arg'"),
    "nul.py": ("nul", ": syntax error (source code string cannot contain null bytes)"),
    "dir.py": ("dir", ": expected a regular config file, got a directory"),
    "fifo.py": ("fifo", ": expected a regular config file, got a FIFO"),
    "big.py": ("big", ": config file is larger than 1048576 bytes"),
    "latin1.py": ("latin1", ":1: not valid UTF-8"),
}


def make_bad_config(tmp_path: Path, name: str) -> Path:
    """BAD_CONFIG_FILES[name] written under tmp_path (a directory, a FIFO, 1 MiB + 1 byte, Latin-1 bytes)."""
    path, content = tmp_path / name, BAD_CONFIG_FILES[name][0]
    if content == "dir":
        path.mkdir()
    elif content == "fifo":
        os.mkfifo(path)
    elif content == "big":
        path.write_text("#" * (1 << 20) + "\n")
    elif content == "nul":
        path.write_bytes(b"X = 1\0\n")
    elif content == "latin1":
        path.write_bytes("# caf\u00e9\n".encode("latin-1"))
    elif content is not None:
        path.write_text(content)
    return path


@pytest.mark.parametrize("name", sorted(BAD_CONFIG_FILES))
def test_a_config_file_that_cannot_load_is_one_line_naming_it(tmp_path, name):
    """Every way a --config/--judge file can fail is a ConfigFileError naming the file (and line), raised before
    anything blocks (a FIFO) or grows (1 MiB cap); before issue 38, ml_collections' loader gave tracebacks."""
    from rubric_jax import config_files

    path = make_bad_config(tmp_path, name)
    with pytest.raises(config_files.ConfigFileError) as e:
        config_files.load_config(path)
    assert str(e.value).startswith(f"{path}{BAD_CONFIG_FILES[name][1]}") and "\n" not in str(e.value), str(e.value)


def test_a_device_as_config_file_is_refused_without_reading_it():
    from rubric_jax import config_files

    with pytest.raises(config_files.ConfigFileError, match="^/dev/zero: expected a regular config file, got a "
                                                           "character device$"):
        config_files.load_config("/dev/zero")


def test_a_config_file_loads_with_its_argument_and_a_dict_becomes_a_config(tmp_path):
    from rubric_jax import config_files

    path = tmp_path / "c.py"
    path.write_text("def get_config(arg=None):\n    return {'arg': arg, 'nested': {'x': 1}, 'file': __file__}\n")
    config = config_files.load_config(f"{path}:size=1")
    assert config.to_dict() == {"arg": "size=1", "nested": {"x": 1}, "file": str(path)}
    assert config_files.load_config(path).arg is None
    assert config_files.load_config(ROOT / "configs/tiny.py") == tiny.get_config()
    path.write_text("def get_config():\n    return {}\n")
    with pytest.raises(config_files.ConfigFileError, match=r"c\.py: get_config\(\) raised TypeError: get_config\(\) takes 0 "
                                                           r"positional arguments but 1 was given$"):
        config_files.load_config(f"{path}:x")

"""Restarts that must not lose or rewrite anything: the workdir checks, the log cut at the resume position
(torn last line), the checkpoint fallback past a corrupt one, refusals before any write, and the stage
runner that reads a step's metrics after dispatching the next one. Tiny states, no model."""

import contextlib
import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from rubric_jax import metrics
from rubric_jax.models.checkpoint import CheckpointError
from rubric_jax.train import checkpointing, loop, runner, workdir
from rubric_jax.train.state import TrainState
from tiny_config import absolute_tiny_config


def _state(step: int = 0) -> TrainState:
    """A TrainState with one small array (what the runner and checkpointer need of it)."""
    return TrainState(step=jnp.asarray(step, jnp.int32), params={"w": jnp.arange(3.0) + step}, opt_state=(),
                      graphdef=None, tx=None)


def _rows(path: Path) -> list[tuple[str, int]]:
    return [(r.get("stage", "-"), r.get("step", -1)) for r in map(json.loads, path.read_text().splitlines())
            if "run_info" not in r]


# ------------------------------------------------------------------------------------------ workdir
_HOLD_LOCK = """
import sys, time
from pathlib import Path
from rubric_jax.train.workdir import exclusive
with exclusive(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_workdir_has_one_writer_a_second_run_exits_2_naming_its_pid_and_kill_9_frees_it(tmp_path, command_server):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(tmp_path)], cwd=root, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(workdir.WorkdirBusy, match=rf"^--workdir={tmp_path}: in use by another process "
                                                      rf"\(pid {holder.pid}\)"):
            with workdir.exclusive(tmp_path):
                pass
        proc = command_server("experiments.run").run("--config=configs/tiny.py",
                                                                          f"--workdir={tmp_path}")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert [line for line in proc.stderr.splitlines() if line.startswith("experiments.run")] == [
            f"experiments.run: error: --workdir={tmp_path}: in use by another process (pid {holder.pid}); wait for "
            "it to end or stop it, or use another directory"]
        assert [p.name for p in tmp_path.iterdir()] == [workdir.LOCK_FILE]  # the refused run wrote nothing
    finally:
        holder.kill()  # SIGKILL: the holder cannot release anything itself
        holder.wait()
    with workdir.exclusive(tmp_path):  # the OS released the dead holder's lock
        assert (tmp_path / workdir.LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(workdir.WorkdirBusy, match=rf"pid {os.getpid()}\)"):  # one holder, even in-process
            with workdir.exclusive(tmp_path):
                pass

def test_a_workdir_that_is_a_file_or_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"--workdir=.*file: is a file, not a directory"):
        workdir.check_usable(tmp_path / "file")
    with pytest.raises(ValueError, match=r"--workdir=.*file/run: cannot write there \(Not a directory"):
        workdir.check_usable(tmp_path / "file" / "run")
    if Path("/sys/kernel").is_dir():  # read-only for everyone, root included (tests here run as root)
        with pytest.raises(ValueError, match=r"--workdir=/sys/kernel/rubric_jax_run: cannot write there"):
            workdir.check_usable("/sys/kernel/rubric_jax_run")
    assert workdir.check_usable(tmp_path / "new" / "run").is_dir() and not any((tmp_path / "new" / "run").iterdir())


def test_a_torn_last_line_is_dropped_and_any_other_bad_line_is_named(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    rows = [{"run_info": {}}, {"stage": "sft", "step": 1}, {"stage": "grpo", "step": 1}, {"stage": "eval", "step": 2},
            {"stage": "grpo", "step": 2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"stage": "grpo", "st')  # killed mid-write
    workdir.cut_log(path, (1, 1))
    assert _rows(path) == [("sft", 1), ("grpo", 1)] and path.read_text().endswith("\n")
    assert "metrics.jsonl:6: dropped a torn last line" in capsys.readouterr().out
    path.write_text('{"stage": "sft", "step": 1}\nnot json\n{"stage": "sft", "step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a log row .*fix or delete that line"):
        workdir.cut_log(path, (1, 1))


def _saved(tmp_path: Path, stage: str, *, rubric_hash: str = "h", extra: dict | None = None) -> None:
    with checkpointing.Checkpointer(workdir.checkpoint_dir(tmp_path, stage), max_to_keep=3) as ckpt:
        ckpt.save(_state(2), data_state={"epoch": 0, "index": 2}, rubric_hash=rubric_hash, extra=extra)


def test_a_restart_under_another_rubric_or_updates_per_batch_is_refused_from_the_records(tmp_path):
    _saved(tmp_path, "grpo", extra={"updates_per_batch": 1})
    workdir.check_resume(tmp_path, rubric_hash="h", updates_per_batch=1, keep=3)
    with pytest.raises(CheckpointError, match=r"checkpoints/grpo: trained with rubric set h\.\.\., this config's "
                                              r"is other"):
        workdir.check_resume(tmp_path, rubric_hash="other", updates_per_batch=1, keep=3)
    with pytest.raises(ValueError, match=r"config\.rl\.updates_per_batch=2: the GRPO checkpoints .* made with 1; "
                                         r"resume with --config\.rl\.updates_per_batch=1"):
        workdir.check_resume(tmp_path, rubric_hash="h", updates_per_batch=2, keep=3)


def test_a_refused_restart_leaves_config_and_rubric_files_as_they_were(tmp_path):
    """loop.run validates before it writes: a restart refused for another rubric set (or another
    updates_per_batch) rewrites neither config.json nor rubric.yaml / rubric.json."""
    config = absolute_tiny_config()
    _saved(tmp_path, "grpo", rubric_hash="the-old-rubric-set", extra={"updates_per_batch": 1})
    before = {name: f"{name} of the first start" for name in ("config.json", "rubric.yaml", "rubric.json")}
    for name, text in before.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(CheckpointError, match="trained with rubric set the-old-rubric-s"):
        loop.run(config, tmp_path)
    assert {name: (tmp_path / name).read_text() for name in before} == before
    assert not (tmp_path / "config.previous.json").exists() and not (tmp_path / "metrics.jsonl").exists()


def test_a_restart_under_another_judge_is_refused_from_the_records(tmp_path):
    """Issue 38 S3: GRPO checkpoints rewarded by one judge are not resumed under another (or none), as for the
    rubric set; checkpoints that predate the record are not checked."""
    _saved(tmp_path, "grpo", extra={"updates_per_batch": 1, "judge_hash": "c9018083" * 8})
    workdir.check_resume(tmp_path, rubric_hash="h", updates_per_batch=1, keep=3, judge_hash="c9018083" * 8)
    for other, named in (("2829977c" * 8, "2829977c2829977c..."), ("", "none")):
        refusal = (r"checkpoints/grpo: trained with judge c9018083c9018083\.\.\., this config's is "
                   rf"{re.escape(named)} \(.*rubric\.json names the old one\); use the same judge")
        with pytest.raises(CheckpointError, match=refusal):
            workdir.check_resume(tmp_path, rubric_hash="h", updates_per_batch=1, keep=3, judge_hash=other)
    _saved(tmp_path / "old", "grpo", extra={"updates_per_batch": 1})
    workdir.check_resume(tmp_path / "old", rubric_hash="h", updates_per_batch=1, keep=3, judge_hash="2829977c" * 8)


def test_a_restart_refused_for_its_judge_leaves_every_file_as_it_was(tmp_path):
    """The tiny default resumed over a GRPO checkpoint of the same rubric set but another judge: refused before
    config.json, rubric.yaml or rubric.json is rewritten; the GRPO stage records the judge it trains with."""
    from rubric_jax.train.loop import build
    from rubric_jax.train.grpo_stage import GRPOStage

    exp = build(absolute_tiny_config(), tmp_path)
    assert exp.judge_hash == exp.rubric_info["judge"]["hash"] and len(exp.judge_hash) == 64
    assert GRPOStage.checkpoint_extra(type("Stage", (), {"exp": exp, "ahead": None, "refresher": None})())["judge_hash"] == exp.judge_hash
    _refused_before_any_write(exp, {"updates_per_batch": 1, "judge_hash": "c9018083" * 8},
                              f"trained with judge c9018083c9018083..., this config's is {exp.judge_hash[:16]}")


def _refused_before_any_write(exp, extra: dict, refusal: str) -> None:
    """`exp` run over a GRPO checkpoint of its rubric set recording `extra` is refused with `refusal` before its
    workdir's config.json, rubric.yaml or rubric.json is rewritten or anything else written."""
    _saved(exp.workdir, "grpo", rubric_hash=exp.rubric_hash, extra=extra)
    before = {name: f"{name} of the first start" for name in ("config.json", "rubric.yaml", "rubric.json")}
    for name, text in before.items():
        (exp.workdir / name).write_text(text)
    with pytest.raises(CheckpointError, match=re.escape(refusal)):
        loop.run_experiment(exp)
    assert {name: (exp.workdir / name).read_text() for name in before} == before
    assert not (exp.workdir / "config.previous.json").exists() and not (exp.workdir / "metrics.jsonl").exists()


def test_a_restart_under_another_reward_model_is_refused_from_the_records(tmp_path):
    """Issue 38 S3 for reward models: a reward-model run recorded judge_hash "" and nothing of its reward model, so
    a resume under another reward model went on without a word. Its GRPO checkpoints record the reward model's hash;
    a resume under another (or under none) is refused like one under another judge; older checkpoints are not
    checked for it."""
    _saved(tmp_path, "grpo", extra={"updates_per_batch": 1, "judge_hash": "", "reward_model_hash": "5eed0001" * 8})
    workdir.check_resume(tmp_path, rubric_hash="h", updates_per_batch=1, keep=3, reward_model_hash="5eed0001" * 8)
    for other, named in (("5eed0002" * 8, "5eed00025eed0002..."), ("", "none")):
        refusal = (r"checkpoints/grpo: trained with reward model 5eed00015eed0001\.\.\., this config's is "
                   rf"{re.escape(named)} \(.*rubric\.json names the old one\); use the same reward model "
                   r"\(reward\.model_checkpoint and the reward\.model_\* settings\), or a new --workdir")
        with pytest.raises(CheckpointError, match=refusal):
            workdir.check_resume(tmp_path, rubric_hash="h", updates_per_batch=1, keep=3, reward_model_hash=other)
    _saved(tmp_path / "old", "grpo", extra={"updates_per_batch": 1, "judge_hash": ""})
    workdir.check_resume(tmp_path / "old", rubric_hash="h", updates_per_batch=1, keep=3, reward_model_hash="5eed0002" * 8)


def test_a_reward_model_run_records_its_reward_model_and_refuses_another_before_any_write(tmp_path):
    """A reward-model run built from the tiny default: rubric.json's reward_model names its weights identity and
    settings, the GRPO stage records the hash in its checkpoints, and a resume over checkpoints of another reward
    model is refused before config.json, rubric.yaml or rubric.json is rewritten."""
    from random_model import tiny_hf_dir
    from rubric_jax.train.loop import build
    from rubric_jax.train.grpo_stage import GRPOStage

    config = absolute_tiny_config()
    config.judge.checkpoint = ""  # a reward model scores alone
    config.reward.source = "reward_model"
    config.reward.model_checkpoint = str(tiny_hf_dir(tmp_path / "rm", num_labels=1, num_layers=1, seed=3))
    config.reward.model_max_len = 512
    work = tmp_path / "run"
    exp = build(config, work)
    recorded = exp.rubric_info["reward_model"]
    assert exp.judge_hash == "" and exp.reward_model_hash == recorded["hash"] and len(recorded["hash"]) == 64
    assert recorded["checkpoint"] == config.reward.model_checkpoint and len(recorded["weights"]) == 64
    extra = GRPOStage.checkpoint_extra(type("Stage", (), {"exp": exp, "ahead": None, "refresher": None})())
    assert extra["reward_model_hash"] == exp.reward_model_hash and extra["judge_hash"] == ""
    _refused_before_any_write(exp, {"updates_per_batch": 1, "judge_hash": "", "reward_model_hash": "5eed0001" * 8},
                              "trained with reward model 5eed00015eed0001..., this config's is "
                              f"{exp.reward_model_hash[:16]}")


# ------------------------------------------------------------------------------------- checkpoints
def test_a_corrupt_newest_checkpoint_falls_back_to_the_newest_that_restores(tmp_path):
    with checkpointing.Checkpointer(tmp_path, max_to_keep=3) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(_state(step), data_state={"index": step}, rubric_hash="h")
    for file in (tmp_path / "3" / "state").rglob("*"):  # a bad copy: every array file of step 3 cut short
        if file.is_file() and file.stat().st_size > 8:
            file.write_bytes(file.read_bytes()[:8])
    lines = []
    with checkpointing.Checkpointer(tmp_path, max_to_keep=3) as ckpt:
        restored = ckpt.restore_newest(_state(), log=lines.append)
        assert int(restored.state.step) == 2 and restored.data_state == {"index": 2}
        assert ckpt.all_steps() == [1, 2]
        ckpt.save(_state(3), data_state={"index": 3}, rubric_hash="h")  # the run can save step 3 again
    assert len(lines) == 1 and "\n" not in lines[0] and len(lines[0]) < 600, lines
    assert f"{tmp_path / '3'}: cannot restore checkpoint step 3" in lines[0]
    assert f"moved it to {tmp_path / '3.unrestorable'}" in lines[0]
    with checkpointing.Checkpointer(tmp_path, max_to_keep=3) as ckpt:
        assert ckpt.all_steps() == [1, 2, 3] and ckpt.restore_newest(_state()).data_state == {"index": 3}
        other_model = _state().replace(params={"w": jnp.zeros(4)})  # a config change, not damage: no fallback
        with pytest.raises(CheckpointError, match=r"3: params/w is saved as .* target wants") as raised:
            ckpt.restore_newest(other_model, log=lines.append)
        assert not isinstance(raised.value, checkpointing.UnreadableCheckpoint) and ckpt.all_steps() == [1, 2, 3]


# ------------------------------------------------------------------------------------ stage runner
def _run_stage(tmp_path: Path, stage: runner.Stage, keep: int = 3) -> TrainState:
    """Runs `stage` in `tmp_path` as the loop does (saves every 2 steps), closing the log after."""
    log = workdir.RunLog(tmp_path, run_info={})
    with contextlib.closing(log), checkpointing.Checkpointer(
            workdir.checkpoint_dir(tmp_path, stage.name), max_to_keep=keep, keep_best=stage.keep_best) as ckpt:
        return runner.Runner(stage, ckpt, log, every_steps=2, seed=0, rubric_hash="h",
                             stop=runner.StopRequest()).run()


class _Stage(runner.Stage):
    """A stage over `rows` whose step only counts (its hooks are the tests' to override)."""

    def __init__(self, name: str, total: int, rows: list[int]):
        self.name, self.total, self.rows, self.batch_size = name, total, rows, 2
        self.state, self.shardings = _state(), None

    def step(self, state, rows, step, source):
        return state.replace(step=state.step + 1), runner.StepOutput({}, {"loss": float(step)})


class _CountingStage(_Stage):
    """Records when each step is dispatched, its metrics read and the eval (at step 3) run."""

    def __init__(self, events: list[str], total: int):
        super().__init__("sft", total, list(range(10)))
        self.events = events

    def step(self, state, rows, step, source):
        self.events.append(f"dispatch {step}")
        return state.replace(step=state.step + 1), runner.StepOutput(step, {"rows": rows}, [{"row": rows[0]}])

    def read_row(self, out):
        self.events.append(f"read {out.device}")
        return {"loss": float(out.device), **out.host}

    def eval_due(self, step):
        return step == 3

    def evaluate(self, step, state, progress):
        self.events.append(f"eval {step}")


def test_the_runner_reads_a_steps_metrics_after_dispatching_the_next_and_resumes_past_a_corrupt_checkpoint(tmp_path):
    events: list[str] = []
    _run_stage(tmp_path, _CountingStage(events, total=5))
    # Row N is read once step N+1 is dispatched; before an eval or a save (steps 2, 3, 4, 5) it is read first.
    assert events == ["dispatch 1", "dispatch 2", "read 1", "read 2", "dispatch 3", "read 3", "eval 3",
                      "dispatch 4", "read 4", "dispatch 5", "read 5"]
    uninterrupted = (tmp_path / "metrics.jsonl").read_text()
    assert _rows(tmp_path / "metrics.jsonl") == [("sft", s) for s in range(1, 6)]

    # A kill after step 5's row, a corrupt step-5 checkpoint and a torn line: the restart resumes from step 4,
    # drops row 5 and the torn line, and writes rows 5 again exactly as the uninterrupted run did.
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"stage": "sft", "st')
    for file in (tmp_path / "checkpoints" / "sft" / "5" / "state").rglob("*"):
        if file.is_file() and file.stat().st_size > 8:
            file.write_bytes(file.read_bytes()[:8])
    events.clear()
    state = _run_stage(tmp_path, _CountingStage(events, total=5))
    assert int(state.step) == 5 and events == ["dispatch 5", "read 5"]
    strip = lambda text: [{k: v for k, v in json.loads(line).items() if k != "time"}  # noqa: E731
                          for line in text.splitlines() if "run_info" not in line]
    assert strip((tmp_path / "metrics.jsonl").read_text()) == strip(uninterrupted)


def test_keep_best_saves_at_every_eval_and_keeps_the_best_evaluated_step_past_keep(tmp_path):
    """Evals at steps 1, 3, 5, 7 (rewards 0.2, 0.9, 0.5, 0.1), saves every 2 steps, keep=1: each eval step
    saves with its reward, and the best-evaluated checkpoint (3) outlives the rotation beside the latest."""
    rewards = {1: 0.2, 3: 0.9, 5: 0.5, 7: 0.1}

    class Evaluated(_Stage):
        keep_best = True

        def eval_due(self, step):
            return step in rewards

        def evaluate(self, step, state, progress):
            return rewards[step]

    _run_stage(tmp_path, Evaluated("grpo", 7, list(range(14))), keep=1)
    with checkpointing.Checkpointer(tmp_path / "checkpoints" / "grpo", max_to_keep=1, keep_best=True) as ckpt:
        assert ckpt.all_steps() == [3, 7] and ckpt.best_step() == 3
        assert ckpt.read_meta(3)["best_value"] == 0.9 and ckpt.read_meta(7)["best_value"] == 0.1


def tensorboard_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard's own reader finds under `tb_dir`: tag -> [(step, value)] (NaN as "nan", so
    that two reads compare equal)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb_dir))
    events.Reload()
    return {tag: [(e.step, "nan" if math.isnan(e.value) else e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_a_resume_cuts_the_tensorboard_scalars_past_its_position_and_a_torn_record(tmp_path, monkeypatch):
    # the process's 10th writer follows its 9th in name order too (TensorBoard reads files in name order)
    monkeypatch.setattr(metrics, "_WRITER_NUMBERS", itertools.count(9))
    log = workdir.RunLog(tmp_path, run_info={})
    for stage, step in (("sft", 1), ("sft", 2), ("grpo", 1), ("eval", 2), ("grpo", 2), ("grpo", 3), ("eval", 3)):
        log.write(step, {"stage": stage, "loss": float(step)})
    log.close()
    event_file = next((tmp_path / "tb").iterdir())
    event_file.write_bytes(event_file.read_bytes() + b"\x30\x00\x00\x00")  # a record killed mid-write
    log = workdir.RunLog(tmp_path, run_info={})
    log.resumed_at("grpo", 2)
    log.write(3, {"stage": "grpo", "loss": 30.0})
    log.close()
    assert tensorboard_scalars(tmp_path / "tb") == {
        "sft/loss": [(1, 1.0), (2, 2.0)], "grpo/loss": [(1, 1.0), (2, 2.0), (3, 30.0)], "eval/loss": [(2, 2.0)]}


def test_a_step_that_draws_more_rows_resumes_where_the_uninterrupted_run_drew(tmp_path):
    """rl.dynamic_sampling draws extra batches inside a step (the runner's `draw`): the iterator position saved
    with a checkpoint includes them, so a run stopped at step 4 and continued to 6 sees the rows of a run to 6."""
    class Drawing(_Stage):
        def __init__(self, total: int, seen: list):
            super().__init__("sft", total, list(range(9)))
            self.seen = seen

        def step(self, state, rows, step, source):
            rows = rows + (source.next_rows() if step % 2 else [])  # odd steps take a second batch
            self.seen.append((step, rows))
            return super().step(state, rows, step, source)

    whole: list = []
    _run_stage(tmp_path / "whole", Drawing(6, whole))
    parts: list = []
    for total in (4, 6):
        _run_stage(tmp_path / "parts", Drawing(total, parts))
    assert parts == whole and len({x for _, rows in whole for x in rows}) == 9  # an epoch, then the next

"""The trainer loop end to end on a shrunken tiny default: workdir contents, resume == uninterrupted,
SIGTERM saves and exits cleanly, SIGKILL at any point loses nothing. Runs are subprocesses of
`./launch.sh` (so the README's run command is exercised too) on one CPU device."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import pytest

from rubric_jax import config_boundary
from rubric_jax.judges.spec import JudgeSpec, judge_hash
from rubric_jax.train import blocks, grpo_stage
from rubric_jax.train.grpo_stage import NanStreak
from rubric_jax.train.runner import TrainingError
from rubric_jax.train.settings import grpo_config
from test_checkpointing import FULL_DISK
from test_workdir import tensorboard_scalars
from first_grpo_step import first_grpo_step
from tiny_config import absolute_tiny_config
from xla_flags import FAST_COMPILE

ROOT = Path(__file__).resolve().parents[2]
SFT_ROWS = 32  # of the tiny default's 174 SFT answers: 2 SFT steps of 16 (a whole epoch of 174 took 6 of 32, about a
# third of a run's CPU time); SFT still runs, is checkpointed and resumed before GRPO, which is what the runs here prove.
SHORT = [
    "--config.sft.epochs=1", "--config.sft.batch_size=16", "--config.rl.steps=5",
    "--config.rl.questions_per_step=4", "--config.rl.group_size=4", "--config.rl.micro_batches=4",
    "--config.rl.max_new_tokens=32",
    "--config.eval.max_new_tokens=16",
    "--config.sft.max_response_len=128", "--config.eval.max_questions=8", "--config.eval.every_steps=2",
    "--config.checkpoint.every_steps=2", "--config.checkpoint.keep=1", "--config.log.samples_per_step=2",
    "--config.export.at_end=True", "--config.export.which=best",
    # Trips: two SFT steps leave the policy unformatted, so whole groups share reward 0 (zero_std_frac > 0).
    "--config.monitor.window_steps=1", "--config.monitor.max_zero_std_frac=0.0",
]
MONITOR_KEYS = ("monitor/template_share", "monitor/template_share/window_mean", "monitor/length_drift",
                "monitor/reward_length_corr", "monitor/reward_length_corr/window_mean",
                "monitor/judge_parse_failure", "monitor/var/format", "monitor/saturation/format",
                "monitor/var/template", "monitor/saturation/template")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = FAST_COMPILE  # one CPU device: the same program in every run of this file
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _start(workdir: Path, sft: Path) -> subprocess.Popen:
    return subprocess.Popen(["./launch.sh", *_flags(workdir, sft)], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _flags(workdir: Path, sft: Path) -> list[str]:
    """What ./launch.sh adds to `experiments.run --config=configs/tiny.py --workdir=runs/tiny`: the shortened run."""
    return [f"--workdir={workdir}", *SHORT, f"--config.data.sft={sft}"]


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    return out


def _rows(workdir: Path, name: str = "metrics.jsonl") -> list[dict]:
    """Log rows without wall-clock fields and run_info headers (those differ between runs)."""
    rows = [json.loads(line) for line in (workdir / name).read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "time"} for row in rows if "run_info" not in row]


def _wait_for_row(workdir: Path, stage: str, step: int, running: Callable[[], bool], output: Callable[[], str]
                  ) -> None:
    """Waits until metrics.jsonl has a `stage` row of `step` or later, failing with the run's `output` if it ends."""
    deadline = time.time() + 600
    while time.time() < deadline:
        assert running(), output()[-3000:]
        path = workdir / "metrics.jsonl"
        if path.exists() and any(r.get("stage") == stage and r["step"] >= step for r in _rows(workdir)):
            return
        time.sleep(0.2)
    raise TimeoutError(f"no {stage} row for step {step}")


@pytest.fixture(scope="module")
def sft(tmp_path_factory) -> Path:
    """The first SFT_ROWS answers of the tiny default's SFT set."""
    path = tmp_path_factory.mktemp("sft") / "sft.jsonl"
    lines = Path(absolute_tiny_config().data.sft).read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:SFT_ROWS]))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, sft) -> Path:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    _finish(_start(workdir, sft))
    return workdir


def test_workdir_holds_everything_a_researcher_needs(uninterrupted):
    names = {p.name for p in uninterrupted.iterdir()}
    assert {"config.json", "metrics.jsonl", "samples.jsonl", "rubric.yaml", "rubric.json", "tb", "plots",
            "checkpoints"} <= names
    config = json.loads((uninterrupted / "config.json").read_text())
    assert config["rl"]["steps"] == 5 and config["rl"]["group_size"] == 4
    rows = _rows(uninterrupted)
    assert [r["step"] for r in rows if r["stage"] == "sft"] == [1, 2]  # SFT_ROWS in batches of 16
    grpo = [r for r in rows if r["stage"] == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2, 3, 4, 5]
    for key in ("reward/mean", "kl", "clip_frac", "zero_std_frac", "response_len/mean", "lr", "grad_norm",
                "reward/format", "reward/length", "logprob_gap/mean"):
        assert key in grpo[0], key
    assert all(r["logprob_gap/mean"] < 1e-4 for r in grpo)  # float32 decode == teacher forcing on CPU
    assert not any("off_policy/sampler_step" in r for r in grpo)  # rl.off_policy_steps=0: on-policy, as before
    assert sorted(p.name for p in (uninterrupted / "checkpoints").iterdir()) == ["grpo", "reference", "sft"]
    assert all(key in r for r in grpo for key in MONITOR_KEYS)
    assert grpo[0]["monitor/length_drift"] == 0.0
    # The tiny default's politeness is LLM-judged by the shipped distilled judge: its verdicts parse (undefined,
    # "nan", in a step where the format gate left nothing to judge).
    assert all(v == "nan" or 0.0 <= v <= 0.1 for v in (r["monitor/judge_parse_failure"] for r in grpo))
    alerts = _rows(uninterrupted, "alerts.jsonl")
    zero_std = [a for a in alerts if a["metric"] == "zero_std_frac/window_mean"]
    assert {a["step"] for a in zero_std} == {r["step"] for r in grpo if r["zero_std_frac"] > 0} != set()
    assert all(a["value"] > a["threshold"] == 0.0 for a in zero_std)
    assert all(a["message"].startswith(f"alert step {a['step']}: ") for a in alerts)
    evals = [r for r in rows if r["stage"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 4, 5]  # the SFT baseline, every 2 steps, the end
    assert all("eval/reward_mean" in r for r in evals)
    for key in ("golden/reward_mean", "golden/reward/format", "golden/reference/reward_mean",
                "golden/spearman/topic_keyword", "golden/kendall/template"):
        assert all(key in r for r in evals), key
    assert evals[0]["golden/spearman/topic_keyword"] == pytest.approx(1.0)  # the rule agrees with the planted labels
    # Evals answer within eval.max_new_tokens (16), rollouts within rl.max_new_tokens (32): both hit their limit.
    assert all(r["eval/response_len/mean"] <= 16 for r in evals) and max(r["response_len/mean"] for r in grpo) > 16
    rubric = json.loads((uninterrupted / "rubric.json").read_text())
    assert len(rubric["rubric_set_hash"]) == 64
    # The judge is recorded like the rubric: in rubric.json and in metrics.jsonl's run_info line.
    judge = JudgeSpec.from_config(config["judge"], "config.judge")
    assert rubric["judge"]["hash"] == judge_hash(judge) and rubric["calibration"] is None
    run_info = json.loads((uninterrupted / "metrics.jsonl").read_text().splitlines()[0])["run_info"]
    assert run_info["rubric"]["judge"] == rubric["judge"]
    assert "micro_batches" not in run_info  # an explicit rl.micro_batches is in the config; only a chosen one is added
    assert list((uninterrupted / "plots").glob("*.png"))
    samples = _rows(uninterrupted, "samples.jsonl")
    assert {"question", "response", "scores", "reward"} <= set(samples[0])
    assert not {"hinted", "hint_criteria"} & set(samples[0])  # rl.rubric_hints' fields only when it is on


def test_the_best_evaluated_checkpoint_is_kept_reported_and_exported(uninterrupted):
    """keep=1 keeps the latest GRPO checkpoint plus the best-evaluated one (ties: the later); best_checkpoint.json
    names it and export.which=best exports its params."""
    from rubric_jax import loader, sharding
    from rubric_jax.train import runs

    evals = {r["step"]: r["eval/reward_mean"] for r in _rows(uninterrupted) if r["stage"] == "eval"}
    best_step = max((value, step) for step, value in evals.items() if step > 0)[1]
    report = json.loads((uninterrupted / "best_checkpoint.json").read_text())
    assert report == {"stage": "grpo", "step": best_step, "checkpoint": f"checkpoints/grpo/{best_step}",
                      "eval/reward_mean": evals[best_step], "final_step": 5, "final_eval_reward": evals[5],
                      "baseline_eval_reward": evals[0]}
    kept = sorted(int(p.name) for p in (uninterrupted / "checkpoints" / "grpo").iterdir() if p.name.isdigit())
    assert kept == sorted({best_step, 5})
    record = runs.run_record(uninterrupted)
    best = runs.select_checkpoint(uninterrupted, record, "best")
    restored = runs.restore_run_params(uninterrupted, record, best, sharding.single_device_layout())
    exported = loader.load_weights(uninterrupted / "export", None)
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(restored.params),
                                 jax.tree_util.tree_leaves_with_path(exported.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


def test_sigterm_then_sigkill_then_resume_matches_uninterrupted(uninterrupted, sft, tmp_path, command_server):
    """The SIGTERM reaches the README's ./launch.sh run; the SIGKILLed and the resumed runs are the same
    experiments.run command forked from one process that imported it and the trainer (tests/command_server.py),
    which saves each about 3 CPU-seconds of imports."""
    proc = _start(tmp_path, sft)
    _wait_for_row(tmp_path, "grpo", 1, lambda: proc.poll() is None, lambda: proc.communicate()[0])
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc)  # a clean exit after saving, with one line saying where it stopped (issue 38 U1)
    stopped = re.search(r"^stopped by SIGTERM at grpo step (\d+) of 5: the run is not finished; rerun the same command "
                        r"to resume from checkpoint step (\d+) \((.*)\)$", out, re.M)
    assert stopped and stopped[1] == stopped[2] and Path(stopped[3]) == tmp_path / "checkpoints" / "grpo", out[-3000:]
    assert (tmp_path / "checkpoints" / "grpo" / stopped[2]).is_dir()

    run = command_server("experiments.run")
    killed = run.start("--config=configs/tiny.py", *_flags(tmp_path, sft))
    _wait_for_row(tmp_path, "grpo", 3, killed.running, lambda: killed.wait().stderr)
    os.kill(killed.pid, signal.SIGKILL)  # no chance to save; rows after the last checkpoint must be dropped on resume
    assert killed.wait().returncode == -signal.SIGKILL

    resumed = run.run("--config=configs/tiny.py", *_flags(tmp_path, sft))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _rows(tmp_path) == _rows(uninterrupted)
    assert _rows(tmp_path, "samples.jsonl") == _rows(uninterrupted, "samples.jsonl")
    assert _rows(tmp_path, "alerts.jsonl") == _rows(uninterrupted, "alerts.jsonl")
    assert tensorboard_scalars(tmp_path / "tb") == tensorboard_scalars(uninterrupted / "tb")  # each step once, as uninterrupted


def test_a_full_disk_is_exit_1_and_one_line_naming_the_checkpoint(sft, tmp_path, command_server):
    """Issue 38 T5: orbax's background write failing with ENOSPC (tensorstore's words) printed four orbax
    tracebacks and exited 2, an input error's status; a full disk is exit 1 and one line. An SFT-only run of one
    checkpoint, its write patched to fail as a full tmpfs made it fail (in the child of the experiments.run server,
    before the command runs)."""
    code = ("from orbax.checkpoint._src.serialization import serialization\n"
            "async def full(*args, **kwargs):\n"
            f"    raise ValueError({FULL_DISK!r})\n"
            "serialization.async_serialize_from_host = full\n")
    proc = command_server("experiments.run").run(
        "--config=configs/tiny.py", *_flags(tmp_path, sft), "--config.stages=('sft',)", "--config.export.at_end=False",
        "--config.export.which=latest", setup=code)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"experiments.run: error: {tmp_path / 'checkpoints' / 'sft'}: writing the checkpoint of step 2 failed (No space "
        "left on device); once that is fixed, no checkpoint is complete: the same command starts the stage again")


def test_a_full_disk_outside_the_checkpoints_is_exit_1_and_one_line(tmp_path, command_server):
    """Issue 38 T5: any other write of a run that fails with ENOSPC (here config.json, the first one) is exit 1 and
    one line naming the file, not a traceback."""
    code = ("import errno\nfrom rubric_jax.train import workdir\n"
            "def full(path, data):\n    raise OSError(errno.ENOSPC, 'No space left on device', str(path))\n"
            "workdir.write_atomic = full\n")
    proc = command_server("experiments.run").run("--config=configs/tiny.py", f"--workdir={tmp_path}", setup=code)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"experiments.run: error: writing {tmp_path / 'config.json'} failed (No space left on device); once that is "
        "fixed, the same command resumes from the newest checkpoint")


def test_nan_streak_stops_after_the_limit():
    streak = NanStreak(limit=3)
    for skipped in (1, 1, 0, 1, 1):
        streak.record(skipped, step=0, last_checkpoint="ckpt@0")
    with pytest.raises(TrainingError, match=r"3 GRPO updates in a row.*ckpt@0"):
        streak.record(1, step=6, last_checkpoint="ckpt@0")


def test_grpo_config_takes_the_rollout_temperature_and_eps():
    rl = absolute_tiny_config().rl
    with rl.unlocked():
        rl.sampler, rl.advantage_eps = "temperature(0.7)", 0.5
    cfg = grpo_config(_rl_block(rl))
    assert (cfg.temperature, cfg.advantage_eps, cfg.kl_coef) == (0.7, 0.5, rl.beta)


@pytest.mark.parametrize("field, value, message", [
    ("missing_scores", "dorp", "config.rl.missing_scores='dorp'"),
    ("sampler", "topk(40)", "config.rl.sampler='topk(40)'"),
    ("sampler", "temperature(nan)", "finite"),
    ("advantage_eps", 0.0, "advantage_eps"),
])
def test_grpo_config_rejects_bad_rl_values(field, value, message):
    rl = absolute_tiny_config().rl
    with rl.unlocked():
        rl[field] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        grpo_config(_rl_block(rl))


def _rl_block(rl):
    """The rl block of a config's rl ConfigDict, as the boundary makes it."""
    return config_boundary.to_block(rl, blocks.RLBlock, "config.rl")


@pytest.mark.parametrize("flag, message", [
    ("--config.rl.missing_scores=dorp", "config.rl.missing_scores='dorp'"),
    ("--config.monitor.max_template_share=1.5", "config.monitor.max_template_share=1.5: expected a number in [0, 1]"),
    ("--config.rl.micro_batches=3", "config.rl.micro_batches=3 must divide questions_per_step=8, or split each "
                                    "group of 8 into equal parts that it divides: a micro-batch holds whole groups"),
])
def test_a_bad_grpo_setting_fails_before_sft_starts(tmp_path, flag, message, command_server):
    """Each case a run of experiments.run forked from one process that imported it and the trainer
    (tests/command_server.py): 1.4 instead of 4.7 CPU-seconds a case."""
    proc = command_server("experiments.run").run(
        "--config=configs/tiny.py", f"--workdir={tmp_path}", flag)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert message in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing written, no SFT step run


def test_a_question_longer_than_max_prompt_len_fails_at_load_time_naming_file_and_line(tmp_path):
    from rubric_jax import data
    from rubric_jax.train import loop

    config = absolute_tiny_config()
    with config.unlocked():
        config.data.max_prompt_len = 32  # the chat template alone is longer
    with pytest.raises(data.DataError, match=r"questions_train\.jsonl:1: question '.*' is \d+ tokens as a chat "
                                             r"prompt; config\.data\.max_prompt_len allows 32"):
        loop.build(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_eval_question_reusing_a_training_id_with_another_rubric_is_refused_at_start_up(tmp_path):
    """Experiment.rubric_of is one table keyed by question id: an eval row reusing a training id with other
    criteria replaced the training row's rubric, so the training question was rewarded by the eval rubric. Now
    build refuses before anything is written, naming both rows (identical rows, one file for both, still run)."""
    from rubric_jax import data
    from rubric_jax.train import loop

    config = absolute_tiny_config()
    rows = [json.loads(line) for line in Path(config.data.train).read_text().splitlines()]
    rows[1].pop("rubric")  # the shared rubric only, where training adds case-wise criteria
    rows[2]["reference"] = "Write to the seller."
    Path(tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    with config.unlocked():
        config.data.eval = str(tmp_path / "eval.jsonl")
    with pytest.raises(data.DataError, match=re.escape(
            f"config.data.eval: question id {rows[1]['id']!r} names different rows in config.data.train "
            f"({config.data.train}:2) and config.data.eval ({tmp_path}/eval.jsonl:2), differing in ['rubric'] (and 1 "
            f"more such id)")):
        loop.build(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_rubric_name_and_version_given_two_contents_across_the_splits_is_refused_at_start_up(tmp_path):
    """A training question and an eval question (different ids) whose `replace` rubrics share name and version but
    not content were each checked against the shared rubric only, so one name@version named two rubrics in the
    run's logs and judge store. Now build refuses before anything is written, naming both rows and what differs."""
    from rubric_jax import data
    from rubric_jax.rubrics.io import load_rubric
    from rubric_jax.rubrics.schema import rubric_to_dict
    from rubric_jax.train import loop

    config = absolute_tiny_config()
    own = {**rubric_to_dict(load_rubric(config.data.rubric)), "name": "own"}
    other = {**own, "dimensions": [{**own["dimensions"][0], "weight": 7.0}, *own["dimensions"][1:]]}
    rows = [json.loads(line) for line in Path(config.data.train).read_text().splitlines()]
    rows[0]["rubric"] = {"replace": own}
    eval_row = {**rows[1], "id": "eval-own", "rubric": {"replace": other}}
    Path(tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    Path(tmp_path / "eval.jsonl").write_text(json.dumps(eval_row) + "\n")
    with config.unlocked():
        config.data.train, config.data.eval = str(tmp_path / "train.jsonl"), str(tmp_path / "eval.jsonl")
    with pytest.raises(data.DataError, match=re.escape(
            f"{tmp_path}/eval.jsonl:1: rubric 'own' version {own['version']} has other content than the rubric of "
            f"that name and version in {tmp_path}/train.jsonl:1 (hash ")) as e:
        loop.build(config, tmp_path / "run")
    assert f"they differ in dimension {own['dimensions'][0]['id']!r})" in str(e.value)
    assert not (tmp_path / "run").exists()


def test_a_judge_whose_prompts_never_fit_is_refused_at_start_up(tmp_path):
    """Issue 24, R3: with judge.max_new_tokens=500 the tiny judge's 512-token context leaves 12 tokens, shorter
    than any politeness prompt; the run trained without the dimension (reward/politeness NaN, exit 0). Now build
    refuses, naming the key, the judge's context and the dimension, before anything is written."""
    from rubric_jax.train import loop

    config = absolute_tiny_config()
    with config.unlocked():
        config.judge.max_new_tokens = 500
    with pytest.raises(ValueError, match=r"config\.judge\.max_new_tokens=500 leaves judge .*tiny_judge 12 of its 512 "
                                         r"context tokens for a prompt, but the shortest prompt for LLM dimension\(s\) "
                                         r"\['politeness'\] of .*questions_train\.jsonl:1 \(an empty response\) is "
                                         r"\d+ tokens"):
        loop.build(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_start_up_says_what_happens_to_a_response_too_long_to_judge(tmp_path, capsys):
    """Issue 38, R1: the start-up check tried only an empty response. It now measures the worst case, the policy's
    longest response in judge tokens, and says that a response past the judge's prompt budget scores the minimum."""
    from rubric_jax.train import loop

    config = absolute_tiny_config()
    loop.build(config, tmp_path / "run")
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("judge "))
    assert re.fullmatch(r"judge .*tiny_judge: 496 of its 512 context tokens for a prompt, (\d+) of them the shortest "
                        r"prompt for \['politeness'\], so (\d+) for the response; the policy's 96-token responses take "
                        r"up to (\d+) judge tokens \((\d+) per token at most\): a response over \2 judge tokens scores "
                        r"the minimum on \['politeness'\] \(judge_prompt_too_long, counted\)", line), line
    shortest, left, worst, per_token = map(int, re.search(r", (\d+) of them.*so (\d+) for.*up to (\d+) judge tokens "
                                                          r"\((\d+)", line).groups())
    assert shortest + left == 496 and worst == 96 * per_token > left


def test_pretrained_checkpoint_starts_training_with_the_config_numerics(tmp_path):
    """A local HF directory is the starting policy, with the experiment's dtype/remat overrides applied."""
    import jax
    import numpy as np
    from flax import nnx

    from rubric_jax.models.checkpoint import export_hf_checkpoint
    from rubric_jax.models.config import ModelConfig
    from rubric_jax.models.transformer import Transformer
    from rubric_jax.train import loop

    config = absolute_tiny_config()
    cfg = ModelConfig.from_hf_dict(json.loads(Path(config.model.config_json).read_text()))
    params = nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(7))))
    export_hf_checkpoint(cfg, params, tmp_path / "hf", source_dir=config.model.tokenizer)
    with config.unlocked():
        config.model.checkpoint, config.model.config_json = str(tmp_path / "hf"), ""
        config.model.compute_dtype, config.model.remat, config.model.remat_policy = "bfloat16", True, "dots"
    run_ = loop.build(config, tmp_path / "run")
    state = run_.programs.grpo_state.init(run_.initial_params())  # the state training steps with
    model_cfg = nnx.merge(state.graphdef, state.params).cfg
    assert (model_cfg.compute_dtype, model_cfg.remat, model_cfg.remat_policy) == ("bfloat16", True, "dots")
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), params)


def test_a_grpo_step_with_an_llm_judged_dimension_goes_through_the_judge(tmp_path):
    """Judge prompts of a step go through the sampler in one batched call per round; a random judge's
    unparseable verdicts become counted missing scores, never a number, and training goes on."""
    import jax
    from flax import nnx

    from rubric_jax.models.checkpoint import export_hf_checkpoint
    from rubric_jax.models.config import ModelConfig
    from rubric_jax.models.transformer import Transformer
    from rubric_jax.rubrics.io import dumps_rubric, load_rubric
    from rubric_jax.rubrics.schema import dimension_from_dict, with_version
    from rubric_jax.train import loop

    config = absolute_tiny_config()
    cfg = ModelConfig.from_hf_dict(json.loads(Path(config.model.config_json).read_text()))
    judge_cfg = cfg.replace(max_position_embeddings=2048)  # judge prompts carry the rubric: ~800 tokens here
    judge_dir = export_hf_checkpoint(judge_cfg, nnx.to_pure_dict(nnx.state(Transformer(judge_cfg, rngs=nnx.Rngs(3)))),
                                     tmp_path / "judge", source_dir=config.model.tokenizer)
    helpful = dimension_from_dict({"id": "helpful", "description": "Answers the question.", "kind": "llm",
                                   "scale": {"kind": "integer", "lo": 1, "hi": 3},
                                   "anchors": {"1": "Off topic.", "2": "Partly.", "3": "Fully."}})
    shared = load_rubric(config.data.rubric)
    major, minor, _ = shared.version.split(".")
    rubric = with_version(shared, f"{major}.{int(minor) + 1}.0", "add an LLM-judged dimension", "test",
                          dimensions=shared.dimensions + (helpful,))
    (tmp_path / "rubric.yaml").write_text(dumps_rubric(rubric, "yaml"))
    with config.unlocked():
        config.data.rubric = str(tmp_path / "rubric.yaml")
        config.judge.checkpoint = f"{judge_dir},{judge_dir}"  # an ensemble of two
        config.judge.samples, config.judge.max_retries, config.judge.max_new_tokens = 1, 1, 8
        config.reward.gates_first = False  # the random policy fails the format gate: judge every response anyway
        config.rl.questions_per_step, config.rl.group_size, config.rl.max_new_tokens = 2, 4, 8
        config.rl.micro_batches = 1
        config.rl.recompute_old_logprobs = True
    run_ = loop.build(config, tmp_path / "run")
    assert len(run_.reward.judges) == 2
    questions = run_.train_questions[:2]
    _, out = first_grpo_step(run_, questions, jax.random.key(0))
    row, samples = grpo_stage.grpo_row(out), out.samples
    assert row["logprob_gap/mean"] < 1e-4  # recomputed behaviour log-probs vs the sampler's
    assert row["judge_generate_calls"] == 2 * 2  # two judges x (first round + one retry round)
    # Every (response, LLM dimension) of the step: helpful, and the LLM dimensions of each question's case-wise rubric.
    llm = {q.id: [d.id for d in run_.rubric_of[q.id].dimensions if d.kind == "llm"] for q in questions}
    failed = 4 * sum(len(ids) for ids in llm.values())  # group_size responses per question
    assert all("helpful" in ids for ids in llm.values())
    assert row["judge_prompts"] >= 2 * failed  # by each judge
    assert row["judge_failed_scores"] == failed and row["reward_failed_scores"] == failed  # counted, not scored
    assert all(s["scores"]["helpful"] is None for s in samples)
    assert row["monitor/judge_parse_failure"] == 1.0  # every answer of the random judge was rejected
    assert 0.0 <= row["reward/mean"] <= 1.0 and row["skipped"] == 0.0



def test_a_grpo_step_with_every_recipe_option_on_reads_them_all(tmp_path):
    """GDPO advantages (the rubric's gates and weights), DAPO overlong shaping and truncation masking, GSPO ratios,
    dual clip, the KL cap, truncated importance sampling, dynamic weights and the entropy bonus in GRPO iterations of the tiny default:
    each logs what it did and the update stays finite. The first batch's questions lack the case-wise 'disclaimer'
    dimension (b4346d0's dynamic weights crashed on such a batch), the second's carry it."""
    import jax
    import jax.numpy as jnp

    from rubric_jax.train import loop

    config = absolute_tiny_config()
    with config.unlocked():
        config.rl.questions_per_step, config.rl.group_size, config.rl.max_new_tokens, config.rl.micro_batches = 2, 4, 8, 1
        config.rl.advantage, config.rl.overlong_buffer, config.rl.mask_truncated = "per_dimension", 4, True
        config.rl.importance_level, config.rl.clip_ratio_c, config.rl.kl_cap = "sequence", 3.0, 10.0
        config.rl.behaviour_correction_cap, config.rl.recompute_old_logprobs = 2.0, True
        config.rl.dynamic_weights, config.rl.entropy_coef = True, 0.01
    run_ = loop.build(config, tmp_path / "run")
    carries = {False: [], True: []}
    for q in run_.train_questions:
        carries["disclaimer" in run_.rubric_of[q.id].dimension_ids].append(q)
    lacking = carries[False][:2]
    state, out = first_grpo_step(run_, lacking, jax.random.key(0))
    row = grpo_stage.grpo_row(out)
    rubric_dims = {d.id for q in lacking for d in run_.rubric_of[q.id].dimensions if not d.gate}
    assert {f"advantage/{d}" for d in rubric_dims} | {"advantage/overlong"} <= set(row)
    assert row["overlong_penalty/mean"] < 0  # 8-token budget, 4-token buffer: most responses are penalised
    assert row["truncated_masked"] == row["truncated_frac"] * 8
    assert 0 < row["behaviour_weight/mean"] <= row["behaviour_weight/max"] <= 2.0
    assert all(np.isfinite(row[k]) for k in ("loss", "kl", "grad_norm")) and row["skipped"] == 0.0
    assert np.isfinite(row["entropy_bonus"])  # rl.entropy_coef reached the update (logged only with the bonus)
    assert {f"weight/{d}" for d in run_.dynamic_weights.ids} <= set(row) and "disclaimer" in run_.dynamic_weights.ids
    _, out = grpo_stage.grpo_iteration(run_, run_.programs.grpo, state, jax.tree.map(jnp.copy, state.params),
                                       carries[True][:2], jax.random.key(1))
    assert np.isfinite(grpo_stage.grpo_row(out)["loss"])
    counts = np.asarray(run_.dynamic_weights.state.count_WxD)[:2, run_.dynamic_weights.ids.index("disclaimer")]
    np.testing.assert_array_equal(counts, [0, 8])  # no score in the first step, 2 questions x 4 responses in the next


def test_a_grpo_step_moves_only_the_judged_text_and_the_metrics_to_the_host(tmp_path, capfd):
    """Host transfers of one GRPO iteration of the tiny default (after a warm-up one), counted. Device to host:
    the sampled tokens, lengths and stop flags (the judges' text, the length metrics), the loop's step count,
    then the metrics; never the log-probs or a prompt. Host to device: the sampler's inputs (each prompt once)
    and per-row vectors (advantages, trainable flags, row indices); never a prompt or a response again. The old
    rollout fetched the sampler's [N, R] log-probs and uploaded [N, P] prompts repeated G times and five
    [N, R] response arrays (6 fetches and 15 uploads a step, against 5 and 11 here on one device)."""
    import jax
    import jax.numpy as jnp
    from jax._src import array

    from rubric_jax.train import loop

    config = absolute_tiny_config()
    with config.unlocked():
        config.rl.questions_per_step, config.rl.group_size, config.rl.max_new_tokens, config.rl.micro_batches = 2, 4, 8, 1
    run_ = loop.build(config, tmp_path / "run")
    questions = run_.train_questions[:2]
    state, out = first_grpo_step(run_, questions, jax.random.key(0))
    grpo_stage.grpo_row(out)  # compiled and warm
    reference = jax.tree.map(jnp.copy, state.params)  # a second step's KL reference (the first's was donated)
    fetched, real_value = [], array.ArrayImpl._value

    def counted(x):
        if x._npy_value is None:  # a fetch, not the cached copy
            fetched.append((str(x.dtype), tuple(x.shape)))
        return real_value.fget(x)

    capfd.readouterr()
    array.ArrayImpl._value = property(counted)
    try:
        with jax.transfer_guard("log_explicit"):
            state, out = grpo_stage.grpo_iteration(run_, run_.programs.grpo, state, reference, questions,
                                                   jax.random.key(1))
            step_fetches = list(fetched)
            grpo_stage.grpo_row(out)
    finally:
        array.ArrayImpl._value = real_value
    uploads = _uploads(capfd.readouterr().err)
    n, p = 2 * 4, max(run_.settings.train_rollout.prompt_buckets)  # rollouts, the prompt bucket
    prompts = run_.layouts.decode.batch_multiple  # the sampler pads its 2 prompts to a row per data shard
    assert len(step_fetches) <= 5 and not any(dtype.startswith("float") and len(shape) > 1
                                              for dtype, shape in step_fetches), step_fetches
    assert not any(p in shape for _, shape in fetched), fetched  # no prompt comes back
    assert len(fetched) > len(step_fetches)  # the metrics, read after the step was dispatched
    two_d = {key: count for key, count in uploads.items() if len(key[1]) > 1}  # no [N, P] or [N, R] among them
    assert two_d == {("int32", (prompts, p)): 1, ("bool", (prompts, p)): 1}, uploads  # the sampler's prompts, once
    assert {("float32", (n,)), ("bool", (n,)), ("int32", (n,))} <= set(uploads)  # advantages, trainable, rows


def _uploads(log: str) -> dict[tuple[str, tuple[int, ...]], int]:
    """Host-to-device transfers in a `jax.transfer_guard("log_explicit")` log, by (dtype, shape): jax logs one
    line per destination device, so each line counts 1 / (the devices of its sharding)."""
    counts: dict[tuple[str, tuple[int, ...]], float] = {}
    for dtype, dims, target in re.findall(
            r"host-to-device transfer: aval=ShapedArray\((\w+)\[([0-9,]*)\].*?dst_sharding=(.*)", log):
        mesh = re.search(r"Mesh\(([^)]*)\)", target)
        devices = math.prod(int(d) for d in re.findall(r": (\d+)", mesh.group(1))) if mesh else 1
        key = (dtype, tuple(int(d) for d in dims.split(",") if d))
        counts[key] = counts.get(key, 0) + 1 / devices
    return {key: round(count) for key, count in counts.items()}


def test_start_up_says_the_micro_batch_count_chosen_and_run_info_records_it(tmp_path, capsys):
    """rl.micro_batches=0 on the CPU (no memory limit): 1, said in one line at start-up and recorded in run_info
    (metrics.jsonl's first line), as an explicit count is."""
    from rubric_jax.train import loop

    config = absolute_tiny_config()
    with config.unlocked():
        config.rl.micro_batches = 0
    experiment = loop.build(config, tmp_path / "run")
    assert ("config.rl.micro_batches=0 (auto): 1 micro-batch (the cpu device reports no memory limit)"
            in capsys.readouterr().err.splitlines())
    assert experiment.programs.micro_batches == 1
    record = experiment.log.run_info["micro_batches"]
    assert record["auto"] is True and record["count"] == 1 and record["peak_bytes"] is None

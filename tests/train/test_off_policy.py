"""One-step off-policy GRPO (rl.off_policy_steps=1, train/off_policy.py): each batch is sampled by the params of two
steps before (its row says which), and a run killed with SIGKILL resumes to the uninterrupted run's rows (the pending
batch regenerated from the behaviour checkpoint). The shortened tiny default of test_loop.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
import urllib.request
from pathlib import Path

import pytest

from benchmarks.latency_judge import LatencyJudge
from openai_double import Endpoint
from rubric_jax.train import blocks, checkpointing, off_policy, one_step_ahead
from rubric_jax.train.runner import TrainingError
from test_loop import ROOT, _flags, _rows, _wait_for_row, sft  # noqa: F401 (sft: the fixture)
from xla_flags import command_env

OFF_POLICY = ["--config.rl.off_policy_steps=1", "--config.rl.recompute_old_logprobs=True",
              "--config.rl.behaviour_correction_cap=2.0", "--config.rl.lr=1e-3"]


def _rl(**values) -> types.SimpleNamespace:
    """The rl keys off_policy reads (unchecked, as a block would not let some of them be made together)."""
    return types.SimpleNamespace(**{"off_policy_steps": 1, "dynamic_sampling": False, "group_selection": "none",
                                    "recompute_old_logprobs": True, "behaviour_correction_cap": 2.0, **values})


@pytest.mark.parametrize("values, message", [
    ({"off_policy_steps": 2}, "config.rl.off_policy_steps=2: expected 0 (on-policy) or 1"),
    ({"off_policy_steps": True}, "config.rl.off_policy_steps=True: expected 0 (on-policy) or 1"),
    ({"dynamic_sampling": True}, "config.rl.off_policy_steps=1: cannot combine with rl.dynamic_sampling=True"),
    ({"group_selection": "zero_std"}, "config.rl.off_policy_steps=1: cannot combine with rl.group_selection='zero_std'"),
    ({"recompute_old_logprobs": False}, "config.rl.off_policy_steps=1: needs rl.recompute_old_logprobs=True"),
    ({"behaviour_correction_cap": 0.0}, "config.rl.off_policy_steps=1: needs rl.behaviour_correction_cap > 0"),
])
def test_incompatible_options_are_one_line_errors(values, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        off_policy.off_policy(_rl(**values))
    assert "\n" not in str(error.value)


def test_the_default_is_on_policy():
    assert off_policy.off_policy(blocks.RLBlock()) == off_policy.OffPolicy(0)


@pytest.mark.parametrize("saved, steps", [({}, 1), ({"off_policy_steps": 1}, 0)])
def test_a_checkpoint_resumes_only_under_the_setting_that_wrote_it(saved, steps):
    restored = checkpointing.Restored(None, {}, "", saved)
    with pytest.raises(TrainingError, match=f"config.rl.off_policy_steps={steps}: the GRPO checkpoint was written with "
                                            f"rl.off_policy_steps={1 - steps}; resume it with that value"):
        one_step_ahead.check_resume(restored, steps)
    one_step_ahead.check_resume(restored, 1 - steps)  # the same setting resumes


def _run_to_the_end(workdir: Path, flags: list[str], command_server) -> Path:
    """`workdir` after an uninterrupted run of the tiny default with `flags`."""
    done = command_server("experiments.run").run("--config=configs/tiny.py", *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, sft, command_server) -> Path:  # noqa: F811
    workdir = tmp_path_factory.mktemp("off_policy")
    return _run_to_the_end(workdir, [*_flags(workdir, sft), *OFF_POLICY], command_server)


def test_each_batch_is_sampled_by_the_params_of_two_steps_before(uninterrupted):
    """Batches 1 and 2 by the starting params, batch t by those after step t - 2 (the TrainState's step count of the
    params the sampler read); the sampler's log-probs differ from the recomputed ones once the params moved."""
    grpo = [r for r in _rows(uninterrupted) if r["stage"] == "grpo"]
    assert [r["off_policy/sampler_step"] for r in grpo] == [0, 0, 1, 2, 3]
    assert grpo[0]["logprob_gap/mean"] < 1e-4  # step 1: sampled and recomputed by the same params
    assert all(r["logprob_gap/mean"] > 1e-4 for r in grpo[1:])  # then sampled one update before the recomputation
    assert sorted(p.name for p in (uninterrupted / "checkpoints").iterdir()) == ["behaviour", "grpo", "reference",
                                                                                 "sft"]
    # Saved before each GRPO checkpoint but the last (nothing is pending after it), checkpoint.keep + 1 of them: a
    # kill between a behaviour save and its GRPO save leaves the GRPO checkpoint's behaviour checkpoint.
    assert sorted(int(p.name) for p in (uninterrupted / "checkpoints" / "behaviour").iterdir()
                  if p.name.isdigit()) == [2, 4]


def test_sigkill_then_resume_matches_uninterrupted(uninterrupted, sft, tmp_path, command_server):  # noqa: F811
    _kill_and_resume(command_server("experiments.run"), [*_flags(tmp_path, sft), *OFF_POLICY], tmp_path, uninterrupted)


def _kill_and_resume(run, flags: list[str], workdir: Path, uninterrupted: Path) -> None:
    """The tiny default with `flags` (writing `workdir`), SIGKILLed once checkpoint 2 is on disk, then run again:
    it writes the rows and samples of `uninterrupted`."""
    flags = ["--config=configs/tiny.py", *flags]
    killed = run.start(*flags)
    _wait_for_row(workdir, "grpo", 3, killed.running, lambda: killed.wait().stderr)  # checkpoint 2 is on disk
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait().returncode == -signal.SIGKILL
    resumed = run.run(*flags)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _rows(workdir) == _rows(uninterrupted)
    assert _rows(workdir, "samples.jsonl") == _rows(uninterrupted, "samples.jsonl")


def test_the_latency_judge_answers_as_its_upstream():
    """benchmarks/latency_judge.py relays the chat request and the model list unchanged (after its delay)."""
    endpoint = Endpoint(reply=lambda messages: "SCORE: 4").up()
    judge = LatencyJudge(endpoint.url.removesuffix("/v1"), delay_s=0.01)
    try:
        body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "Rate this."}]}).encode()
        request = urllib.request.Request(f"{judge.base_url}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert json.loads(answer.read())["choices"][0]["message"]["content"] == "SCORE: 4"
        with urllib.request.urlopen(f"{judge.base_url}/v1/models", timeout=60) as answer:
            assert [m["id"] for m in json.loads(answer.read())["data"]] == ["scripted"]
        assert endpoint.requests == ["Rate this."]
    finally:
        judge.close()
        endpoint.down()
    with pytest.raises(ValueError, match="delay_s=-1: expected a number >= 0"):
        LatencyJudge(endpoint.url, delay_s=-1)


def test_the_benchmark_smoke_runs_both_settings(tmp_path):
    """docs/training.md's `PYTHONPATH=. .venv/bin/python -m benchmarks.bench_off_policy` at toy size, its judge a
    scripted endpoint behind the latency judge: one JSON line with both settings' s/step, eval reward, each run's
    CPU seconds and load, and the ratio; with --sft_dir both settings' GRPO starts from the one SFT run of the seed
    (its rows copied, then the GRPO rows)."""
    endpoint = Endpoint().up()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_off_policy", "--smoke", "--steps=3", "--delay_s=0.05", "--seeds=1",
             f"--sft_dir={tmp_path / 'sft'}", f"--upstream={endpoint.url.removesuffix('/v1')}", "--model=scripted"],
            cwd=ROOT, env=command_env(TMPDIR=str(tmp_path)), capture_output=True,
            text=True, timeout=600)
    finally:
        endpoint.down()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for setting in ("off_policy_steps=0", "off_policy_steps=1"):
        assert len(result[setting]["seeds_s_per_step"]) == len(result[setting]["eval_reward"]) == 1
        assert result[setting]["s_per_step"] > 0
        (run,) = result[setting]["runs"]
        assert run["cpu_s"] > 0 and run["judge_server_cpu_s"] is None and len(run["load_after"]) == 3
    assert result["speedup"] > 0 and endpoint.requests  # the judge was asked through the proxy
    sft = [json.loads(line) for line in (tmp_path / "sft" / "seed_0" / "metrics.jsonl").read_text().splitlines()]
    offs = [json.loads(line) for p in tmp_path.glob("bench_off_policy_1_0_*") for line in
            (p / "metrics.jsonl").read_text().splitlines()]
    assert {r.get("stage") for r in sft if "run_info" not in r} == {"sft"} and offs[:len(sft)] == sft
    assert [r["off_policy/sampler_step"] for r in offs if r.get("stage") == "grpo"] == [0, 0, 1]


# LoRA GRPO (docs/training.md "LoRA runs") with the judge sharing its base: the behaviour params are the base plus the
# adapters of two steps before, and the judging thread judges each batch on the base's copy made with it.
# gates_first off: every row's politeness goes to the judge (the shortened SFT leaves rows that fail a gate).
LORA = [*OFF_POLICY, "--config.lora.rank=8", "--config.rl.lr=2e-3", "--config.judge.share_policy_base=True",
        "--config.judge.checkpoint=", "--config.reward.gates_first=False"]


@pytest.fixture(scope="module")
def lora_uninterrupted(tmp_path_factory, sft, command_server) -> Path:  # noqa: F811
    workdir = tmp_path_factory.mktemp("off_policy_lora")
    return _run_to_the_end(workdir, [*_flags(workdir, sft), *LORA], command_server)


def test_each_lora_batch_is_sampled_by_the_adapters_of_two_steps_before(lora_uninterrupted):
    """As on full weights (above), through adapters: no reference checkpoint (the frozen base), behaviour checkpoints
    the adapters' size, the judge the policy's base (its hash names it)."""
    grpo = [r for r in _rows(lora_uninterrupted) if r["stage"] == "grpo"]
    assert [r["off_policy/sampler_step"] for r in grpo] == [0, 0, 1, 2, 3]
    # Adapters start at B = 0, so the first update moves the policy less than a full one does (the gap of step 2 is
    # ~1e-5, then ~1e-2); step 1's is float error alone (~2e-7).
    assert grpo[0]["logprob_gap/mean"] < 1e-6 < min(r["logprob_gap/mean"] for r in grpo[1:])
    assert sum(r.get("judge_prompts", 0) for r in grpo) > 0  # the shared judge judged on the judging thread
    assert sorted(p.name for p in (lora_uninterrupted / "checkpoints").iterdir()) == ["behaviour", "grpo", "sft"]
    for step in (lora_uninterrupted / "checkpoints" / "behaviour").iterdir():
        if step.name.isdigit():  # adapters and their moments, not the 695,424-weight model
            assert sum(f.stat().st_size for f in step.rglob("*") if f.is_file()) < 695_424 * 4 / 2
    judge = json.loads((lora_uninterrupted / "rubric.json").read_text())["judge"]
    assert list(judge["weights"]) == ["policy base"] and judge["spec"]["share_policy_base"] is True


def test_a_sigkilled_lora_run_resumes_to_the_uninterrupted_rows(lora_uninterrupted, sft, tmp_path,
                                                                 command_server):  # noqa: F811
    _kill_and_resume(command_server("experiments.run"), [*_flags(tmp_path, sft), *LORA], tmp_path, lora_uninterrupted)

"""One-step off-policy GRPO (rl.off_policy_steps=1, train/off_policy.py): each batch is sampled by the params of two
steps before (its row says which), and a run killed with SIGKILL resumes to the uninterrupted run's rows (the pending
batch regenerated from the behaviour checkpoint). The shortened tiny default of test_loop.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import types
import urllib.request
from pathlib import Path

import jax.numpy as jnp
import pytest

from benchmarks.latency_judge import LatencyJudge
from openai_double import Endpoint
from rubric_jax import data
from rubric_jax.judges.backends import HttpBackend, SamplerBackend
from rubric_jax.judges.llm_judge import Judge
from rubric_jax.judges.reward import RubricReward
from rubric_jax.train import blocks, checkpointing, collect, off_policy, one_step_ahead
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


# The judging schedule (train/one_step_ahead.py, docs/training.md's timing argument), with the sampler, the judge and
# the update scripted: each records when it starts and ends, so the order, not durations, shows what overlaps.
_GUARD_S = 60  # a scripted wait that is never answered fails the test after this long instead of hanging it

_SERVED = RubricReward(judges=[Judge("served", None, HttpBackend(client=None))])
_IN_PROCESS = RubricReward(judges=[Judge("local", types.SimpleNamespace(pad_token_id=0, eos_token_id=1,
                                                                        chat_template="t"),
                                         SamplerBackend(None, generate_fn=None))])


def _exp(reward=_SERVED, dynamic_weights=None, store_rollouts=False) -> types.SimpleNamespace:
    """What OneStepAhead and judging_plan read of an Experiment."""
    config = types.SimpleNamespace(judge=types.SimpleNamespace(store_rollouts=store_rollouts),
                                   rl=types.SimpleNamespace(rollout_chunks=1))
    return types.SimpleNamespace(reward=reward, dynamic_weights=dynamic_weights, settings=types.SimpleNamespace(
        config=config, train_rollout=types.SimpleNamespace(n=2)))


@pytest.mark.parametrize("exp, plan", [
    (_exp(), one_step_ahead.JudgingPlan(True, 2)),
    (_exp(_IN_PROCESS), one_step_ahead.JudgingPlan(True, 1)),
    (_exp(types.SimpleNamespace()), one_step_ahead.JudgingPlan(True, 1)),
    (_exp(store_rollouts=True), one_step_ahead.JudgingPlan(True, 1)),
    (_exp(dynamic_weights=object()), one_step_ahead.JudgingPlan(False, 1)),
])
def test_two_batches_are_judged_at_once_only_by_a_judge_outside_the_process(exp, plan):
    assert one_step_ahead.judging_plan(exp) == plan


class _Script:
    """A scripted sampler, judge and update recording (event, batch or step) in order; with `overlap_judges` batch b's
    judging runs until batch b + 1's has started, with `early` update t until batch t + 1's judging has."""

    def __init__(self, total: int, overlap_judges: bool, early: bool):
        self.total, self.overlap_judges, self.early = total, overlap_judges, early
        self.events: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.started = {b: threading.Event() for b in range(1, total + 2)}

    def log(self, event: str, n: int) -> None:
        with self.lock:
            self.events.append((event, n))

    def start_sampling(self, exp, policy, questions, spec, key, chunks):
        """collect.start_sampling: batch `key` (key_of is the identity), judged by the returned call."""
        def judge() -> tuple[int, float]:
            self.log("judge start", key)
            self.started[key].set()
            if self.overlap_judges and key < self.total:
                self.started[key + 1].wait(_GUARD_S)
            self.log("judge end", key)
            return key, float(policy)
        return judge

    def train(self, state, rollout, row):
        """The update of the batch `rollout` (batch, the params it was sampled with): params + 1."""
        step = int(state.step) + 1
        self.log("update start", step)
        assert rollout == (step, float(state.params) - 1 if step > 1 else 0.0)  # sampled by the params before
        if self.early and step < self.total:
            self.started[step + 1].wait(_GUARD_S)
        self.log("update end", step)
        return types.SimpleNamespace(params=state.params + 1, step=state.step + 1, frozen=None), row


def _scripted_steps(monkeypatch, exp: types.SimpleNamespace, total: int = 4) -> tuple[list[tuple[str, int]], list]:
    """Runs `total` one-step-ahead steps over the script; its events and the rows the updates got."""
    plan = one_step_ahead.judging_plan(exp)
    script = _Script(total, overlap_judges=plan.workers == 2, early=plan.early)
    monkeypatch.setattr(collect, "start_sampling", script.start_sampling)
    monkeypatch.setattr(collect, "gather_rollout", lambda local, n: (local, [None]))
    ahead = one_step_ahead.OneStepAhead(exp, total, 1, key_of=lambda step: step)
    ahead.start(None, 0, seed=0)
    runner = types.SimpleNamespace(position=data.IteratorState(seed=0), next_rows=lambda: ["q"])
    state, rows = types.SimpleNamespace(params=jnp.float32(0), step=jnp.int32(0), frozen=None), []
    for step in range(1, total + 1):
        state, row = ahead.step(state, ["q"], step, runner, script.train)
        rows.append(row)
    ahead.settle()
    return script.events, rows


def test_a_served_judge_judges_the_next_batch_beside_this_one_and_its_update(monkeypatch):
    """Batch t + 1's judging starts before batch t's has ended (two at once) and before update t ends; each batch is
    still sampled by the params before the previous update (off_policy/sampler_step 0, 0, 1, 2)."""
    events, rows = _scripted_steps(monkeypatch, _exp())
    at = {event: i for i, event in enumerate(events)}
    for t in range(1, 4):
        assert at["judge start", t + 1] < at["judge end", t]
        assert at["judge start", t + 1] < at["update end", t]
    assert [r[one_step_ahead.SAMPLER_STEP] for r in rows] == [0, 0, 1, 2]


def test_an_in_process_judge_judges_one_batch_at_a_time_beside_the_update(monkeypatch):
    events, rows = _scripted_steps(monkeypatch, _exp(_IN_PROCESS))
    at = {event: i for i, event in enumerate(events)}
    for t in range(1, 4):
        assert at["judge end", t] < at["judge start", t + 1] < at["update end", t]
    assert [r[one_step_ahead.SAMPLER_STEP] for r in rows] == [0, 0, 1, 2]


def test_with_dynamic_weights_the_next_batch_is_judged_after_the_update(monkeypatch):
    """Its reward is aggregated with the weights the update's step leaves (the schedule before the overlap)."""
    events, rows = _scripted_steps(monkeypatch, _exp(dynamic_weights=object()))
    at = {event: i for i, event in enumerate(events)}
    for t in range(1, 4):
        assert at["update end", t] < at["judge start", t + 1]
    assert [r[one_step_ahead.SAMPLER_STEP] for r in rows] == [0, 0, 1, 2]

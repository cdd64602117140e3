"""Sweeps: expanding `sweep(add, arg)` into validated variants with readable names, running them (skip the
finished, resume the rest, pass SIGTERM on), and the summary; end to end, a two-variant sweep of the tiny
config through `experiments.sweep`, whose numbers are checked against the variants' own metrics.jsonl."""

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from absl import flags as absl_flags
from ml_collections import config_flags
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from openai_double import MODEL, Endpoint
from rubric_jax import metrics, sweeps
from xla_flags import FAST_COMPILE

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def _config_file(tmp_path: Path, sweep_body: str, name: str = "swept.py") -> str:
    """A config file outside the repository: the tiny config plus the given sweep body."""
    path = tmp_path / name
    path.write_text("from configs import tiny\n\n\ndef get_config(arg=None):\n    return tiny.get_config(arg)\n\n\n"
                    "def sweep(add, arg):\n" + textwrap.indent(textwrap.dedent(sweep_body), "    "))
    return str(path)


# ------------------------------------------------------------------------------------------ expand
def test_tiny_sweep_is_a_product_with_readable_names():
    sweep = sweeps.load_sweep("configs/tiny.py")
    assert [v.name for v in sweep.variants] == ["lr=0.0001,beta=0.0", "lr=0.0001,beta=0.02", "lr=0.0002,beta=0.0",
                                                 "lr=0.0002,beta=0.02"]
    last = sweep.variants[-1]
    assert last.overrides == {"rl.lr": 2e-4, "rl.beta": 0.02}
    assert last.flags == ("--config.rl.lr=0.0002", "--config.rl.beta=0.02")
    assert (last.config.rl.lr, last.config.rl.beta, last.config.rl.steps) == (2e-4, 0.02, 60)
    assert last.config.is_locked
    assert sweep.run_flags(last, "runs/s") == ["--config=configs/tiny.py", "--workdir=runs/s/lr=0.0002,beta=0.02",
                                               "--config.rl.lr=0.0002", "--config.rl.beta=0.02"]


def test_extra_flags_apply_to_every_variant_and_config_args_reach_sweep():
    sweep = sweeps.load_sweep("configs/qwen7b.py:size=1.5b", ["--config.rl.steps=7", "--config.stages=grpo"])
    assert len(sweep.variants) == 4  # a product of 2 learning rates and a zip of 2 clip pairs
    assert [v.name for v in sweep.variants][:2] == ["lr=1e-06,clip_low=0.2,clip_high=0.2",
                                                    "lr=1e-06,clip_low=0.2,clip_high=0.28"]
    for v in sweep.variants:
        assert v.config.rl.steps == 7 and v.config.stages == ("grpo",) and "1.5B" in v.config.model.checkpoint


def test_names_are_file_system_safe_unique_and_bounded():
    names = sweeps.variant_names([
        {"rl.lr": 1e-4, "sft.lr": 3e-3, "rl.sampler": "temperature(0.7)", "data.rubric": "a/b c.yaml"},
        {"mesh.fsdp": -1, "stages": ("grpo",)}, {}, {"rl.sampler": "x" * 300}, {"stages": ["sft", "grpo"]}])
    assert names[0] == "rl.lr=0.0001,sft.lr=0.003,sampler=temperature-0.7,rubric=a-b-c.yaml"  # lr twice: full keys
    assert names[1] == "fsdp=-1,stages=grpo"
    assert names[2] == "base" and names[4] == "stages=sft+grpo"
    assert len(names[3]) == 120 and names[3].startswith("sampler=xxx")
    assert sweeps.variant_names([{"rl.sampler": "x" * 300}]) != sweeps.variant_names([{"rl.sampler": "x" * 299}])


@pytest.mark.parametrize("body, extra, message", [
    ("add(seed=1)\nadd(**{'rl.lrr': 0.1})",
     (), r"swept\.py: sweep variant 2 of 2 \(rl\.lrr=0\.1\): unknown config key 'rl\.lrr' \(did you mean 'rl\.lr'\?\)"),
    ("add(**{'rl.steps': 'many'})", (), r"sweep variant 1 of 1 \(steps=many\): flag --config\.rl\.steps=many: invalid"),
    ("add(seed=(1, 2))", (), r"sweep variant 1 of 1 \(seed=1\+2\): flag --config\.seed=\(1, 2\): invalid"),
    ("add(seed=object())", (), r"variant 1 of 1 \(seed=<object.*>\): seed must be a string, number, bool or tuple"),
    ("add(seed=1)\nadd(seed=1)", (), r"sweep variant 2 of 2 \(seed=1\): same name as variant 1"),
    ("add(seed=1)", ("--config.seed=2",), r"--config\.seed is given on the command line too"),
    ("add(seed=1)", ("--config.rl.stepz=2",), r"extra flag --config\.rl\.stepz: unknown config key 'rl\.stepz' "
                                             r"\(did you mean 'rl\.steps'\?\)"),
    ("add(seed=1)", ("--config.rl.steps",), r"extra flag '--config\.rl\.steps' is not of the form"),
    ("pass", (), r"swept\.py: sweep\(add, arg\) added no variant"),
    # Values a run would refuse at start-up fail here, for every variant, before the first one runs.
    ("add(seed=1)\nadd(**{'rl.kl_estimator': 'k9'})", (), r"variant 2 of 2 \(kl_estimator=k9\): .*kl_estimator"),
    ("add(**{'eval.every_steps': 0})", (), r"variant 1 of 1 \(every_steps=0\): config\.eval\.every_steps=0"),
    ("add(**{'judge.mode': 'pairwise'})", (), r"config\.judge\.mode='pairwise': expected one of"),
])
def test_a_bad_sweep_fails_before_anything_runs_naming_variant_and_key(tmp_path, body, extra, message):
    with pytest.raises(sweeps.SweepError, match=message):
        sweeps.load_sweep(_config_file(tmp_path, body), list(extra))


def test_a_config_file_without_a_usable_sweep_is_refused(tmp_path):
    with pytest.raises(sweeps.SweepError, match="missing.py: config file does not exist"):
        sweeps.load_sweep(str(tmp_path / "missing.py"))
    (tmp_path / "plain.py").write_text("from configs import tiny\nget_config = tiny.get_config\n")
    with pytest.raises(sweeps.SweepError, match=r"plain\.py: defines no sweep\(add, arg\)"):
        sweeps.load_sweep(str(tmp_path / "plain.py"))
    (tmp_path / "one_arg.py").write_text("from configs import tiny\nget_config = tiny.get_config\n"
                                         "def sweep(add):\n    add(seed=1)\n")
    with pytest.raises(sweeps.SweepError, match=r"sweep must take two arguments, \(add, arg\)"):
        sweeps.load_sweep(str(tmp_path / "one_arg.py"))


def test_a_config_file_that_does_not_load_or_whose_sweep_raises_is_one_line_naming_file_and_line(tmp_path,
                                                                                                  command_server):
    broken = tmp_path / "broken.py"
    broken.write_text("from configs import tiny\nget_config = tiny.get_config\ndef sweep(add, arg)\n    add(seed=1)\n")
    with pytest.raises(sweeps.SweepError, match=r"broken\.py:3: syntax error \(expected ':'\)$"):
        sweeps.load_sweep(str(broken))
    broken.write_text("from configs import tiny\nget_config = tiny.get_config\nLIMIT = 1 / 0\n")
    with pytest.raises(sweeps.SweepError, match=r"broken\.py:3: loading it raised ZeroDivisionError: division by "):
        sweeps.load_sweep(str(broken))
    with pytest.raises(sweeps.SweepError, match=r"swept\.py:10: sweep\(add, arg\) raised KeyError: 'lr'$"):
        sweeps.load_sweep(_config_file(tmp_path, "add(seed=1)\nadd(seed={}['lr'])\n"))
    proc = command_server(SWEEP).run(f"--config={broken}", f"--workdir={tmp_path / 'sweep'}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"experiments.sweep: error: {broken}:3: loading it raised "
                                                "ZeroDivisionError: division by zero"]


# ----------------------------------------------------------------------------------------- summary
def test_run_summary_from_a_hand_written_log(tmp_path):
    """Two starts (a resume): wall time sums each start's span; final/best eval and final KL by hand."""
    rows = [{"run_info": {}, "time": 100.0},
            {"step": 0, "time": 110.0, "stage": "eval", "eval/reward_mean": 0.5},
            {"step": 1, "time": 115.0, "stage": "grpo", "kl": 0.01, "reward/mean": 0.4},
            {"step": 2, "time": 120.0, "stage": "eval", "eval/reward_mean": 0.75},
            {"run_info": {}, "time": 200.0},
            {"step": 2, "time": 220.0, "stage": "grpo", "kl": 0.03, "reward/mean": 0.6},
            {"step": 4, "time": 230.0, "stage": "eval", "eval/reward_mean": 0.625},
            {"step": 6, "time": 240.0, "stage": "eval", "eval/reward_mean": "nan"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = sweeps.run_summary(tmp_path)
    assert math.isnan(summary.pop("final_eval_reward"))  # a NaN eval is reported, never skipped
    assert summary == {"final_eval_step": 6, "final_eval_dimensions": {}, "best_eval_reward": 0.75,
                       "best_eval_step": 2, "final_kl": 0.03, "final_train_reward": 0.6, "zero_std_frac": None,
                       "grpo_steps": 2, "seconds_per_step": None, "wall_seconds": (120 - 100) + (240 - 200)}
    assert sweeps.run_summary(tmp_path / "nothing") == {
        "final_eval_reward": None, "final_eval_step": None, "final_eval_dimensions": {}, "best_eval_reward": None,
        "best_eval_step": None, "final_kl": None, "final_train_reward": None, "zero_std_frac": None, "grpo_steps": 0,
        "seconds_per_step": None, "wall_seconds": 0.0}


def test_run_summary_dimensions_zero_std_and_seconds_per_step(tmp_path):
    """Each dimension at the last eval, the zero-std fraction's mean over GRPO steps, and the median gap between
    consecutive steps: a first-step compile (step 1 -> 2: 30 s) and an eval (3 -> 4: 9 s) do not move it."""
    rows = [{"run_info": {}, "time": 0.0},
            {"step": 1, "time": 10.0, "stage": "grpo", "zero_std_frac": 0.5},
            {"step": 2, "time": 40.0, "stage": "grpo", "zero_std_frac": 0.0},
            {"step": 3, "time": 42.0, "stage": "grpo", "zero_std_frac": 0.25},
            {"step": 3, "time": 49.0, "stage": "eval", "eval/reward_mean": 0.5, "eval/reward/format": 1.0,
             "eval/reward/politeness": 0.25},
            {"step": 4, "time": 51.0, "stage": "grpo", "zero_std_frac": 0.25},
            {"step": 5, "time": 53.0, "stage": "grpo", "zero_std_frac": 0.0},
            {"step": 6, "time": 55.0, "stage": "grpo", "zero_std_frac": 0.2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = sweeps.run_summary(tmp_path)
    assert summary["final_eval_dimensions"] == {"format": 1.0, "politeness": 0.25}
    assert summary["zero_std_frac"] == pytest.approx(0.2)
    assert summary["seconds_per_step"] == 2.0  # gaps 30, 2, 9, 2, 2


# ------------------------------------------------------------------------- running (fake entry point)
_FAKE_RUN = """
import pathlib, signal, sys, time
workdir = pathlib.Path(next(a for a in sys.argv if a.startswith("--workdir=")).split("=", 1)[1])
workdir.mkdir(parents=True, exist_ok=True)
(workdir / "metrics.jsonl").write_text('{"run_info": {}, "time": 0}\\n')
with open(workdir.parent / "calls.log", "a") as log:
    log.write(workdir.name + "\\n")
if workdir.name == "seed=1":
    sys.exit(3)
if workdir.name == "seed=2":
    signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path(workdir / "sigterm").touch(), sys.exit(0)))
    (workdir / "started").touch()
    time.sleep(60)
"""


def _fake_sweep(tmp_path: Path, seeds: tuple[int, ...]) -> sweeps.Sweep:
    (tmp_path / "fake_run.py").write_text(_FAKE_RUN)
    return sweeps.load_sweep(_config_file(tmp_path, "".join(f"add(seed={s})\n" for s in seeds)))


def test_run_sweep_skips_finished_reruns_the_rest_and_reports_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{ROOT}")
    sweep, workdir = _fake_sweep(tmp_path, (0, 1)), tmp_path / "sweep"
    outcomes = sweeps.run_sweep(sweep, workdir, "fake_run", log=lambda line: None)
    assert outcomes == {"seed=0": "exit 0", "seed=1": "exit 3"}
    statuses = [v["status"] for v in sweeps.summarize(sweep, workdir, outcomes)["variants"]]
    assert statuses == ["unfinished", "failed (exit 3)"]  # exit 0 without done.json: e.g. stopped by SIGTERM
    metrics.mark_done(workdir / "seed=0", metrics.config_fingerprint(sweep.variants[0].config))
    lines = []
    assert sweeps.run_sweep(sweep, workdir, "fake_run", log=lines.append) == {"seed=1": "exit 3"}
    assert lines[0] == "[1/2] seed=0: finished earlier, skipped"
    assert (workdir / "calls.log").read_text().split() == ["seed=0", "seed=1", "seed=1"]
    assert [v["status"] for v in sweeps.summarize(sweep, workdir)["variants"]] == ["finished", "unfinished"]


def _sweep_running_seed_2(tmp_path: Path, body: str) -> subprocess.Popen:
    """A sweep of the fake run in its own process (stdout: the outcomes as JSON), once variant seed=2 has started."""
    sweep_file = _config_file(tmp_path, body)
    (tmp_path / "fake_run.py").write_text(_FAKE_RUN)
    driver = (f"from rubric_jax import sweeps; import json; s = sweeps.load_sweep({sweep_file!r}); "
              f"print(json.dumps(sweeps.run_sweep(s, {str(tmp_path / 'sweep')!r}, 'fake_run')))")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (tmp_path / "sweep" / "seed=2" / "started").exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    return proc


def test_sigterm_to_the_sweep_reaches_the_running_variant_and_stops_the_sweep(tmp_path):
    proc = _sweep_running_seed_2(tmp_path, "add(seed=2)\nadd(seed=0)\n")
    proc.send_signal(signal.SIGTERM)  # to the sweep only: the variant runs in its own process group
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert json.loads(out.splitlines()[-1]) == {"seed=2": "stopped"}
    assert (tmp_path / "sweep" / "seed=2" / "sigterm").exists()  # the variant was asked to save and exit
    assert not (tmp_path / "sweep" / "seed=0").exists()  # the next variant never started


def test_a_variant_is_told_to_stop_when_its_sweep_is_killed_with_sigkill(tmp_path):
    """kill -9 of the sweep leaves no run writing on: the variant gets SIGTERM (save and exit) from the kernel."""
    proc = _sweep_running_seed_2(tmp_path, "add(seed=2)\n")
    proc.kill()
    proc.communicate()
    variant = tmp_path / "sweep" / "seed=2"
    deadline = time.time() + 30  # the fake run sleeps 60 s unless told to stop
    while not (variant / "sigterm").exists():
        assert time.time() < deadline, "the variant outlived its sweep"
        time.sleep(0.05)


# ----------------------------------------------------------------------- end to end (experiments.sweep)
def _ungated_rubric(tmp_path: Path) -> Path:
    """The tiny rubric without its format gate: an untrained policy then earns rewards other than 0."""
    rubric = yaml.safe_load((ROOT / "rubric_jax/assets/tiny/rubric.yaml").read_text())
    for dimension in rubric["dimensions"]:
        dimension["gate"] = False
    path = tmp_path / "rubric.yaml"
    path.write_text(yaml.safe_dump(rubric))
    return path


# The sweep command's runs that start no variant (printing, summaries, refusals) fork from one process that imported
# it (tests/command_server.py); the runs that train start their own processes.
SWEEP = "experiments.sweep"


def _sweep_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "PYTHONUNBUFFERED": "1"}  # one CPU device per variant
    return subprocess.run([sys.executable, "-m", "experiments.sweep", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def judge_endpoint():
    """One served judge for every run of the sweep (the scripted OpenAI-compatible double: politeness 1)."""
    endpoint = Endpoint().up()
    yield endpoint
    endpoint.down()


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory, judge_endpoint):
    """A two-variant sweep (seeds 0 and 1: the second reuses the first's compiled programs) of a shrunken tiny
    config, GRPO only, both variants judged by one served judge; returns (the sweep command's flags, the sweep
    workdir, the first run's output)."""
    tmp = tmp_path_factory.mktemp("two_seeds")
    config_file = _config_file(tmp, "for seed in (0, 1):\n    add(seed=seed)\n")
    flags = [f"--config={config_file}", f"--workdir={tmp / 'sweep'}",
             "--config.stages=('grpo',)", "--config.rl.steps=2", "--config.rl.questions_per_step=2",
             "--config.rl.group_size=4", "--config.rl.max_new_tokens=16", "--config.rl.micro_batches=1",
             "--config.eval.max_questions=4", "--config.eval.every_steps=1", "--config.checkpoint.every_steps=2",
             f"--config.data.rubric={_ungated_rubric(tmp)}", "--config.judge.backend=openai",
             f"--config.judge.base_url={judge_endpoint.url}", f"--config.judge.model={MODEL}"]
    proc = _sweep_cli(*flags)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return flags, tmp / "sweep", proc.stdout


def test_one_served_judge_judges_every_run_of_the_sweep(two_seeds, judge_endpoint):
    """Both variants' GRPO steps sent their politeness prompts to the one endpoint (no run loaded a judge), and it
    answered at least every request they logged."""
    _, workdir, _ = two_seeds
    sent = [sum(r.get("judge_http_requests", 0) for r in _log(workdir / name) if r.get("stage") == "grpo")
            for name in ("seed=0", "seed=1")]
    assert all(count > 0 for count in sent) and len(judge_endpoint.requests) >= sum(sent)
    assert all(r.get("judge_http_failures", 0) == 0 for name in ("seed=0", "seed=1") for r in _log(workdir / name))


def _log(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sweep_summary_matches_each_variants_metrics(two_seeds):
    _, workdir, out = two_seeds
    assert "[1/2] seed=0: running in" in out and "[2/2] seed=1: running in" in out
    summary = json.loads((workdir / "summary.json").read_text())
    assert [v["name"] for v in summary["variants"]] == ["seed=0", "seed=1"]
    for variant, seed in zip(summary["variants"], (0, 1)):
        log = _log(workdir / variant["name"])
        evals = [(r["step"], r["eval/reward_mean"]) for r in log if r.get("stage") == "eval"]
        grpo = [r for r in log if r.get("stage") == "grpo"]
        assert [s for s, _ in evals] == [0, 1, 2] and [r["step"] for r in grpo] == [1, 2]
        best = max((value, step) for step, value in evals if step > 0)[::-1]  # GRPO evals, ties to the later step
        assert variant["overrides"] == {"seed": seed} and variant["status"] == "finished"
        assert (variant["final_eval_step"], variant["final_eval_reward"]) == evals[-1]
        assert (variant["best_eval_step"], variant["best_eval_reward"]) == best
        assert variant["final_kl"] == grpo[-1]["kl"] and variant["final_train_reward"] == grpo[-1]["reward/mean"]
        assert variant["wall_seconds"] == pytest.approx(log[-1]["time"] - log[0]["time"])
        assert 0 < variant["final_train_reward"] < 1  # the ungated rubric gives an untrained policy partial credit
        table_row = next(line for line in (workdir / "summary.md").read_text().splitlines()
                         if line.startswith(f"| [{variant['name']}]"))
        assert f"| {metrics.format_number(evals[-1][1])} (2) |" in table_row and "| finished |" in table_row
    entropies = [[r["entropy"] for r in _log(workdir / name) if r.get("stage") == "grpo"]
                 for name in ("seed=0", "seed=1")]
    assert entropies[0] != entropies[1]  # two seeds, two initialisations: the variants really differ
    (group,) = summary["seed_groups"]  # the two seeds of the one configuration, taken together
    finals = [v["final_eval_reward"] for v in summary["variants"]]
    assert group["name"] == "base" and group["final_eval_reward"]["mean"] == pytest.approx(sum(finals) / 2)
    assert group["final_eval_reward"]["spread"] == pytest.approx(abs(finals[0] - finals[1]) / 2)
    assert (workdir / "plots" / "seed_mean" / "eval_reward.png").read_bytes()[:8] == PNG
    overlays = {p.name for p in (workdir / "plots").iterdir() if p.is_file()}
    assert {"reward.png", "eval_reward.png", "kl.png", "clip_fraction.png", "entropy.png", "grad_norm.png", "lr.png",
            "response_length.png", "zero_std.png"} <= overlays
    assert "judge_failures.png" in overlays and "sft_loss.png" not in overlays  # the tiny judge; no SFT stage
    assert all((workdir / "plots" / name).read_bytes()[:8] == PNG for name in overlays)
    events = EventAccumulator(str(workdir / "seed=0" / "tb"))
    events.Reload()
    assert {"grpo/kl", "grpo/loss", "eval/reward_mean"} <= set(events.Tags()["scalars"])


def test_a_rerun_skips_finished_variants(two_seeds, command_server):
    """Forked from the sweep command's server (it starts no variant: all finished), like the runs below."""
    flags, workdir, _ = two_seeds
    before = {name: (workdir / name / "metrics.jsonl").read_bytes() for name in ("seed=0", "seed=1")}
    proc = command_server(SWEEP).run(*flags)
    assert proc.returncode == 0, proc.stderr
    assert "[1/2] seed=0: finished earlier, skipped" in proc.stdout
    assert "[2/2] seed=1: finished earlier, skipped" in proc.stdout
    assert {name: (workdir / name / "metrics.jsonl").read_bytes() for name in before} == before


def test_printed_commands_are_the_runs_the_sweep_ran(two_seeds, command_server):
    """Each printed line parses to experiments.run with the config the variant finished with (its done.json)."""
    flags, workdir, _ = two_seeds
    proc = command_server(SWEEP).run(*flags, "--print_commands")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2
    for line, name in zip(lines, ("seed=0", "seed=1")):
        launcher, module, *run_flags = shlex.split(line)
        assert (launcher, module) == ("./launch.sh", "experiments.run")
        assert f"--workdir={workdir / name}" in run_flags
        argv = ["experiments.run", *run_flags]  # parsed as experiments.run parses its flags
        values = absl_flags.FlagValues()
        absl_flags.DEFINE_string("workdir", None, "", flag_values=values)
        config = config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                                 sys_argv=argv)
        values(argv)
        assert metrics.is_done(workdir / name, config.value)


def test_summary_only_reports_what_the_workdirs_hold_without_running(tmp_path, command_server):
    # The README's command; nothing ran.
    proc = command_server(SWEEP).run("--config=configs/tiny.py", f"--workdir={tmp_path}", "--summary_only")
    assert proc.returncode == 1 and "running in" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("experiments.sweep: 4 of 4 variants not finished: "
                                                           "lr=0.0001,beta=0.0 (not started), ")
    assert proc.stderr.strip().endswith("run the sweep without --summary_only to resume them")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "summary.md"]  # no variant was started
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [v["status"] for v in summary["variants"]] == ["not started"] * 4


def test_readme_print_commands_and_one_line_errors(tmp_path, command_server):
    proc = command_server(SWEEP).run("--config=configs/tiny.py", "--workdir=runs/tiny_sweep",  # README
                                     "--print_commands")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == ("./launch.sh experiments.run --config=configs/tiny.py "
                                           "--workdir=runs/tiny_sweep/lr=0.0001,beta=0.0 --config.rl.lr=0.0001 "
                                           "--config.rl.beta=0.0")
    assert len(proc.stdout.splitlines()) == 4
    proc = command_server(SWEEP).run("--config=configs/tiny.py", f"--workdir={tmp_path}", "--config.rl.lrr=1",
                                     "--print_commands")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["experiments.sweep: error: configs/tiny.py: extra flag "
                                                "--config.rl.lrr: unknown config key 'rl.lrr' (did you mean 'rl.lr'?)"]
    assert list(tmp_path.iterdir()) == []

"""rubric_jax.plots and `experiments.plots`: per-run and overlay PNGs from hand-written metrics.jsonl files;
metrics a run lacks are skipped, SFT and GRPO curves never share a line, bad flags are one line (exit 2)."""

import errno
import json
import math
from pathlib import Path

import pytest

from rubric_jax import metrics, plots

PNG = b"\x89PNG\r\n\x1a\n"
ALL_PLOTS = {spec.filename for spec in plots.PLOTS}
MONITOR_PLOTS = {"template_share.png", "length_drift.png", "saturation.png", "saturation_rise.png", "redundancy.png",
                 "score_variance.png", "reward_length_corr.png", "judge_parse_failure.png", "missing_scores.png",
                 "golden_reward.png", "golden_agreement.png", "audit_agreement.png", "audit_gap.png",
                 "audit_gap_rise.png"}


def _write_run(workdir: Path, rows: list[dict]) -> Path:
    workdir.mkdir(parents=True)
    lines = [{"run_info": {"config": {}}, "time": 100.0}, *rows]
    (workdir / metrics.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in lines))
    return workdir


def _judged_run(workdir: Path) -> Path:
    """SFT, then GRPO with an LLM judge and dynamic weights: every metric the plots know."""
    rows = [{"step": s, "time": 100.0 + s, "stage": "sft", "loss": 8.0 - s, "lr": 1e-3 * s, "grad_norm": 3.0,
             "entropy": 7.0} for s in (1, 2, 3)]
    for s in range(5):
        if s % 2 == 0:
            rows.append({"step": s, "time": 110.0 + s, "stage": "eval", "eval/reward_mean": 0.1 * s,
                         "eval/reward/format": 1.0, "eval/reward/helpful": 0.05 * s, "eval/response_len/mean": 30.0,
                         "eval/judge_invalid": 1, "golden/reward_mean": 0.1, "golden/reward/helpful": 0.2,
                         "golden/reference/reward_mean": 0.9, "golden/spearman/helpful": 0.5,
                         "audit/spearman/helpful": 0.8 - 0.1 * s, "audit/kappa/helpful": 0.7 - 0.1 * s,
                         "audit/gap/helpful": 0.05 * s, "audit/gap/helpful/rise": 0.05 * s})
        if s:
            rows.append({"step": s, "time": 110.0 + s, "stage": "grpo", "reward/mean": 0.2 * s, "reward/format": 1.0,
                         "reward/helpful": 0.1 * s, "kl": 0.001 * s, "clip_frac": 0.02, "clip_frac_low": 0.01,
                         "clip_frac_high": 0.01, "entropy": 6.0, "grad_norm": 0.5, "lr": 2e-4,
                         "response_len/mean": 40.0 - s, "zero_std_frac": 0.25, "judge_invalid": 2,
                         "judge_failed_scores": 1, "judge_prompt_too_long": 0, "weight/format": 1.0,
                         "weight/helpful": 1.0 + 0.1 * s, "reward_failed_scores": 1,
                         "monitor/template_share": 0.1 * s, "monitor/template_share/window_mean": 0.05 * s,
                         "monitor/length_drift": -0.02 * s,
                         "monitor/saturation/format": 1.0, "monitor/saturation/format/rise": 0.0,
                         "monitor/redundancy/format__helpful": 0.1 * s, "monitor/var/helpful": 0.05,
                         "monitor/reward_length_corr": 0.3, "monitor/judge_parse_failure": 0.2,
                         "monitor/missing/helpful": 0.1})
    return _write_run(workdir, rows)


def _rule_only_run(workdir: Path, kl: bool) -> Path:
    """GRPO only, rule-only rubric, static weights; `kl=False` is a beta = 0 run (no KL logged)."""
    rows = []
    for s in range(4):
        if s in (0, 3):
            rows.append({"step": s, "time": 100.0 + s, "stage": "eval", "eval/reward_mean": 0.3 + 0.1 * s,
                         "eval/reward/format": 0.5})
        if s:
            rows.append({"step": s, "time": 100.0 + s, "stage": "grpo", "reward/mean": 0.3, "reward/format": 0.5,
                         **({"kl": 0.002 * s} if kl else {}), "clip_frac": 0.0, "entropy": 5.0, "grad_norm": 1.0,
                         "lr": 1e-4, "response_len/mean": 20.0, "zero_std_frac": 0.5})
    return _write_run(workdir, rows)


def test_plots_cli_overlays_two_runs_and_refuses_to_write_into_one(tmp_path, command_server):
    """Each `python -m experiments.plots` run forked from the command's server (tests/command_server.py)."""
    plots_cli = command_server("experiments.plots").run
    a = _judged_run(tmp_path / "sweep" / "lr=0.0001")
    b = _rule_only_run(tmp_path / "sweep" / "lr=0.0002", kl=False)
    proc = plots_cli(f"--workdir={a}", str(b), f"--out={tmp_path / 'compare'}")  # README: the plots command
    assert proc.returncode == 0, proc.stderr
    written = {p.name for p in (tmp_path / "compare").glob("*.png")}
    assert written == ALL_PLOTS  # run a carries every metric; b's missing KL and judge counters are skipped
    assert all((tmp_path / "compare" / name).read_bytes()[:8] == PNG for name in written)

    proc = plots_cli(f"--workdir={a}", f"--workdir={b}", f"--out={b}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"experiments.plots: error: --out={b} is the run {b} (or its plots/): write the overlays elsewhere"]
    assert not (b / "reward.png").exists()


def test_overlay_skips_what_no_run_logged(tmp_path):
    runs = {name: metrics.read_jsonl_metrics(_rule_only_run(tmp_path / name, kl=False) / metrics.METRICS_FILE)
            for name in ("seed=0", "seed=1")}
    written = {p.name for p in plots.plot_runs(runs, tmp_path / "out")}
    assert written == ALL_PLOTS - {"kl.png", "judge_failures.png", "weights.png", "sft_loss.png", *MONITOR_PLOTS}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(written)  # no temporary files left


def test_per_run_plots_include_optimisation_judge_and_weight_curves(tmp_path):
    run = _judged_run(tmp_path / "run")
    written = plots.plot_run(run)
    assert {p.name for p in written} == ALL_PLOTS
    assert all(p.parent == run / plots.PLOTS_DIR and p.read_bytes()[:8] == PNG for p in written)


def test_stages_never_share_a_curve():
    """SFT and GRPO both log lr and loss from step 1; each plot reads only its own stage's rows."""
    rows = [{"step": 1, "stage": "sft", "lr": 1e-3, "loss": 8.0}, {"step": 2, "stage": "sft", "lr": 2e-3, "loss": 7.0},
            {"step": 0, "stage": "eval", "eval/response_len/mean": 30.0},
            {"step": 1, "stage": "grpo", "lr": 2e-4, "loss": 0.1, "response_len/mean": 40.0},
            {"step": 2, "stage": "grpo", "lr": 2e-4, "loss": 0.2, "response_len/mean": float("nan")}]
    by_name = {spec.filename: spec for spec in plots.PLOTS}
    assert plots.spec_series(by_name["lr.png"], rows) == {"lr": ([1, 2], [2e-4, 2e-4])}
    assert plots.spec_series(by_name["sft_loss.png"], rows) == {"loss": ([1, 2], [8.0, 7.0])}
    lengths = plots.spec_series(by_name["response_length.png"], rows)
    assert list(lengths) == ["eval/response_len/mean", "response_len/mean"]  # "mean" metrics first, then by name
    assert lengths["response_len/mean"][0] == [1, 2] and math.isnan(lengths["response_len/mean"][1][1])
    all_nan = [{"step": 1, "stage": "grpo", "kl": float("nan")}]
    assert plots.spec_series(by_name["kl.png"], all_nan) == {}  # nothing to draw: no plot


def test_plots_written_for_present_metrics_only(tmp_path):
    with metrics.MetricsWriter(tmp_path, tensorboard=False) as w:
        for step in range(5):
            w.write(step, {"reward/mean": 0.1 * step, "reward/format": 1.0, "reward/topic_keyword": 0.05 * step,
                           "kl": 0.001 * step, "response_len/mean": 40 - step, "zero_std_frac": 0.5,
                           "reward_failed_scores": 0})
            if step % 2 == 0:
                w.write(step, {"stage": "eval", "eval/reward_mean": 0.2 * step, "eval/reward/format": float("nan"),
                               "eval/reward_not_ok": 3})
    paths = plots.plot_run(tmp_path)
    assert sorted(p.name for p in paths) == sorted(
        ["reward.png", "eval_reward.png", "kl.png", "response_length.png", "zero_std.png"])
    only_kl = plots.plot_metrics([{"step": 0, "kl": 0.1}, {"step": 1, "kl": 0.2}], tmp_path / "other")
    assert [p.name for p in only_kl] == ["kl.png"]
    rows = metrics.read_jsonl_metrics(tmp_path / "metrics.jsonl")
    assert plots.series(rows, "eval/reward_mean") == ([0, 2, 4], [0.0, 0.4, 0.8])
    counters = ("reward_failed_scores", "eval/reward_not_ok")
    assert [k for spec in plots.PLOTS for k in counters if plots.spec_series(spec, rows).get(k)] == []


def test_legend_names_are_readable():
    assert plots.run_names(["/x/a/tiny", "/x/b/tiny", "/x/lr=1"]) == ["a/tiny", "b/tiny", "x/lr=1"]
    assert plots.run_names(["/s/lr=0.0001", "/s/lr=0.0002"]) == ["lr=0.0001", "lr=0.0002"]
    with pytest.raises(ValueError, match="given twice"):
        plots.run_names(["/x/a", "/x/b/../a"])
    assert [plots.metric_label(k) for k in ("reward/mean", "eval/reward/helpful", "weight/format", "clip_frac_low",
                                            "eval/judge_invalid", "grad_norm")] == [
        "mean reward", "helpful", "format", "clipped below 1 - clip_low", "unparseable judge answers (eval)",
        "grad_norm"]


def test_monitor_plots_draw_their_alert_threshold(tmp_path):
    run = _write_run(tmp_path / "run", [{"step": s, "stage": "grpo", "monitor/template_share": 0.1 * s,
                                         "monitor/length_drift": 0.2 * s, "reward/mean": 0.5} for s in (1, 2)])
    plots.plot_run(run, tmp_path / "without")  # no config.json: no thresholds
    (run / "config.json").write_text(json.dumps({"monitor": {"max_template_share": 0.4,
                                                             "max_length_drift": float("inf")}}))
    plots.plot_run(run, tmp_path / "with")
    for name, drawn in (("template_share.png", True), ("length_drift.png", False), ("reward.png", False)):
        same = (tmp_path / "with" / name).read_bytes() == (tmp_path / "without" / name).read_bytes()
        assert same != drawn, name  # an infinite threshold (never alert) is not drawn


def test_the_windowed_monitors_plots_draw_the_rolling_mean_their_alert_reads():
    rows = [{"step": s, "stage": "grpo", "monitor/template_share": 0.1 * s, "monitor/reward_length_corr": 0.2,
             "monitor/template_share/window_mean": float("nan") if s < 3 else 0.2 * s - 0.2,
             "monitor/reward_length_corr/window_mean": float("nan")} for s in (1, 2, 3)]
    specs = {spec.filename: spec for spec in plots.PLOTS}
    template = plots.spec_series(specs["template_share.png"], rows)
    assert list(template) == ["monitor/template_share/window_mean", "monitor/template_share"]  # the bold line first
    assert template["monitor/template_share/window_mean"][0] == [1, 2, 3]
    assert list(plots.spec_series(specs["reward_length_corr.png"], rows)) == ["monitor/reward_length_corr"]  # all NaN
    assert plots.metric_label("monitor/template_share/window_mean") == "template share, rolling mean (alerted)"


def test_plots_out_may_not_be_another_runs_plots_or_a_foreign_directory(tmp_path, command_server):
    """Each `python -m experiments.plots` run forked from the command's server (tests/command_server.py)."""
    a = _judged_run(tmp_path / "a")
    other = _rule_only_run(tmp_path / "other", kl=True)
    plots.plot_run(other)
    before = {p.name: p.read_bytes() for p in (other / plots.PLOTS_DIR).iterdir()}
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("keep me")
    for out, message in ((other / plots.PLOTS_DIR, f"is the plots/ of the run {other}: its own plots would be "
                                                   "overwritten"),
                         (foreign, "is a non-empty directory that experiments.plots did not write")):
        proc = command_server("experiments.plots").run(f"--workdir={a}", f"--out={out}")
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"experiments.plots: error: --out={out} {message}; " + (
                "write the overlays elsewhere" if out != foreign else "give a new or empty directory")]
    assert {p.name: p.read_bytes() for p in (other / plots.PLOTS_DIR).iterdir()} == before
    assert [p.name for p in foreign.iterdir()] == ["todo.txt"]
    compare = tmp_path / "compare"
    for _ in range(2):  # a directory this command wrote may be written again; stale PNGs go with it
        proc = command_server("experiments.plots").run(f"--workdir={a}", f"--out={compare}")
        assert proc.returncode == 0, proc.stderr
        assert {p.name for p in compare.iterdir()} == ALL_PLOTS | {plots.OVERLAY_MANIFEST}


def test_a_full_disk_leaves_the_overlay_directory_as_it_was(tmp_path, monkeypatch):
    runs = {"a": metrics.read_jsonl_metrics(_judged_run(tmp_path / "a") / metrics.METRICS_FILE)}
    out = tmp_path / "compare"
    plots.write_overlays({"b": metrics.read_jsonl_metrics(_rule_only_run(tmp_path / "b", kl=False)
                                                          / metrics.METRICS_FILE)}, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = []
    real_write = plots.write_atomic

    def full_after_three(path, data):
        calls.append(path)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, data)

    monkeypatch.setattr(plots, "write_atomic", full_after_three)
    with pytest.raises(OSError, match="No space left"):
        plots.write_overlays(runs, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # not 3 new PNGs beside old ones
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "compare"]  # no temporary directory


def test_plots_cli_full_disk_is_one_line(tmp_path, command_server):
    a = _judged_run(tmp_path / "a")
    code = ("import errno\nfrom rubric_jax import plots\n"
            "def full(path, data):\n    raise OSError(errno.ENOSPC, 'No space left on device')\n"
            "plots.write_atomic = full\n")
    proc = command_server("experiments.plots").run(f"--workdir={a}", f"--out={tmp_path / 'out'}", setup=code)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"experiments.plots: error: writing {tmp_path / 'out'} failed (No space left on device); nothing was written"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("huge", [1e308, -1e308, float("inf"), 10**400])
def test_metrics_of_any_size_plot_with_a_clipped_axis(tmp_path, huge):
    rows = [{"step": s, "stage": "grpo", "reward/mean": v, "kl": 0.1} for s, v in ((1, huge), (2, -huge), (3, 0.5))]
    written = plots.plot_metrics(rows, tmp_path / "one")
    assert {p.name for p in written} == {"reward.png", "kl.png"}
    sign = 1 if huge > 0 else -1
    assert plots.series(rows, "reward/mean")[1] == [sign * plots.PLOT_LIMIT, -sign * plots.PLOT_LIMIT, 0.5]
    assert {p.name for p in plots.plot_runs({"a": rows, "b": rows}, tmp_path / "two")} == {"reward.png", "kl.png"}

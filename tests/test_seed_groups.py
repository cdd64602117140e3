"""A sweep's variants taken over their seeds (rubric_jax/seed_groups.py): hand-computed means and spreads, the
seed-mean curves, the table, and the summary a sweep writes (its seed_mean overlay plots)."""

import json
import math

import pytest

from rubric_jax import seed_groups, sweeps


def _variant(name, overrides, final, status="finished", dims=None, zero_std=0.0, sps=1.0):
    return {"name": name, "overrides": overrides, "status": status, "final_eval_reward": final,
            "final_eval_step": 60 if final is not None else None, "final_eval_dimensions": dims or {},
            "zero_std_frac": zero_std, "seconds_per_step": sps}


def test_groups_differ_only_in_seed_and_report_mean_and_half_range():
    variants = [_variant("seed=0", {"seed": 0}, 0.5, dims={"format": 1.0}, zero_std=0.1, sps=2.0),
                _variant("advantage=per_dimension,seed=0", {"rl.advantage": "per_dimension", "seed": 0}, 0.9),
                _variant("seed=1", {"seed": 1}, 0.7, dims={"format": 0.5}, zero_std=0.3, sps=4.0),
                _variant("seed=2", {"seed": 2}, None, status="unfinished"),
                _variant("advantage=per_dimension,seed=1", {"rl.advantage": "per_dimension", "seed": 1}, float("nan")),
                _variant("lr=0.1", {"rl.lr": 0.1}, 0.2)]  # no seed: not in any group
    groups = seed_groups.aggregate(variants, lambda o: sweeps.variant_names([o])[0])
    assert [g["name"] for g in groups] == ["base", "advantage=per_dimension"]
    base, per_dim = groups
    assert base["variants"] == ["seed=0", "seed=1", "seed=2"] and base["seeds"] == [0, 1, 2]
    assert base["finished"] == 2
    assert base["final_eval_reward"] == pytest.approx({"mean": 0.6, "spread": 0.1, "n": 2})
    assert base["final_eval_dimensions"] == {"format": {"mean": 0.75, "spread": 0.25, "n": 2}}
    assert base["zero_std_frac"] == pytest.approx({"mean": 0.4 / 3, "spread": 0.15, "n": 3})
    assert base["seconds_per_step"] == pytest.approx({"mean": 7 / 3, "spread": 1.5, "n": 3})
    assert per_dim["final_eval_reward"] == {"mean": 0.9, "spread": 0.0, "n": 1}  # a NaN final is not averaged in
    assert seed_groups.aggregate([_variant("lr=0.1", {"rl.lr": 0.1}, 0.2)], str) == []


def test_mean_rows_average_each_step_over_the_runs_that_have_it():
    a = [{"step": 1, "stage": "grpo", "reward/mean": 0.2, "time": 5.0},
         {"step": 1, "stage": "eval", "eval/reward_mean": 0.4},
         {"step": 2, "stage": "grpo", "reward/mean": 0.6}]
    b = [{"step": 1, "stage": "grpo", "reward/mean": 0.4, "kl": float("nan")},
         {"step": 1, "stage": "eval", "eval/reward_mean": 0.8}]
    rows = seed_groups.mean_rows([a, b])
    assert rows == [{"step": 1, "reward/mean": pytest.approx(0.3), "stage": "grpo"},
                    {"step": 1, "eval/reward_mean": pytest.approx(0.6), "stage": "eval"},
                    {"step": 2, "reward/mean": 0.6, "stage": "grpo"}]


def test_the_table_names_every_dimension_and_marks_missing_values():
    groups = seed_groups.aggregate([_variant("seed=0", {"seed": 0}, 0.5, dims={"format": 1.0}),
                                    _variant("seed=1", {"seed": 1}, 0.75, dims={"format": 0.5})], lambda o: "base")
    groups.append({**groups[0], "name": "empty", "final_eval_reward": seed_groups.mean_and_spread([]),
                   "final_eval_dimensions": {}})
    lines = seed_groups.markdown_table(groups)
    assert lines[0].startswith("| variant (over seeds) | seeds finished | final eval reward (mean ± spread) | format |")
    assert lines[2] == "| base | 2 of 2 | 0.625 ± 0.125 (n=2) | 0.750 | 0.000 | 1.00 |"
    assert lines[3] == "| empty | 2 of 2 | - | - | 0.000 | 1.00 |"
    assert seed_groups.markdown_table([]) == []


def test_a_sweep_over_seeds_writes_the_seed_table_and_seed_mean_plots(tmp_path):
    """summarize + write_summary on two seeds of two options whose metrics are written by hand (no runs)."""
    config = tmp_path / "cfg.py"
    config.write_text("from configs import tiny\nget_config = tiny.get_config\n"
                      "def sweep(add, arg=None):\n    for seed in (0, 1):\n        add(seed=seed)\n"
                      "        add(**{'rl.advantage': 'per_dimension'}, seed=seed)\n")
    sweep = sweeps.load_sweep(str(config))
    workdir = tmp_path / "sweep"
    for index, variant in enumerate(sweep.variants):
        rows = [{"step": s, "time": float(s), "stage": "grpo", "reward/mean": 0.1 * s + index,
                 "zero_std_frac": 0.0} for s in (1, 2, 3)]
        rows.append({"step": 3, "time": 4.0, "stage": "eval", "eval/reward_mean": 0.5 + 0.1 * index,
                     "eval/reward/format": 1.0})
        (workdir / variant.name).mkdir(parents=True)
        (workdir / variant.name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = sweeps.summarize(sweep, workdir)
    assert [g["name"] for g in summary["seed_groups"]] == ["base", "advantage=per_dimension"]
    assert summary["seed_groups"][0]["final_eval_reward"] == pytest.approx({"mean": 0.6, "spread": 0.1, "n": 2})
    written = sweeps.write_summary(sweep, workdir, summary)
    assert workdir / "plots" / "seed_mean" / "eval_reward.png" in written
    markdown = (workdir / "summary.md").read_text()
    assert "| base | 0 of 2 | 0.600 ± 0.100 (n=2) | 1.000 | 0.000 | 1.00 |" in markdown
    assert "[seed_mean/eval_reward](plots/seed_mean/eval_reward.png)" in markdown
    assert math.isclose(json.loads((workdir / "summary.json").read_text())["seed_groups"][1]["final_eval_reward"]
                        ["mean"], 0.7)

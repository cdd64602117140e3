"""experiments.calibrate, each run forked from the command's server (tests/command_server.py): the README commands (a
rule-only rubric with one weak and one strong dimension; the Prometheus GPT-4 inter-rater ceiling), a judge
checkpoint directory, and bad input exiting 2 in one line."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from sklearn.metrics import cohen_kappa_score

from rubric_jax.calibration.labels import read_items
from rubric_jax.judges.reward import RubricReward
from rubric_jax.rubrics.io import load_rubric
from test_importers import _real
from test_reward import ACCURACY
from tests import manual

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path("tests/fixtures/calibration")
README = manual.text()  # README.md and docs/*.md


def readme_command(marker: str) -> list[str]:
    """The flags of the README's `./launch.sh experiments.calibrate` line that contains `marker`."""
    line = next(line for line in README.splitlines() if "launch.sh experiments.calibrate" in line and marker in line)
    return line.split("experiments.calibrate", 1)[1].split("#")[0].split()


def _with_out(args: list[str], out: Path) -> list[str]:
    return [a if not a.startswith("--out=") else f"--out={out}" for a in args]


def expected_stats(x, y, levels):
    return {"spearman": scipy.stats.spearmanr(x, y).statistic, "kendall": scipy.stats.kendalltau(x, y).statistic,
            "kappa_quadratic": cohen_kappa_score(np.floor(np.asarray(x) + 0.5).astype(int),
                                                 np.floor(np.asarray(y) + 0.5).astype(int), weights="quadratic",
                                                 labels=list(levels))}


def test_readme_rule_rubric_flags_the_weak_dimension_and_matches_scipy(tmp_path, command_server):
    args = readme_command(str(FIXTURES / "labels.jsonl"))
    proc = command_server("experiments.calibrate").run(*_with_out(args, tmp_path / "cal"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["items"] == 14 and summary["flagged"] == ["length"]
    report = json.loads((tmp_path / "cal" / "report.json").read_text())
    # The judge scores the report compared: the training reward on the same rows, recomputed here.
    rubric = load_rubric(REPO / FIXTURES / "rubric.yaml")
    items = read_items(REPO / FIXTURES / "labels.jsonl", rubric)
    out = RubricReward([rubric])([i.question for i in items], [i.response for i in items], [rubric] * len(items))
    for c, dim_id in enumerate(out.dimension_ids):
        labels = [i.labels[dim_id] for i in items]
        entry = report["dimensions"][dim_id]
        for name, value in expected_stats(out.details["raw_scores"][:, c], labels, rubric.dimension(dim_id).scale.levels).items():
            assert entry[name]["value"] == pytest.approx(value, abs=1e-6), (dim_id, name)
            assert entry[name]["ci95"][0] <= entry[name]["value"] <= entry[name]["ci95"][1]
    assert not report["dimensions"]["safety"]["flagged"] and report["dimensions"]["safety"]["spearman"]["value"] > 0.8
    assert report["dimensions"]["length"]["flag_reason"].startswith("spearman 0.027 < 0.6")
    length_bias = report["dimensions"]["length"]["bias"]["coefficients"]["length_z"]
    assert length_bias["coef"] > 0 and length_bias["excludes_zero"]  # the rule over-scores long answers vs people
    md = (tmp_path / "cal" / "report.md").read_text()
    assert "| length | rule | 14 | 0.027 [" in md and "**yes**: spearman 0.027 < 0.6" in md
    for dim_id in ("safety", "length"):
        assert (tmp_path / "cal" / "plots" / f"{dim_id}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "need at least 35" in report["dimensions"]["length"]["correction"]["not_fitted"]


def test_readme_prometheus_inter_rater_ceiling(tmp_path, command_server):
    vicuna = _real("prometheus", "vicuna_eval.json")
    args = [a.replace("../shared/data/prometheus/vicuna_eval.json", str(vicuna)) for a in readme_command("vicuna_eval")]
    proc = command_server("experiments.calibrate").run(*_with_out(args, tmp_path / "vicuna"))
    assert proc.returncode == 0, proc.stderr
    entry = json.loads((tmp_path / "vicuna" / "report.json").read_text())["dimensions"]["criteria"]
    scores_3xN = np.array([record["gpt4_score"] for record in json.loads(vicuna.read_text())]).T
    for name in ("spearman", "kendall", "kappa_quadratic"):
        expected = np.mean([expected_stats(scores_3xN[i], scores_3xN[j], range(1, 6))[name]
                            for i, j in itertools.combinations(range(3), 2)])
        assert entry[name]["value"] == pytest.approx(expected, abs=1e-6)
        # The README's ceiling table shows exactly these figures.
        lo, hi = entry[name]["ci95"]
        assert f"{entry[name]['value']:.3f} [{lo:.3f}, {hi:.3f}]" in README, name
    assert entry["n"] == 320 and entry["raters"] == 3
    coefs = entry["bias"]["coefficients"]
    for name in ("length_z", "markdown"):
        c = coefs[name]
        assert f"{c['coef']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]" in README, name


BAD_INPUT = {  # case -> (labels lines, extra flags, fragments of the one-line error)
    "unknown_dimension": (['{"question": "q", "response": "r", "labels": {"tone": 3}}'], [],
                          ["labels.jsonl:1: labels: unknown dimension 'tone'"]),
    "outside_scale": (['{"question": "q", "response": "r", "labels": {"safety": 1}}',
                       '{"question": "q", "response": "r", "labels": {"length": 9}}'], [],
                      ["labels.jsonl:2: labels.length: 9 is outside the scale [1, 5]"]),
    "not_numeric": (['{"question": "q", "response": "r", "labels": {"length": "high"}}'], [],
                    ["labels.jsonl:1: labels.length: expected a number, got 'high'"]),
    "empty_file": ([], [], ["labels.jsonl: no labelled rows"]),
    "mismatched_rows": (['{"question": "q", "response": "r", "ratings": {"length": [1, 2, 3]}}',
                         '{"question": "q", "response": "r", "ratings": {"length": [4, 5]}}'], [],
                        ["labels.jsonl:2: ratings.length: 2 raters, but", "labels.jsonl:1 has 3"]),
    "output_is_input": (['{"question": "q", "response": "r", "labels": {"length": 3}}'], ["--correction_out={labels}"],
                        ["would overwrite the input --labels"]),
}


def test_bad_input_is_one_line_naming_file_and_line_and_exits_2(tmp_path, command_server):
    """Each case a run of the command, forked from one process that imported it (tests/command_server.py)."""
    for case, (lines, extra, _) in BAD_INPUT.items():
        labels = tmp_path / case / "labels.jsonl"
        labels.parent.mkdir()
        labels.write_text("".join(line + "\n" for line in lines))
        proc = command_server("experiments.calibrate").run(
            f"--rubric={REPO / FIXTURES / 'rubric.yaml'}", f"--labels={labels}", f"--out={tmp_path / case / 'out'}",
            *(e.format(labels=labels) for e in extra))
        stderr = proc.stderr
        assert proc.returncode == 2, (case, stderr)
        assert "Traceback" not in stderr, (case, stderr)
        error_lines = [line for line in stderr.splitlines() if line.startswith("experiments.calibrate: error:")]
        assert len(error_lines) == 1, (case, stderr)
        for fragment in BAD_INPUT[case][2]:
            assert fragment in error_lines[0], (case, fragment, stderr)
        assert not (tmp_path / case / "out").exists(), case


def test_training_config_switch_loads_and_checks_the_correction(tmp_path, command_server):
    """--config.data.rubric_correction reaches the reward: a correction fitted on another scale is refused
    before any stage starts, in one line (a run of experiments.run forked from its command server)."""
    correction = tmp_path / "tiny.correction.json"
    correction.write_text(json.dumps({
        "format": "rubric_jax.score_correction", "format_version": 1, "version": "1.0.0", "standardize": {},
        "dimensions": {"format": {"intercept": 0.0, "score": 1.0, "features": {}, "scale": [1, 5]}}}))
    proc = command_server("experiments.run").run(
        "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}", f"--config.data.rubric_correction={correction}")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "dimension 'format' has scale [0, 1] but the correction was fitted on [1, 5]" in proc.stderr


def test_llm_dimension_with_a_judge_checkpoint_directory(tmp_path, command_server):
    """The CLI loads a real (scripted) judge checkpoint: a judge that always answers 4 is constant, so its
    Spearman is undefined and the dimension is flagged; reversing the anchors does not move it."""
    from rubric_jax.models.checkpoint import export_hf_checkpoint
    from test_llm_judge import scripted_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    weights = scripted_model(tokenizer, "SCORE: 4")
    judge_dir = export_hf_checkpoint(weights.cfg, weights.params, tmp_path / "judge")
    tokenizer.save_pretrained(judge_dir)
    rubric = tmp_path / "rubric.json"
    rubric.write_text(json.dumps({"name": "llm", "version": "1.0.0", "changelog": [
        {"version": "1.0.0", "change": "c", "reason": "r"}], "dimensions": [ACCURACY]}))
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"question": "2+2?", "response": f"{k}", "labels": {"accuracy": k}}) + "\n"
                              for k in (1, 2, 3, 4, 5)))
    proc = command_server("experiments.calibrate").run(
        f"--rubric={rubric}", f"--labels={labels}", f"--out={tmp_path / 'out'}", f"--judge.checkpoint={judge_dir}",
        "--judge.sampler=greedy", "--judge.samples=1", "--judge.max_new_tokens=8", "--config.bootstrap=50")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    entry = report["dimensions"]["accuracy"]
    assert entry["n"] == 5 and entry["spearman"]["undefined"] == "x is constant (every value 4)" and entry["flagged"]
    assert report["inputs"]["judges"] == [str(judge_dir)]
    assert report["position_probe"]["accuracy"] == {"n": 5, "unscored": 0, "mean_shift": 0.0, "mean_shift_ci95": [0.0, 0.0],
                                                    "mean_abs_shift": 0.0, "changed_share": 0.0}

"""Judge distillation end to end: deterministic training, the CLI (README command, bad input), and the shipped
tiny judges measured against their teachers on held-out items (real models, greedy, one batched call each)."""

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
import scipy.stats

from rubric_jax import loader
from rubric_jax.assets import ASSETS_DIR, TINY_JUDGE_DIR, build_tiny_judges, tiny_judge_data
from rubric_jax.calibration.stats import spearman
from rubric_jax.judges.llm_judge import load_judge
from rubric_jax.models.config import ModelConfig
from rubric_jax.train import distill_judge
from tests import manual

REPO = Path(__file__).resolve().parents[2]
README = manual.text()  # README.md and docs/*.md
HELDOUT_PER_DIMENSION = 24
# RubricRL 3.2: a judge that agrees with its reference below Spearman 0.6 is not to be used.
SPEARMAN_FLOOR = 0.6


_SHORT = ["--config.train.steps=2", "--config.train.batch_size=4", "--config.train.warmup_steps=1"]  # a few seconds


def readme_command() -> list[str]:
    """The flags of the README's `./launch.sh experiments.distill_judge` command."""
    line = next(line for line in README.splitlines() if "launch.sh experiments.distill_judge" in line)
    return line.split("experiments.distill_judge", 1)[1].split("#")[0].split()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_JUDGE_DIR)


def test_training_is_a_pure_function_of_its_seed(tokenizer):
    cfg = ModelConfig.from_hf_dir(TINY_JUDGE_DIR).replace(hidden_size=32, intermediate_size=64, num_layers=1,
                                                          head_dim=8)
    items = tiny_judge_data.judge_items("default")[0][:16]
    config = distill_judge.DistillConfig(steps=2, batch_size=8, learning_rate=1e-3, warmup_steps=1, seed=3,
                                         prompt="compact")
    runs = [distill_judge.train(cfg, None, tokenizer, items, config, distill_judge.default_layout(), progress=False)
            for _ in range(2)]
    jax.tree.map(np.testing.assert_array_equal, runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1] and np.isfinite(runs[0][1]).all()
    # Another seed starts from other weights (it also draws other batches and renderings).
    inits = [distill_judge.initial_state(cfg, None, dataclasses.replace(config, seed=seed),
                                         distill_judge.default_layout())[0].params for seed in (3, 4)]
    assert not np.array_equal(*(np.asarray(p["embed_tokens"]["embedding"]) for p in inits))
    with pytest.raises(ValueError, match="warmup_steps"):
        distill_judge.DistillConfig(steps=5, warmup_steps=5)
    with pytest.raises(ValueError, match="batch_size=4 must be a multiple of the 8 ways"):
        distill_judge.train(cfg, None, tokenizer, items, dataclasses.replace(config, batch_size=4),
                            distill_judge.default_layout(), progress=False)


def test_a_student_given_weights_starts_from_them():
    """`--student_checkpoint=DIR` (and the planted-hack judges, built from the default one): the step-0 state holds
    the given weights, not a random init of their shape."""
    layout = distill_judge.default_layout()
    weights = loader.load_weights(TINY_JUDGE_DIR, layout, param_dtype="float32")
    config = distill_judge.DistillConfig(steps=2, warmup_steps=1, seed=3, prompt="compact")
    state, _ = distill_judge.initial_state(ModelConfig.from_hf_dir(TINY_JUDGE_DIR), weights, config, layout)
    jax.tree.map(np.testing.assert_array_equal, state.params, weights.params)


def readme_command_to(out: Path) -> list[str]:
    """The README's command writing to `out`."""
    return [a if not a.startswith("--out=") else f"--out={out}" for a in readme_command()]


def shrunk_readme_command(out: Path) -> list[str]:
    """The README's command writing to `out`, shrunk: 2 updates, and a sliver of held-out questions."""
    return [*readme_command_to(out), *_SHORT, "--config.heldout=0.03", "--config.measure.max_new_tokens=8"]


def test_the_readme_command_writes_a_loadable_judge_and_its_report(tmp_path, command_server):
    out = tmp_path / "judge"
    server = command_server("experiments.distill_judge")
    proc = server.run(*shrunk_readme_command(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    report = json.loads((out / "report.json").read_text())
    assert report["format"] == "rubric_jax.distill_report" and summary["heldout"] == report["heldout"]["items"] > 0
    [(dim_id, dim)] = report["dimensions"].items()
    assert dim_id == "template" and dim["items"] == report["heldout"]["items"]
    for stat in ("spearman", "kendall", "kappa_quadratic"):
        assert "value" in dim[stat] and "ci95" in dim[stat]
    assert report["training"]["steps"] == 2 and report["training"]["items"] > 100
    assert "| template |" in (out / "report.md").read_text()
    judge = load_judge(str(out), sampler="greedy", max_new_tokens=8)  # loads as training would load it
    assert judge.tokenizer.chat_template and {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors"}
    # Refused before any training: the judge is there.
    again = server.run(*readme_command_to(out), "--config.train.steps=2")
    assert again.returncode == 2 and "already exists" in again.stderr


@pytest.mark.parametrize("extra, message", [
    (["--config.dimensions=format,nope"], "no row's rubric has the dimension(s) ['nope']"),
    (["--config.train.stepz=3"], "unknown config key 'stepz'"),  # the settings file is locked
    (["--config.teacher=people"], "--config.teacher=people: expected one of ['rules', 'judge', 'labels']"),
    (["--config.dimensions=format", "--config.measure.sampler=warm"], "--config.measure.sampler: "),
    (["--config.teacher=labels", "--labels={labels}"], "labels.jsonl:2: labels.format: 7 is outside the scale [0, 1]"),
    (["--config.dimensions=format", "--student_config=nope.json"], "--student_config=nope.json"),
    # Refused before training (it failed after training, losing it); a short run where it would train.
    (["--config.dimensions=format", "--config.measure.max_new_tokens=600", *_SHORT],
     "--config.measure.max_new_tokens=600: expected an integer in [1, 511] (the student's 512-token context holds the "
     "judge prompt and the verdict)"),
    (["--config.dimensions=format", "--config.measure.max_new_tokens=100000", *_SHORT],
     "--config.measure.max_new_tokens=100000: expected"),
    (["--config.dimensions=format", "--config.train.lr=nan"], "error: --config.train.lr=nan: expected a number, not NaN"),
    (["--config.dimensions=format", "--config.train.lr=0"], "error: --config.train.lr must be positive, got 0"),
    (["--config.dimensions=format", "--config.train.warmup_steps=5", "--config.train.steps=5"],
     "error: --config.train.warmup_steps (5) must be below --config.train.steps (5)"),
    (["--config.dimensions=format", "--student_config={listed}"], "listed.json: expected a HF config.json object, got list"),
    (["--config.dimensions=format", "--student_config={broken}"], "broken.json: Expecting value: line 1 column 1"),
    (["--config.dimensions=format", "--tokenizer={tok}", "--out={tok}/inside", *_SHORT], "/tok/inside: lies inside the "
     "input directory"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, extra, message, command_server):
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"question": "q", "response": "r", "labels": {"format": 1}}\n'
                      '{"question": "q", "response": "r", "labels": {"format": 7}}\n')
    student = [f"--student_config={TINY_JUDGE_DIR / 'config.json'}", f"--tokenizer={TINY_JUDGE_DIR}"]
    (tmp_path / "listed.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text("")
    shutil.copytree(TINY_JUDGE_DIR, tmp_path / "tok")  # an input directory of this test's own
    flags = [f.format(labels=labels, listed=tmp_path / "listed.json", broken=tmp_path / "broken.json",
                      tok=tmp_path / "tok") for f in extra]
    if any(f.startswith("--student_config") for f in flags):
        student = [f"--tokenizer={TINY_JUDGE_DIR}"]
    if any(f.startswith("--tokenizer") for f in flags):
        student = [f"--student_config={TINY_JUDGE_DIR / 'config.json'}"]
    out = [] if any(f.startswith("--out=") for f in flags) else [f"--out={tmp_path / 'judge'}"]
    proc = command_server("experiments.distill_judge").run(*out, "--rubric=rubric_jax/assets/tiny/rubric.yaml",
                                                           *student, *flags)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("experiments.distill_judge: error:") and message in line, line
    assert not (tmp_path / "judge").exists() and not (tmp_path / "tok" / "inside").exists()


@pytest.mark.parametrize("variant", tiny_judge_data.VARIANTS)
def test_a_shipped_judge_agrees_with_its_teacher_on_held_out_items(variant):
    """HELDOUT_PER_DIMENSION held-out items per dimension, through the scoring path training uses (inference only):
    few parse failures and Spearman >= 0.6 per dimension, which an untrained or wrongly prompted judge cannot reach."""
    heldout = tiny_judge_data.judge_items(variant)[1]
    items = [i for dim in dict.fromkeys(i.dimension.id for i in heldout)
             for i in [i for i in heldout if i.dimension.id == dim][:HELDOUT_PER_DIMENSION]]
    judge = load_judge(str(ASSETS_DIR / build_tiny_judges.JUDGE_DIRS[variant]), sampler=build_tiny_judges.SAMPLER,
                       max_new_tokens=build_tiny_judges.MAX_NEW_TOKENS)
    measured = distill_judge.measure(judge, items, jax.random.key(0), build_tiny_judges.TRAINING[variant].prompt)
    assert measured.counters["judge_invalid"] < 0.1 * len(items) and measured.counters["judge_prompt_too_long"] == 0
    for dim in dict.fromkeys(i.dimension.id for i in items):
        rows = np.asarray([d.id == dim for d in measured.dimensions]) & ~np.isnan(measured.student_N)
        rho = spearman(measured.teacher_N[rows], measured.student_N[rows]).value
        assert rho is not None and rho >= SPEARMAN_FLOOR, (variant, dim, rho)


def test_the_shipped_group_judge_answers_held_out_groups_in_the_group_layout():
    """tiny_judge_group, loaded as calibrate loads it (greedy, GROUP_MAX_NEW_TOKENS), judges two held-out groups of 3
    answers each, polite and not, in one group-layout call: a valid `R1..R3` block per group, a level of the scale
    for every answer, which a judge that only learnt the pointwise line (tiny_judge: no valid group verdict) cannot
    give. Its agreement is measured, not asserted: at chance (docs/judges.md, "Group judging")."""
    heldout = tiny_judge_data.judge_items("default")[1]
    questions = list(dict.fromkeys(i.question for i in heldout))[:2]
    groups = [tuple([i for i in heldout if i.question == q and i.score == 1][:1]
                    + [i for i in heldout if i.question == q and i.score == 0][:2]) for q in questions]
    judge = load_judge(str(ASSETS_DIR / build_tiny_judges.JUDGE_DIRS["group"]), sampler=build_tiny_judges.SAMPLER,
                       max_new_tokens=build_tiny_judges.GROUP_MAX_NEW_TOKENS)
    measured = distill_judge.measure_groups(judge, groups, jax.random.key(0))
    assert measured.counters["judge_prompts"] == 2 and measured.counters["judge_invalid"] == 0
    assert measured.counters["judge_prompt_too_long"] == 0 and set(measured.student_N) <= {0.0, 1.0}
    assert len(measured.student_N) == 6 and sorted(measured.teacher_N) == [0, 0, 0, 0, 1, 1]


@pytest.mark.parametrize("config_name", ["tiny", "tiny_hack", "tiny_hack_fixed"])
def test_each_tiny_config_prompts_its_judge_as_the_judge_was_distilled(config_name):
    """A judge asked in another prompt than the one it learnt answers at chance: the config must match the report."""
    import importlib

    config = importlib.import_module(f"configs.{config_name}").get_config()
    report = json.loads((REPO / config.judge.checkpoint / "report.json").read_text())
    assert report["judge_settings"].get("prompt", "full") == config.judge.prompt
    assert (report["judge_settings"]["sampler"], report["judge_settings"]["max_new_tokens"]) == (
        config.judge.sampler, config.judge.max_new_tokens)


def test_the_rebuild_script_writes_a_judge_with_the_shipped_tokenizer(tmp_path, monkeypatch):
    """`python -m rubric_jax.assets.build_tiny_judges`, shrunk to 2 updates of a one-layer model: the judge tokenizer
    it trains is the shipped one (deterministic), and the judge directory comes with its report."""
    small = build_tiny_judges.JUDGE_MODEL.replace(hidden_size=32, intermediate_size=64, num_layers=1, head_dim=8)
    monkeypatch.setattr(build_tiny_judges, "JUDGE_MODEL", small)
    monkeypatch.setitem(build_tiny_judges.TRAINING, "default",
                        distill_judge.DistillConfig(steps=2, batch_size=8, warmup_steps=1, prompt="compact"))
    build_tiny_judges.main(["--variant=default", f"--out_root={tmp_path}"])
    built = tmp_path / build_tiny_judges.JUDGE_DIRS["default"]
    assert (built / "tokenizer.json").read_bytes() == (TINY_JUDGE_DIR / "tokenizer.json").read_bytes()
    report = json.loads((built / "report.json").read_text())
    assert report["training"]["steps"] == 2 and set(report["dimensions"]) == {"politeness"}
    assert json.loads((built / "config.json").read_text())["hidden_size"] == 32


def test_the_rebuild_script_writes_a_group_judge_measured_pointwise_and_in_groups(tmp_path, monkeypatch):
    """`--variant=group`, shrunk to 2 updates on groups of at most 2 of a few items: it starts from the default judge in
    --out_root and learns items and groups; its report measures held-out items pointwise and held-out groups in the
    group layout."""
    shutil.copytree(TINY_JUDGE_DIR, tmp_path / build_tiny_judges.JUDGE_DIRS["default"])
    all_items = tiny_judge_data.judge_items
    monkeypatch.setattr(tiny_judge_data, "judge_items", lambda variant: tuple(
        part[:n] for part, n in zip(all_items(variant), (48, 12))))
    monkeypatch.setitem(build_tiny_judges.TRAINING, "group", dataclasses.replace(
        build_tiny_judges.TRAINING["group"], steps=2, warmup_steps=1, group_max_size=2, group_repeats=1))
    build_tiny_judges.main(["--variant=group", f"--out_root={tmp_path}"])
    built = tmp_path / build_tiny_judges.JUDGE_DIRS["group"]
    report = json.loads((built / "report.json").read_text())
    assert report["training"]["groups"] > report["training"]["items"] / 2 and report["training"]["group_max_size"] == 2
    held = report["heldout_group"]
    assert held["items"] == report["heldout"]["items"] and held["items"] / 2 <= held["prompts_sent"] < held["items"]
    assert set(held["dimensions"]) == {"politeness"} and "in the group layout" in (built / "report.md").read_text()
    assert json.loads((built / "config.json").read_text())["max_position_embeddings"] == 768


def test_a_planted_hack_judge_is_not_rebuilt_without_the_judge_it_starts_from(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_tiny_judges.main(["--variant=hack", f"--out_root={tmp_path}"])
    assert exit_.value.code == 2 and "--variant=hack starts from the default judge" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_report_counts_missing_verdicts_and_names_undefined_statistics():
    """Hand-computed: 6 items, one without a verdict (parse failure 1/6), 4 of the 5 scored agree exactly; a
    constant column has no Spearman, and the dimension is then flagged."""
    from rubric_jax.assets.build_tiny_assets import clarity_dimension

    dim = clarity_dimension(fixed=False)
    counters = {"judge_prompts": 6, "judge_invalid": 1, "judge_prompt_too_long": 0, "judge_invalid_examples": []}
    measured = distill_judge.Measurement([dim] * 6, np.array([1, 2, 3, 4, 5, 5.0]),
                                         np.array([1, 2, np.nan, 4, 4, 5.0]), counters)
    config = distill_judge.DistillConfig(steps=2, warmup_steps=1)
    payload = distill_judge.report(measured, teacher="t", student="s", train_items=3, config=config,
                                   losses=[1.0, 0.5], judge_settings={})
    entry = payload["dimensions"]["clarity"]
    assert payload["heldout"]["parse_failure_rate"] == pytest.approx(1 / 6)
    assert (entry["items"], entry["no_verdict"], entry["exact_agreement"]) == (6, 1, 0.8)
    # The scored items only, against scipy.
    assert entry["spearman"]["value"] == pytest.approx(scipy.stats.spearmanr([1, 2, 4, 5, 5], [1, 2, 4, 4, 5])[0])
    assert "| clarity | 6 | 1 | 0.800 |" in distill_judge.report_markdown(payload)
    constant = distill_judge.Measurement([dim] * 3, np.full(3, 3.0), np.full(3, 3.0), {**counters, "judge_invalid": 0})
    flat = distill_judge.report(constant, teacher="t", student="s", train_items=3, config=config, losses=[1.0],
                                judge_settings={})
    assert flat["dimensions"]["clarity"]["flagged"] and "undefined: " in distill_judge.report_markdown(flat)


def test_held_out_items_whose_rubrics_give_one_id_two_scales_are_each_measured_on_their_own():
    """Items of case-wise rubrics: 'clarity' on 1..5 in one, on 0..2 in another. The report read every item on
    the first item's levels (a 0..2 item's verdicts counted as 1..5 levels, or a 5 not near any 0..2 level raised);
    now each scale has its entry, '<id>@<lo>-<hi>', and a student agreeing with its teacher gets kappa 1 on both."""
    from rubric_jax.assets.build_tiny_assets import clarity_dimension
    from rubric_jax.rubrics.schema import Anchor, Scale

    wide = clarity_dimension(fixed=False)
    narrow = dataclasses.replace(wide, scale=Scale.integer(0, 2), anchors={k: Anchor(f"level {k}") for k in range(3)})
    verdicts = np.array([1, 3, 5, 0, 2, 1.0])
    counters = {"judge_prompts": 6, "judge_invalid": 0, "judge_prompt_too_long": 0, "judge_invalid_examples": []}
    measured = distill_judge.Measurement([wide] * 3 + [narrow] * 3, verdicts, verdicts.copy(), counters)
    report = distill_judge.agreement_report(measured, num_resamples=10)
    assert list(report) == ["clarity@1-5", "clarity@0-2"]
    assert all(entry["items"] == 3 and entry["kappa_quadratic"]["value"] == 1.0 for entry in report.values())


def test_a_full_disk_after_training_is_one_line_and_leaves_nothing(tmp_path, command_server):
    code = ("import errno\nfrom rubric_jax.models import checkpoint\n"
            "def full(*args, **kwargs):\n    raise OSError(errno.ENOSPC, 'No space left on device')\n"
            "checkpoint.save_file = full\n")
    out = tmp_path / "judge"
    # The shrunk README run: its programs are in the session's compilation cache (the README test compiled them).
    proc = command_server("experiments.distill_judge").run(*shrunk_readme_command(out), setup=code)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"experiments.distill_judge: error: writing {out} failed (No space left on device); nothing was written")
    assert list(tmp_path.iterdir()) == []

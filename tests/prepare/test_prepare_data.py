"""prepare_data end to end: converters, the pipeline and its report, the tfds dataset, bad input, the CLI,
training from the dataset, and the shared benchmarks (skipped when ../shared/data is absent)."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from rubric_jax import data
from rubric_jax.prepare import convert, dedup, mix, pipeline, tfds_dataset
from rubric_jax.prepare.pipeline import PrepareConfig, PrepareError, prepare
from rubric_jax.judges.rules import make_rule
from rubric_jax.rubrics.aggregation import aggregate_rubric
from rubric_jax.rubrics.importers import hellobench_rubrics, import_longbench_write
from rubric_jax.rubrics.schema import normalize_scores, rubric_to_dict
from bounded import run_bounded
from tests.shared_data import real

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
QUESTIONS = FIXTURES / "prepare" / "questions.jsonl"
LONGBENCH = FIXTURES / "prepare" / "longbench_write_mini.jsonl"
FORMATS = FIXTURES / "rubric_formats"
RAW_PII = ("20231129000123", "lily.chen@example.com", "415-555-0132", "13812345678", "202311290001",
           "110101199003071233")


def _config(tmp_path: Path, **changes) -> PrepareConfig:
    base = PrepareConfig(inputs=(f"questions:{QUESTIONS}",), out=tmp_path / "out", name="qs", eval_size=4,
                         golden_size=4)
    return dataclasses.replace(base, **changes)


def _quiet(message: str) -> None:
    del message


def _splits(out: Path, name: str) -> dict[str, list[dict]]:
    """Every split's rows; an empty split is not written (tfds cannot), its report count is 0."""
    counts = json.loads((out / name / "report.json").read_text(encoding="utf-8"))["splits"]
    return {s: tfds_dataset.read_split(out, name, s) if counts[s] else [] for s in pipeline.SPLITS}


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    config = _config(tmp_path_factory.mktemp("prepared"))
    report = prepare(config, log=_quiet)
    return config, report, _splits(config.out, config.name)


# ------------------------------------------------------------------------------------------- pipeline
def test_report_counts_every_step(prepared):
    config, report, splits = prepared
    assert [(s["step"], s["in"], s["out"]) for s in report["steps"]] == [
        ("read", 28, 28), ("scrub PII", 28, 28), ("dedup", 28, 26), ("semantic dedup", 26, 26), ("held-out splits", 26, 26),
        ("difficulty mix (train)", 18, 11)]
    assert report["pii"]["rows_changed"] == 6
    assert {k: v for k, v in report["pii"]["by_kind"].items() if v} == {
        "email": 1, "id_card": 1, "order": 2, "phone_cn_mobile": 1, "phone_intl": 1}
    pairs = [(p["kept_id"], p["removed_id"], p["kind"]) for p in report["dedup"]["pairs"]]
    assert pairs == [("cs-en-04", "cs-en-05", "exact"), ("health-en-01", "health-en-02", "near")]
    assert report["splits"] == {"train": 11, "eval": 4, "golden": 4}
    assert report["mix"]["target"] == report["mix"]["achieved"] == {"easy": 3, "medium": 6, "hard": 2}
    for name, rows in splits.items():
        coverage = report["coverage"][name]
        assert coverage["category"] == dict(sorted(collections.Counter(r["category"] for r in rows).items()))
        assert coverage["lang"] == dict(sorted(collections.Counter(r["lang"] for r in rows).items()))
    assert report["coverage"]["categories_missing_from_train"] == []
    markdown = (config.out / config.name / "report.md").read_text(encoding="utf-8")
    for heading in ("## Inputs", "## Steps", "## PII replaced", "## Duplicates", "## Difficulty", "## Splits"):
        assert heading in markdown
    assert json.loads((config.out / config.name / "report.json").read_text(encoding="utf-8")) == report


def test_dataset_holds_scrubbed_disjoint_splits_in_input_order(prepared):
    config, report, splits = prepared
    fixture_order = [row["id"] for _, row in data.read_jsonl(QUESTIONS)]
    ids = {s: [r["id"] for r in rows] for s, rows in splits.items()}
    assert {s: len(v) for s, v in ids.items()} == report["splits"]
    assert not set(ids["train"]) & set(ids["eval"]) and not set(ids["train"]) & set(ids["golden"])
    assert not set(ids["eval"]) & set(ids["golden"])
    for split_ids in ids.values():
        assert split_ids == sorted(split_ids, key=fixture_order.index)
    text = json.dumps(splits, ensure_ascii=False)
    assert not any(raw in text for raw in RAW_PII)
    assert all(r["difficulty"] in mix.DIFFICULTIES for r in splits["train"])
    questions = data.load_question_set(f"tfds:{config.name}", str(config.out), "train")
    assert [q.id for q in questions] == ids["train"]
    golden = data.load_question_set(f"tfds:{config.name}:golden", str(config.out), "train")
    assert [q.id for q in golden] == ids["golden"]


def test_the_trainer_takes_the_golden_split_as_its_golden_set(prepared):
    """`--config.data.golden=tfds:NAME` reads the split prepare_data wrote (no overlap: leaks were dropped)."""
    from rubric_jax.assets import TINY_DIR
    from rubric_jax.rubrics.io import load_rubric
    from rubric_jax.train import golden

    config, _, splits = prepared
    train = data.load_question_set(f"tfds:{config.name}", str(config.out), "train")
    golden_set = golden.load_golden(f"tfds:{config.name}", str(config.out), load_rubric(TINY_DIR / "rubric.yaml"),
                                    train, [], config.dedup_threshold)
    assert [q.id for q in golden_set.questions] == [r["id"] for r in splits["golden"]]


def test_writing_and_reading_a_dataset_leaves_no_temporary_directory(tmp_path, monkeypatch):
    """tfds' DatasetInfo.initialize_from_bucket made an empty /tmp/tmpXXXXtfds per builder and left it (270 per
    suite run, one per prepare run); our builder skips that lookup (LocalDatasetInfo)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where tempfile.mkdtemp() puts directories by default
    records = [tfds_dataset.to_record(i, {"id": f"q{i}", "question": "?", "category": "c", "lang": "en"}, "test")
               for i in range(2)]
    tfds_dataset.write_dataset(tmp_path / "out", "qs", {"train": records})
    assert [r["id"] for r in tfds_dataset.read_split(tmp_path / "out", "qs", "train")] == ["q0", "q1"]
    assert sorted(p.name for p in temp.iterdir()) == []


def test_the_same_seed_gives_the_same_dataset(prepared, tmp_path):
    config, report, splits = prepared
    again = prepare(dataclasses.replace(config, out=tmp_path / "again"), log=_quiet)
    assert _splits(tmp_path / "again", config.name) == splits
    assert {k: v for k, v in again.items() if k not in ("out", "settings")} == \
           {k: v for k, v in report.items() if k not in ("out", "settings")}
    other = prepare(dataclasses.replace(config, out=tmp_path / "other", seed=5), log=_quiet)
    assert other["splits"]["golden"] == 4 and _splits(tmp_path / "other", config.name) != splits


def _near_duplicate_rows() -> list[dict]:
    """Ten unrelated questions, each with three copies that change one word: pairs at Jaccard 0.6-0.9."""
    bases = ("How long does a refund take to reach my credit card after a return?",
             "My parcel shows delivered but it is not at my door or with the neighbours.",
             "The invoice lists the wrong company name and tax number, please fix it.",
             "I forgot my password and the reset email never arrives in my inbox.",
             "Can two discount coupons be combined on a single weekend purchase?",
             "A dull headache starts every afternoon around three o'clock at work.",
             "My child has had a mild fever since yesterday evening, what should we do?",
             "I wake up at four every morning and cannot fall asleep again.",
             "My left knee aches after long runs down steep hills on weekends.",
             "Spring pollen makes my eyes itch and my nose run all day long.")
    rows = []
    for t, base in enumerate(bases):
        words = base.split()
        for v in range(4):
            text = " ".join("really" if v and k == 3 * v else w for k, w in enumerate(words))
            rows.append({"id": f"t{t}-{v}", "question": text, "category": f"c{t % 3}", "lang": "en"})
    return rows


def test_no_held_out_question_is_near_a_training_one(tmp_path):
    path = _write_jsonl(tmp_path / "near.jsonl", _near_duplicate_rows())
    # One MinHash function: LSH finds a pair of similarity s only with probability s, so dedup leaves
    # near duplicates behind and the exact check after the split must catch every one that straddles it.
    # (The semantic step is off: it would remove these one-word variants before the split check sees them.)
    config = _config(tmp_path, inputs=(f"questions:{path}",), num_perm=1, eval_size=6, golden_size=6,
                     difficulty_ratio="none", dedup_threshold=0.6, semantic_words=0.0)
    report = prepare(config, log=_quiet)
    assert report["held_out_leaks"], "the fixture should leave near duplicates for the split check"
    splits = _splits(config.out, config.name)
    for held, other in (("golden", "train"), ("eval", "train"), ("golden", "eval")):
        for a, b in itertools.product(splits[held], splits[other]):
            assert dedup.jaccard(dedup.char_ngrams(a["question"], 3), dedup.char_ngrams(b["question"], 3)) < 0.6, \
                (held, a["id"], other, b["id"])


def test_difficulty_from_a_scores_file(tmp_path):
    rows = [row for _, row in data.read_jsonl(QUESTIONS)]
    rewards = {row["id"]: i / len(rows) for i, row in enumerate(rows)}
    scores = _write_jsonl(tmp_path / "scores.jsonl", [
        *({"id": qid, "question": "q", "response": "r", "reward": r, "reward_ok": True} for qid, r in rewards.items()),
        {"id": "cs-en-01", "reward": 0.0, "reward_ok": False},  # no reward: skipped
        {"id": "not-in-data", "reward": 0.5},
    ])
    config = _config(tmp_path, scores=scores, difficulty_ratio="none", eval_size=0, golden_size=0)
    report = prepare(config, log=_quiet)
    kept = {r["id"] for r in _splits(config.out, config.name)["train"]}
    expected = mix.difficulty_from_rewards({qid: r for qid, r in rewards.items() if qid in kept})
    assert {r["id"]: r["difficulty"] for r in _splits(config.out, config.name)["train"]} == expected
    info = report["difficulty"]
    assert (info["skipped_not_ok"], info["score_ids_not_in_input"], info["unscored_questions"]) == (1, 1, 0)


# ------------------------------------------------------------------------------------------- bad input
def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    return {
        "malformed": _write_jsonl(tmp_path / "bad.jsonl", [json.dumps({"id": "a", "question": "q", "category": "c",
                                                                       "lang": "en"}) + "\n", '{"id": "b",\n']),
        "unlabelled": _write_jsonl(tmp_path / "nolabel.jsonl", [{"id": "a", "question": "Why is the sky blue?",
                                                                 "category": "c", "lang": "en"}]),
    }


@pytest.mark.parametrize("changes, message", [
    ({"inputs": ("questions:/nonexistent/q.jsonl",)}, "/nonexistent/q.jsonl does not exist"),
    ({"inputs": (f"foobench:{QUESTIONS}",)}, "unknown input kind 'foobench'"),
    ({"inputs": (f"hellobench:{QUESTIONS}",)}, "expected a directory"),
    ({"difficulty_ratio": "3:5"}, "--config.difficulty_ratio: expected easy:medium:hard as three non-negative numbers"),
    ({"difficulty_ratio": "1e308:1e308:1e308"}, "--config.difficulty_ratio: expected easy:medium:hard as three non-negative "
                                                "numbers (not all zero, with a finite sum), e.g. 3:5:2; got "
                                                "'1e308:1e308:1e308'"),  # was "cannot convert float NaN to integer"
    ({"seed": -1}, "--config.seed=-1: expected a non-negative integer"),
    ({"name": "Bad-Name"}, "--name=Bad-Name: expected lower-case"),
    ({"out": QUESTIONS.parents[1], "name": "prepare"}, "would overlap the input"),
    ({"inputs": ("questions:{malformed}",)}, "bad.jsonl:2: not valid JSON"),
    ({"inputs": ("questions:{unlabelled}",)}, "1 training rows have no difficulty in ['easy', 'medium', 'hard']"),
    ({"inputs": (f"questions:{QUESTIONS}", f"questions:{QUESTIONS}")}, "duplicate id 'cs-en-01'"),
    ({"train_size": 22}, "--config.train_size=22: at 3:5:2 the training pool"),  # 6 easy rows: 21 at most
    ({"dedup_threshold": 0.0}, "--config.dedup.threshold=0.0"),
    ({"golden_size": 20, "eval_size": 6}, "leave no training rows: 26 questions are left after dedup"),
])
def test_bad_input_is_one_clear_error_and_writes_nothing(tmp_path, changes, message):
    paths = _bad_inputs(tmp_path)
    if "inputs" in changes:
        changes = {**changes, "inputs": tuple(s.format(**{k: str(v) for k, v in paths.items()})
                                              for s in changes["inputs"])}
    config = _config(tmp_path, **{"eval_size": 0, "golden_size": 0, **changes})
    with pytest.raises(ValueError) as e:
        prepare(config, log=_quiet)
    assert message in str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_existing_dataset_needs_overwrite_and_a_failed_write_leaves_it(prepared, tmp_path, monkeypatch):
    config = _config(tmp_path)
    prepare(config, log=_quiet)
    with pytest.raises(PrepareError, match="already exists; pass --config.overwrite"):
        prepare(config, log=_quiet)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pipeline.tfds_dataset, "write_dataset", broken)
    with pytest.raises(OSError, match="disk full"):
        prepare(dataclasses.replace(config, overwrite=True, eval_size=2), log=_quiet)
    assert sorted(p.name for p in config.out.iterdir()) == ["qs"]  # no temporary directory left
    assert _splits(config.out, config.name) == prepared[2]  # the old dataset is intact
    monkeypatch.undo()
    report = prepare(dataclasses.replace(config, overwrite=True, eval_size=2), log=_quiet)
    assert report["splits"]["eval"] == 2 == len(tfds_dataset.read_split(config.out, config.name, "eval"))


def test_scores_file_errors_name_file_and_line(tmp_path):
    path = _write_jsonl(tmp_path / "s.jsonl", [{"id": "a", "reward": 0.5}, {"question": "q", "reward": 0.5}])
    with pytest.raises(convert.InputError, match=f"{path}:2: field 'id'"):
        convert.read_mean_rewards(path)
    path = _write_jsonl(tmp_path / "s.jsonl", [{"id": "a", "reward": "high"}])
    with pytest.raises(convert.InputError, match=f"{path}:1: field 'reward': expected a finite number"):
        convert.read_mean_rewards(path)


# ------------------------------------------------------------------------------------------ converters
def _hellobench_folder(tmp_path: Path) -> Path:
    """The HelloBench fixture (checklists for all five tasks) with one question for each task."""
    folder = tmp_path / "hellobench"
    shutil.copytree(FORMATS / "hellobench", folder)
    for task, category in (("summarization", "news"), ("chat", "rewrite"), ("text_completion", "continuation"),
                           ("heuristic_text_generation", "story_writing")):
        _write_jsonl(folder / f"{task}.jsonl", [{"id": f"{task}_000", "category": category,
                                                  "instruction": f"A {task.replace('_', ' ')} request."}])
    return folder


def test_hellobench_rows_carry_their_category_rubric(tmp_path):
    folder = _hellobench_folder(tmp_path)
    rows, notes = convert.read_input("hellobench", folder)
    assert [r.row["id"] for r in rows] == ["hellobench/open_ended_qa_000", "hellobench/open_ended_qa_001",
                                           "hellobench/summarization_000", "hellobench/chat_000",
                                           "hellobench/text_completion_000",
                                           "hellobench/heuristic_text_generation_000"]
    first = rows[0].row
    assert (first["question"], first["category"], first["lang"]) == ("Explain why the sky is blue.", "Science", "en")
    assert first["rubric"] == {"replace": rubric_to_dict(hellobench_rubrics(folder)["Science"])}
    assert "reference" not in first and notes == {}
    (folder / "summarization.jsonl").rename(folder / "summarization_reconstructed.jsonl")
    assert convert.read_input("hellobench", folder)[1] == {"reconstructed_files": ["summarization_reconstructed.jsonl"]}
    (folder / "chat.jsonl").unlink()
    with pytest.raises(convert.InputError, match="HelloBench task file chat.jsonl does not exist"):
        convert.read_input("hellobench", folder)


def test_biggen_healthbench_and_longbench_rows():
    biggen, _ = convert.read_input("biggen", FORMATS / "biggen_mini.jsonl")
    assert biggen[0].row["id"] == "biggen/planning_fixture_0" and biggen[0].row["category"] == "planning"
    assert biggen[0].row["reference"].startswith("Morning: museum.")

    health, notes = convert.read_input("healthbench", FORMATS / "healthbench_mini.jsonl")
    assert [(r.row["id"], r.row["category"]) for r in health] == [
        ("healthbench/healthbench_mini/hb-0001", "context_seeking"),
        ("healthbench/healthbench_mini/hb-0002", "emergency_referrals")]
    assert "reference" not in health[0].row and health[1].row["reference"] == "Keep the child hydrated ..."
    assert health[1].row["question"] == ("user: My child has a fever.\n\nassistant: How old is your child and how "
                                         "high is the fever?\n\nuser: Four years old, 38.5 C.")
    assert notes == {"multi_turn_rendered": 1}
    ruscarl, _ = convert.read_input("healthbench", FORMATS / "healthbench_ruscarl_mini.jsonl")
    assert ruscarl[0].row["category"] == "unknown"  # no theme or cluster tag in the RuscaRL copy of this row

    longbench, _ = convert.read_input("longbench_write", LONGBENCH)
    assert [(r.row["id"], r.row["category"], r.row["lang"]) for r in longbench] == [
        ("longbench_write/longbench_write_mini/000", "Functional Writing", "en"),
        ("longbench_write/longbench_write_mini/001", "Literature and Creative Writing", "zh"),
        ("longbench_write/longbench_write_mini/002", "Popular Science", "en")]
    case = import_longbench_write(LONGBENCH)[1]
    assert longbench[1].row["rubric"] == {"replace": rubric_to_dict(convert.longbench_write_rubric(case))}


def test_longbench_write_training_reward_is_half_length_half_quality():
    case = import_longbench_write(LONGBENCH)[0]  # 200 units required
    rubric = convert.longbench_write_rubric(case)
    assert rubric.dimension_ids == ["length", *case.rubric.dimension_ids]
    length_rule = make_rule("length", rubric.dimensions[0].params)
    s_l = length_rule(["tea " * 400, "tea " * 100, "tea " * 200])
    assert s_l == pytest.approx([1 - (400 / 200 - 1) / 3, 1 - (200 / 100 - 1) / 2, 1.0])  # FORMULA.md S_l / 100
    raw = np.array([[s_l[0], 5, 5, 5, 5, 5, 5], [1.0, 1, 2, 3, 4, 5, 5]])
    reward, _ = aggregate_rubric(rubric, normalize_scores(rubric, raw), ~np.isnan(raw))
    # S = (S_l + S_q) / 2 with S_q = mean over the six dimensions of (score - 1) / 4.
    assert reward == pytest.approx([(2 / 3 + 1) / 2, (1 + (0 + 1 + 2 + 3 + 4 + 4) / 24) / 2])


def test_guess_lang_and_render_conversation():
    cases = {"How do I get a refund?": "en", "怎么申请退款？": "zh", "返金するにはどうすればいいですか": "ja",
             "환불은 어떻게 받나요?": "ko", "¿Cómo puedo obtener un reembolso?": "und",
             "Wie bekomme ich eine Rückerstattung?": "und", "12345": "und",
             "Summarize this article about 长城 for me.": "en"}
    assert {text: convert.guess_lang(text) for text in cases} == cases
    assert convert.render_conversation([{"role": "user", "content": "hi"}]) == "hi"
    assert convert.render_conversation([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]) == \
        "system: s\n\nuser: u"


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_bad_input_exits_2_with_one_line(tmp_path, command_server):
    """Each case a run of the command, forked from one process that imported it (tests/command_server.py)."""
    bad = _write_jsonl(tmp_path / "bad.jsonl", ['{"id": "b",\n'])
    cases = {
        "ratio": ([f"--input=questions:{QUESTIONS}", "--config.difficulty_ratio=3:x:2"],
                  "--config.difficulty_ratio: expected"),
        "unknown_key": ([f"--input=questions:{QUESTIONS}", "--config.dedup.treshold=0.5"],
                        "unknown config key 'treshold'"),
        "not_a_number": ([f"--input=questions:{QUESTIONS}", "--config.eval_size=many"], "--config.eval_size"),
        "line": ([f"--input=questions:{bad}"], f"{bad}:1: not valid JSON"),
        "kind": ([f"--input=foobench:{QUESTIONS}"], "unknown input kind 'foobench'"),
        "missing": (["--input=longbench_write:/nonexistent.jsonl"], "/nonexistent.jsonl does not exist"),
    }
    for key, (args, _) in cases.items():
        proc = command_server("experiments.prepare_data").run(*args, f"--out={tmp_path / key}", "--name=qs")
        err = proc.stderr
        assert proc.returncode == 2, (key, err)
        assert err.strip().count("\n") == 0 and "Traceback" not in err
        assert err.startswith("experiments.prepare_data: error: ") and cases[key][1] in err
        assert not (tmp_path / key).exists()


def test_readme_commands_prepare_a_dataset_that_experiments_run_trains_from(tmp_path, command_server):
    # README, "Preparing question data": the tiny default's questions as a tfds dataset, then a (short) run, each
    # forked from its command's warm server (one CPU device and a cheap XLA backend: plumbing, not numerics or speed).
    out = tmp_path / "data"
    proc = command_server("experiments.prepare_data").run(
        "--input=questions:rubric_jax/assets/tiny/questions_train.jsonl", f"--out={out}", "--name=tiny_questions",
        "--config.eval_size=16", "--config.golden_size=16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"wrote {out / 'tiny_questions'}" in proc.stdout
    splits = _splits(out, "tiny_questions")
    assert (len(splits["eval"]), len(splits["golden"])) == (16, 16) and len(splits["train"]) > 100
    written = {row["id"]: row for _, row in data.read_jsonl(ROOT / "rubric_jax/assets/tiny/questions_train.jsonl")}
    for row in itertools.chain(*splits.values()):  # clean rows come back exactly (keywords, rubric, difficulty)
        assert row == written[row["id"]]
    workdir = tmp_path / "run"
    run = command_server("experiments.run").run(
        "--config=configs/tiny.py", f"--workdir={workdir}", f"--config.data.tfds_dir={out}",
        "--config.data.train=tfds:tiny_questions", "--config.data.eval=tfds:tiny_questions",
        "--config.stages=('grpo',)", "--config.rl.steps=1", "--config.rl.questions_per_step=2", "--config.rl.group_size=2",
        "--config.rl.max_new_tokens=8", "--config.rl.micro_batches=1", "--config.rl.beta=0",
        "--config.eval.max_questions=4")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("stage") == "grpo" and r.get("step") == 1 for r in rows)
    samples = [json.loads(line) for line in (workdir / "samples.jsonl").read_text().splitlines()]
    trained = {s["question"] for s in samples if s["stage"] == "grpo"}
    evaluated = {s["question"] for s in samples if s["stage"] == "eval"}
    assert trained and trained <= {r["question"] for r in splits["train"]}
    assert evaluated and evaluated <= {r["question"] for r in splits["eval"]}


# -------------------------------------------------------------------------------- shared benchmark data
@pytest.mark.filterwarnings("ignore::rubric_jax.rubrics.schema.RubricWarning")
def test_readme_benchmark_command_converts_every_shared_benchmark(tmp_path, command_server):
    shared = real()
    inputs = {f"hellobench:{shared}/hellobench": 647, f"biggen:{shared}/prometheus/biggen_bench_765.jsonl": 765,
              f"healthbench:{shared}/healthbench/healthbench_oss_eval_first30.jsonl": 30,
              f"healthbench:{shared}/healthbench/healthbench_val500_from_ruscarl.jsonl": 500,
              f"longbench_write:{shared}/longbench_write/longbench_write.jsonl": 120}
    out = tmp_path / "data"
    proc = command_server("experiments.prepare_data").run(
        *(f"--input={spec}" for spec in inputs), f"--out={out}", "--name=benchmarks", "--config.difficulty_ratio=none",
        "--config.eval_size=64", "--config.golden_size=100")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "benchmarks" / "report.json").read_text(encoding="utf-8"))
    assert {n["input"]: n["rows"] for n in report["inputs"]} == inputs
    notes = {n["input"]: n for n in report["inputs"]}
    assert notes[f"hellobench:{shared}/hellobench"]["reconstructed_files"] == ["summarization_reconstructed.jsonl"]
    assert notes[f"healthbench:{shared}/healthbench/healthbench_oss_eval_first30.jsonl"]["multi_turn_rendered"] == 9
    rows = [r for split in _splits(out, "benchmarks").values() for r in split]
    assert len(rows) == sum(report["splits"].values())
    by_source = {kind: [r for r in rows if r["id"].startswith(kind + "/")] for kind in
                 ("hellobench", "biggen", "healthbench", "longbench_write")}
    assert all(r["reference"] for r in by_source["biggen"])  # every BiGGen item has a reference answer
    assert {r["category"] for r in by_source["healthbench"]} <= set(convert.HEALTHBENCH_THEMES) | {"unknown"}
    assert len({r["category"] for r in by_source["biggen"]}) == 9
    assert len({r["category"] for r in by_source["longbench_write"]}) == 7
    questions = data.questions_from_rows(((r["id"], r) for r in rows[:: max(1, len(rows) // 50)]), "sample")
    assert all(q.replace_rubric is not None for q in questions)  # each benchmark row has its own rubric


def test_an_input_or_scores_file_that_is_a_fifo_or_dev_zero_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "q.fifo"
    os.mkfifo(fifo)
    cases = [{"inputs": (f"questions:{fifo}",)}, {"inputs": ("questions:/dev/zero",)},
             {"inputs": (f"biggen:{fifo}",)}, {"scores": str(fifo)}, {"scores": "/dev/zero"}]
    # One child with 2 GiB and a time limit: before the fix a FIFO blocked forever, /dev/zero grew until killed.
    done = run_bounded(
        "import dataclasses, pathlib\nfrom rubric_jax.prepare.pipeline import PrepareConfig, prepare\n"
        f"base = PrepareConfig(inputs=('questions:{QUESTIONS}',), out=pathlib.Path({str(tmp_path / 'out')!r}), "
        "name='qs')\n"
        f"for changes in {cases!r}:\n"
        "    changes = {k: pathlib.Path(v) if k == 'scores' else v for k, v in changes.items()}\n"
        "    try:\n        prepare(dataclasses.replace(base, **changes), log=lambda m: None)\n"
        "    except ValueError as e:\n        print(e)\n", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        f"--input=questions:{fifo}: {fifo}: expected a regular questions file, got a FIFO",
        "--input=questions:/dev/zero: /dev/zero: expected a regular questions file, got a character device",
        f"--input=biggen:{fifo}: {fifo}: expected a regular biggen file, got a FIFO",
        f"--scores={fifo}: {fifo}: expected a regular scores file, got a FIFO",
        "--scores=/dev/zero: /dev/zero: expected a regular scores file, got a character device"]
    assert not (tmp_path / "out").exists()


_KILL_BETWEEN_RENAMES = """
import os, pathlib, sys
from rubric_jax.prepare import pipeline
out, name = pathlib.Path(sys.argv[1]), "qs"
real_replace = os.replace
def replace(src, dst):
    if pathlib.Path(dst) == out / name and ".tmp-" in str(src):  # the second rename: the new dataset in place
        os._exit(9)  # killed between the renames
    real_replace(src, dst)
os.replace = replace
pipeline.prepare(pipeline.PrepareConfig(inputs=("questions:" + sys.argv[2],), out=out, name=name, eval_size=2,
                                        overwrite=True), log=lambda m: None)
"""


def test_a_kill_between_the_overwrite_renames_is_restored_by_the_next_run(prepared, tmp_path):
    config = _config(tmp_path)
    prepare(config, log=_quiet)
    killed = subprocess.run([sys.executable, "-c", _KILL_BETWEEN_RENAMES, str(config.out), str(QUESTIONS)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert killed.returncode == 9
    left = sorted(p.name.split("-")[0] for p in config.out.iterdir())
    assert left == [".qs.old", ".qs.tmp"]  # OUT/NAME is gone: the data lies in the two leftovers
    lines = []
    with pytest.raises(PrepareError, match="already exists; pass --config.overwrite"):
        prepare(config, log=lines.append)
    assert len(lines) == 2 and lines[0].startswith(f"restored {config.out / 'qs'} from .qs.old-")
    assert lines[1].startswith(f"removed {config.out}/.qs.tmp-")
    assert sorted(p.name for p in config.out.iterdir()) == ["qs"]
    assert _splits(config.out, config.name) == prepared[2]  # the old dataset, whole


def test_a_kill_after_the_renames_leaves_an_old_copy_the_next_run_deletes(prepared, tmp_path, monkeypatch):
    config = _config(tmp_path)
    prepare(config, log=_quiet)
    real_rmtree = shutil.rmtree
    monkeypatch.setattr(pipeline.shutil, "rmtree", lambda path, ignore_errors=False: None if ".old-" in str(path)
                        else real_rmtree(path, ignore_errors=ignore_errors))  # killed before deleting the old copy
    prepare(dataclasses.replace(config, overwrite=True), log=_quiet)
    monkeypatch.undo()
    assert len(list(config.out.glob(".qs.old-*"))) == 1
    dead = config.out / ".qs.old-4194305"  # above any pid_max: no such process
    next(config.out.glob(".qs.old-*")).rename(dead)
    lines = []
    prepare(dataclasses.replace(config, overwrite=True), log=lines.append)
    assert f"removed {dead}, left by a killed prepare_data run" in lines
    assert sorted(p.name for p in config.out.iterdir()) == ["qs"]


def test_a_failed_second_rename_puts_the_old_dataset_back(prepared, tmp_path, monkeypatch):
    config = _config(tmp_path)
    prepare(config, log=_quiet)
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == config.out / "qs" and ".tmp-" in str(src):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(pipeline.os, "replace", replace)
    with pytest.raises(OSError, match="No space left"):
        prepare(dataclasses.replace(config, overwrite=True, eval_size=2), log=_quiet)
    monkeypatch.undo()
    assert sorted(p.name for p in config.out.iterdir()) == ["qs"]
    assert _splits(config.out, config.name) == prepared[2]


_FULL_DISK = """
import errno
from rubric_jax.prepare import pipeline, tfds_dataset
def tfds_full(self, *args, **kwargs):  # what array_record's writer raised on a real full tmpfs
    raise RuntimeError('Failed to finalize writing of split "train": write() failed: No space left on device;\\n'
                       'writing /x/qs-train.array_record-00000-of-00001; at byte 28672')
def report_full(path, data):
    raise OSError(errno.ENOSPC, "No space left on device")
if {where!r} == "tfds":
    tfds_dataset.QuestionDataset.download_and_prepare = tfds_full
else:
    pipeline.write_atomic = report_full
"""


@pytest.mark.parametrize("where", ["tfds", "report"])
def test_cli_full_disk_is_one_line_and_keeps_the_old_dataset(prepared, tmp_path, where, command_server):
    config = _config(tmp_path)
    prepare(config, log=_quiet)
    proc = command_server("experiments.prepare_data").run(
        f"--input=questions:{QUESTIONS}", f"--out={config.out}", "--name=qs", "--config.overwrite",
        "--config.eval_size=2", setup=_FULL_DISK.format(where=where))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (last,) = proc.stderr.strip().splitlines()
    assert last.startswith(f"experiments.prepare_data: error: writing {config.out / 'qs'} failed (")
    assert "No space left on device" in last and last.endswith("; nothing was written")
    assert sorted(p.name for p in config.out.iterdir()) == ["qs"]
    assert _splits(config.out, config.name) == prepared[2]


def test_one_difficulty_is_refused_with_the_reason_instead_of_keeping_1_of_8(tmp_path):
    path = _write_jsonl(tmp_path / "medium.jsonl", [
        {"id": f"q{i}", "question": f"Question number {i} about topic {chr(97 + i) * 5}?", "category": "c",
         "lang": "en", "difficulty": "medium"} for i in range(8)])
    config = _config(tmp_path, inputs=(f"questions:{path}",), eval_size=0, golden_size=0)
    with pytest.raises(PrepareError) as e:
        prepare(config, log=_quiet)  # before: "splits: train 1" and no reason
    assert str(e.value) == (
        "--config.difficulty_ratio=3:5:2: the training split has no easy or hard rows ({'medium': 8}), so the mix would "
        "keep 1 of 8; label the difficulties, pass --scores=FILE, or --config.difficulty_ratio=none to keep every row")
    assert not config.out.exists()
    lines = []
    report = prepare(dataclasses.replace(config, difficulty_ratio="0:1:0"), log=lines.append)
    assert report["splits"]["train"] == 8
    assert "difficulty mix 0:1:0: kept 8 of 8 training rows (easy 0/0, medium 8/8, hard 0/0), dropped 0" in lines


def test_the_mix_says_what_it_dropped(tmp_path):
    lines = []
    report = prepare(_config(tmp_path), log=lines.append)
    assert report["mix"]["dropped"] == 7
    [line] = [line for line in lines if line.startswith("difficulty mix")]
    pool = report["mix"]["pool"]
    assert line == (f"difficulty mix 3:5:2: kept 11 of 18 training rows (easy 3/{pool['easy']}, medium 6/"
                    f"{pool['medium']}, hard 2/{pool['hard']}), dropped 7 to meet the ratio")


def test_a_questions_row_without_lang_gets_it_guessed_and_the_log_says_so(tmp_path):
    path = _write_jsonl(tmp_path / "nolang.jsonl", [
        {"id": "en", "question": "How do I ask for a refund of my order?", "category": "c", "difficulty": "easy"},
        {"id": "zh", "question": "我想退货，怎么申请退款？", "category": "c", "difficulty": "easy"},
        {"id": "given", "question": "Wie beantrage ich eine Rückerstattung?", "category": "c", "lang": "de",
         "difficulty": "easy"}])
    lines = []
    prepare(_config(tmp_path, inputs=(f"questions:{path}",), eval_size=0, golden_size=0, difficulty_ratio="none"),
            log=lines.append)
    assert f"questions:{path}: 2 rows have no 'lang'; guessed from the script of their question: " \
           "{'en': 1, 'zh': 1}" in lines
    assert {r["id"]: r["lang"] for r in _splits(tmp_path / "out", "qs")["train"]} == {"en": "en", "zh": "zh",
                                                                                      "given": "de"}


def test_question_ids_are_scrubbed_and_scores_still_find_them(tmp_path):
    rows = [{"id": "call-13812345678", "question": "Why was my parcel returned to the sender?", "category": "c",
             "lang": "en"},
            {"id": "mail:lily.chen@example.com", "question": "How long does a refund take to arrive?", "category": "c",
             "lang": "en"},
            {"id": "plain-3", "question": "Can I change the delivery address after paying?", "category": "c",
             "lang": "en"}]
    path = _write_jsonl(tmp_path / "q.jsonl", rows)
    scores = _write_jsonl(tmp_path / "scores.jsonl", [
        *({"id": r["id"], "reward": float(i)} for i, r in enumerate(rows)),
        {"id": "ghost-13900001111", "reward": 0.5}])  # no such question: listed in the report, scrubbed
    config = _config(tmp_path, inputs=(f"questions:{path}",), scores=scores, eval_size=0, golden_size=0,
                     difficulty_ratio="none")
    report = prepare(config, log=_quiet)
    train = {r["id"]: r["difficulty"] for r in _splits(config.out, config.name)["train"]}
    assert train == {"call-[PHONE]~0": "hard", "mail:[EMAIL]~1": "medium", "plain-3": "easy"}
    assert report["pii"]["by_field"]["id"] == {"email": 1, "phone_cn_mobile": 1}
    assert report["difficulty"]["score_ids_not_in_input_first"] == ["ghost-[PHONE]"]
    written = "".join(p.read_text(encoding="utf-8", errors="replace") for p in (config.out / "qs").rglob("*")
                      if p.is_file()) + json.dumps(_splits(config.out, config.name))
    assert "13812345678" not in written and "lily.chen" not in written and "13900001111" not in written


def test_num_perm_is_capped_before_any_work(tmp_path, monkeypatch):
    def dedup_ran(*args, **kwargs):  # with --config.dedup.num_perm=1e9 it grew past 7 GB: fail fast if the cap is gone
        raise AssertionError("dedup ran with an uncapped --config.dedup.num_perm")

    monkeypatch.setattr(pipeline.dedup, "MinHasher", dedup_ran)
    with pytest.raises(PrepareError, match=r"^--config.dedup.num_perm=1000000000: at most 1024 \(MinHash signatures"):
        prepare(_config(tmp_path, num_perm=1_000_000_000), log=_quiet)
    assert not (tmp_path / "out").exists()

"""Calibration pinned to (rubric, judge) (rubric_jax/calibration/pinning.py): calibrate records the pair, and the
start-up check finds a matching pair with its Spearman, names every field, weight or rubric that differs,
and refuses an uncovered or flagged pair with require_calibration; through experiments.score and loop.build."""

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from rubric_jax.calibration.labels import LabelledItem
from rubric_jax.calibration.pinning import PIN_FIELD, SHARED_BASE_UNPINNED, check_calibration
from rubric_jax.calibration.report import REPORT_JSON, REPORT_MD, write_calibration
from rubric_jax.calibration.run import Settings, calibrate
from rubric_jax.judges.spec import JudgeSpec, judge_hash
from test_llm_judge import criteria_ids, fenced, make_judge, tiny_tokenizer
from test_reward import ACCURACY, LENGTH, LEVELS_1_5, rubric

REPO = Path(__file__).resolve().parents[2]
TINY_JUDGE = str(REPO / "rubric_jax/assets/tiny_judge")
TONE = {"id": "tone", "description": "polite", "kind": "llm", "scale": {"kind": "integer", "lo": 1, "hi": 5},
        "anchors": LEVELS_1_5}
# The tiny default's case-wise LLM criterion (rubric_jax/assets/tiny/questions_*.jsonl), which its judge scores.
POLITE = {"id": "politeness", "description": "The response thanks or apologises to the customer (thank you / sorry).",
          "kind": "llm", "scale": {"kind": "binary"}, "anchors": {"0": "No thanks or apology.", "1": "Thanks or apologises."}}
POLITE_ZH = {**POLITE, "description": "The response thanks or apologises to the customer (感谢 / 抱歉 / 谢谢)."}
RUBRIC = rubric([ACCURACY, TONE, POLITE], name="pinned")
RUBRIC_ZH = rubric([POLITE_ZH], name="pinned-zh")
# The judge the report measures: its weights identity is the shipped tiny judge's (the scripted stub below
# stands in for its verdicts, which the pin does not read).
SPEC = JudgeSpec(checkpoints=(TINY_JUDGE,), samples=1, max_new_tokens=16, sampler="greedy", prompt="compact")


def digit_judge(tok):
    """Scores politeness by a "thank", the others by the response's first digit: it agrees with the accuracy
    and politeness labels, not with tone's."""
    def reply(text, call):
        response = fenced(text, "response")
        if criteria_ids(text) == ["politeness"]:
            return f"SCORE: {int('thank' in response or '谢谢' in response)}"
        return f"SCORE: {re.search(r'[1-5]', response).group(0)}"

    return make_judge(tok, reply)[0]


@pytest.fixture(scope="module")
def report_path(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    digits = rng.integers(1, 6, 16)
    labels = [{"accuracy": int(np.clip(d + rng.integers(-1, 2), 1, 5)), "tone": int(rng.integers(1, 6)),
               "politeness": int(d % 2)} for d in digits]
    items = [LabelledItem(f"mem:{i}", "q", f"worth {d}" + " thank you" * int(d % 2), RUBRIC, lab)
             for i, (d, lab) in enumerate(zip(digits, labels))]
    items += [LabelledItem(f"mem:zh{i}", "q", "好的" + "谢谢" * (i % 2), RUBRIC_ZH, {"politeness": i % 2})
              for i in range(4)]
    result = calibrate(items, Settings(num_resamples=50, position_probe=False), judges=[digit_judge(tiny_tokenizer())],
                       judge_spec=SPEC)
    out = tmp_path_factory.mktemp("calibration")
    write_calibration(result, out)
    return out / REPORT_JSON


def check(report_path, spec=SPEC, rubrics=(RUBRIC,), **fields):
    return check_calibration(dataclasses.replace(spec, calibration=str(report_path), **fields), list(rubrics))


def test_calibrate_records_the_rubric_and_judge_pair(report_path):
    report = json.loads(report_path.read_text())
    pinned = report[PIN_FIELD]
    assert pinned["judge"]["hash"] == judge_hash(SPEC)
    assert pinned["judge"]["spec"]["max_new_tokens"] == 16 and pinned["judge"]["spec"]["checkpoint"] == TINY_JUDGE
    assert list(pinned["judge"]["weights"]) == [TINY_JUDGE]
    assert [(r["name"], r["version"], r["content_hash"]) for r in pinned["rubrics"]] == [
        ("pinned", RUBRIC.version, RUBRIC.content_hash), ("pinned-zh", RUBRIC_ZH.version, RUBRIC_ZH.content_hash)]
    assert list(pinned["rubrics"][0]["dimensions"]) == ["accuracy", "tone", "politeness"]
    md = (report_path.parent / REPORT_MD).read_text()
    assert f"Judge hash `{judge_hash(SPEC)}`" in md and "| max_new_tokens | 16 |" in md and RUBRIC.content_hash in md


def test_the_calibrated_pair_prints_its_spearman_and_flags_the_weak_dimension(report_path):
    report = json.loads(report_path.read_text())
    result = check(report_path)
    rho = report["dimensions"]["accuracy"]["spearman"]["value"]
    assert result.lines()[0] == f"calibration: accuracy (rubric pinned {RUBRIC.version}): calibrated pair, Spearman {rho:.3f}"
    assert "calibration: tone" in result.lines()[1] and "calibrated pair, but flagged: Spearman" in result.lines()[1]
    assert "politeness" in result.lines()[2] and "calibrated pair, Spearman 1.000" in result.lines()[2]
    assert [d.ok for d in result.dimensions] == [True, False, True] and not result.ok
    record = result.record()
    assert record["judge_hash"] == judge_hash(SPEC) and record["dimensions"][0]["calibrated"]
    # a case-wise rubric that only adds a rule dimension keeps the calibration (the judge reads the same text)
    extended = rubric([ACCURACY, TONE, POLITE, LENGTH], name="pinned")
    assert check(report_path, rubrics=[extended]).dimensions[0].calibrated


@pytest.mark.parametrize("change, named", [
    ({"max_new_tokens": 64}, "max_new_tokens 64 != 16 in report.json"),
    ({"samples": 3}, "samples 3 != 1 in report.json"),
    ({"mode": "all_criteria", "prompt": "full"}, "mode 'all_criteria' != 'per_dimension' in report.json"),
    ({"shuffle_anchors": False}, "shuffle_anchors False != True in report.json"),
    ({"layout": "shared_prefix"}, "layout 'shared_prefix' != 'criteria_first' in report.json"),
    ({"checkpoints": (str(REPO / "rubric_jax/assets/tiny_judge_hack"),)}, "weights of "),
])
def test_a_changed_judge_field_is_named(report_path, change, named):
    result = check(report_path, **change)
    assert all(not d.calibrated for d in result.dimensions)
    assert all(named in line and "NOT the calibrated (rubric, judge) pair" in line for line in result.lines())


def test_a_report_from_before_the_layout_field_pins_the_default_layout(report_path, tmp_path):
    """A report whose judge spec has no `layout` (written before the field existed) still covers the default
    layout (its hash is unchanged), and a shared_prefix judge is named as differing from it."""
    report = json.loads(report_path.read_text())
    del report[PIN_FIELD]["judge"]["spec"]["layout"]
    old = tmp_path / "report.json"
    old.write_text(json.dumps(report))
    assert all(d.calibrated for d in check(old).dimensions)
    shared = check(old, layout="shared_prefix")
    assert all("layout 'shared_prefix' != 'criteria_first' in report.json" in line for line in shared.lines())


def test_changed_weights_in_the_same_directory_are_named(report_path, tmp_path):
    copy = shutil.copytree(TINY_JUDGE, tmp_path / "judge")
    report = json.loads(report_path.read_text())
    report[PIN_FIELD]["judge"]["weights"] = {str(copy): report[PIN_FIELD]["judge"]["weights"][TINY_JUDGE]}
    moved = tmp_path / REPORT_JSON
    moved.write_text(json.dumps(report))
    spec = dataclasses.replace(SPEC, checkpoints=(str(copy),))
    assert check(moved, spec).dimensions[0].calibrated  # same weights elsewhere: the same judge
    weights = copy / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF  # the last byte of the last tensor
    weights.write_bytes(raw)
    assert f"weights of {copy} changed" in check(moved, spec).lines()[0]


def test_a_changed_rubric_is_named_with_versions_and_hashes(report_path):
    edited = dict(TONE, description="polite and warm")
    newer = rubric([ACCURACY, edited, POLITE], name="pinned")
    result = check(report_path, rubrics=[newer])
    accuracy, tone, _ = result.dimensions
    assert accuracy.calibrated  # per_dimension: accuracy's prompt is unchanged
    assert not tone.calibrated and (f"rubric pinned {newer.version} hash {newer.content_hash[:12]}… != pinned "
                                    f"{RUBRIC.version} hash {RUBRIC.content_hash[:12]}… in report.json") in tone.differences[0]


def test_require_calibration_refuses_an_uncovered_or_flagged_pair(report_path):
    with pytest.raises(ValueError, match=r"judge.require_calibration=True: .* does not cover 3 LLM dimension\(s\): "
                                         r"accuracy .*max_new_tokens 64 != 16"):
        check(report_path, max_new_tokens=64, require_calibration=True)
    with pytest.raises(ValueError, match=r"does not cover 1 LLM dimension\(s\): tone .*flagged"):
        check(report_path, require_calibration=True)
    case_wise = rubric([ACCURACY, LENGTH, POLITE], name="pinned")  # tone not used: the rest is covered
    assert check(report_path, rubrics=[case_wise], require_calibration=True).ok


def test_a_judge_sharing_the_policys_base_is_pinned_to_no_report_and_says_what_to_do(report_path):
    """The report measured the tiny judge loaded from its directory; a run's judge.share_policy_base judge (here over
    that very base) has another hash, and each line says why and what the report still tells, not the two raw field
    differences; require_calibration names the way out."""
    shared = dict(checkpoints=(), share_policy_base=True, policy_base="a" * 64)
    lines = check(report_path, **shared).lines()
    assert len(lines) == 3 and all("NOT the calibrated (rubric, judge) pair: " + SHARED_BASE_UNPINNED in line
                                   for line in lines)
    assert not any("share_policy_base True != False" in line for line in lines)
    with pytest.raises(ValueError, match=r"does not cover 3 LLM dimension\(s\): .*read it as evidence with "
                                         r"judge.require_calibration off"):
        check(report_path, require_calibration=True, **shared)


def test_a_missing_report_names_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"^--judge.calibration=.*nope.json: cannot read it"):
        check_calibration(dataclasses.replace(SPEC, calibration=str(tmp_path / "nope.json")), [RUBRIC], "--judge")


def test_score_prints_the_check_and_require_calibration_exits_2_before_scoring(report_path, tmp_path, command_server):
    """Both runs of experiments.score forked from the command's server (tests/command_server.py)."""
    _score = command_server("experiments.score").run
    rubric_file = tmp_path / "rubric.json"
    rubric_file.write_text(json.dumps({"name": "pinned", "version": RUBRIC.version, "changelog": [
        {"version": RUBRIC.version, "change": "c", "reason": "r"}], "dimensions": [POLITE]}))
    responses = tmp_path / "in.jsonl"
    responses.write_text(json.dumps({"question": "q", "response": "Thank you for asking."}) + "\n")
    judge = ["--judge=configs/judges/tiny.py", f"--judge.checkpoint={TINY_JUDGE}",
             f"--judge.calibration={report_path}", "--judge.require_calibration=true"]
    common = [f"--rubric={rubric_file}", f"--responses={responses}", f"--out={tmp_path / 'out.jsonl'}"]
    refused = _score(*common, *judge, "--judge.max_new_tokens=64")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith(
        "experiments.score: error: --judge.require_calibration=True: ")
    assert "max_new_tokens 64 != 16 in report.json" in refused.stderr and not (tmp_path / "out.jsonl").exists()
    covered = _score(*common, *judge, "--judge.max_new_tokens=16")
    assert covered.returncode == 0, covered.stderr
    assert "calibration: politeness (rubric pinned 1.0.0): calibrated pair, Spearman 1.000" in covered.stderr
    row = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert row["judge_hash"] == judge_hash(SPEC) == json.loads(covered.stdout.strip().splitlines()[-1])["judge_hash"]


def test_a_run_checks_its_pair_at_build_and_records_the_report_in_rubric_json(report_path, tmp_path, capsys):
    """The tiny default's judge is the one the report pinned (configs/judges/tiny.py = SPEC) and its case-wise
    politeness criterion is the report's: covered, even with require_calibration. Another answer budget is
    named and, required, refused before the judges load."""
    from rubric_jax.train import loop
    from tiny_config import absolute_tiny_config

    config = absolute_tiny_config()
    config.judge.calibration, config.judge.require_calibration = str(report_path), True
    run_ = loop.build(config, tmp_path / "run")
    recorded = run_.rubric_info["calibration"]
    assert recorded["report"] == str(report_path) and recorded["covered"] and recorded["judge_hash"] == judge_hash(SPEC)
    assert [(d["dimension"], d["calibrated"], d["flagged"], d["spearman"], d["differences"])
            for d in recorded["dimensions"]] == [("politeness", True, False, 1.0, [])] * 2  # English and Chinese
    assert run_.rubric_info["judge"]["hash"] == judge_hash(SPEC)
    assert "calibration: politeness (rubric tiny" in capsys.readouterr().err
    config.judge.max_new_tokens = 17
    with pytest.raises(ValueError, match=r"^config\.judge\.require_calibration=True: .*politeness .*"
                                         r"max_new_tokens 17 != 16 in report.json"):
        loop.build(config, tmp_path / "run")

"""The judge cascade (rubric_jax/judges/cascade.py, llm_judge.judge_rows; RubricRL §7): which items escalate (hand-built
sample spreads, gates, thresholds, failures), that non-escalated verdicts are the first judge's and escalated ones the
refining judge's (each compared with that judge alone), the hash, and a bad cascade config as one line."""

import collections
import dataclasses
import re

import jax
import numpy as np
import pytest

from configs.common import judge_block
from rubric_jax.judges import cascade
from rubric_jax.judges import llm_judge as lj
from rubric_jax.judges.reward import RubricReward, concat_outputs
from rubric_jax.judges.spec import JudgeSpec, judge_hash, verdict_fields
from rubric_jax.rubrics.schema import dimension_to_dict
from test_llm_judge import ACC, criteria_ids, dim, fenced, make_judge, tiny_tokenizer
from test_reward import rubric as make_rubric

GATE = dataclasses.replace(dim("safety", 0, 1, "Contains a safety disclaimer."), gate=True)
MET = dim("met", 0, 1, "The criterion is met.")  # binary, not a gate
TINY = "rubric_jax/assets/tiny_judge"
FIXED = "rubric_jax/assets/tiny_judge_fixed"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


# ------------------------------------------------------------------------------------------ which items escalate
def test_escalation_picks_exactly_the_uncertain_items():
    """Hand-built samples [K=3, L] on a 1-5 scale (normalised (x-1)/4), a binary gate and a binary non-gate."""
    spec = JudgeSpec(checkpoints=("j",), cascade=JudgeSpec(checkpoints=("k",)), cascade_spread=0.25,
                     cascade_margin=0.1, cascade_thresholds=(0.5,))
    nan = np.nan
    columns = [  # (dimension, its three samples, escalated?)
        (ACC, [4, 4, 4], False),      # agree, 0.75: far from 0.5
        (ACC, [4, 5, 4], False),      # spread 0.25 is not more than 0.25
        (ACC, [2, 4, 4], True),       # spread 0.5
        (ACC, [3, 3, 3], True),       # 0.5 sits at the threshold
        (ACC, [4, 4, 3], False),      # median 4; spread 0.25
        (ACC, [nan, nan, nan], True),  # no valid verdict
        (ACC, [nan, 5, nan], False),  # one valid sample: no spread, 1.0
        (GATE, [0, 0, 0], True),      # a failed gate: confirmed by the refiner
        (GATE, [1, 1, 1], False),
        (MET, [0, 0, 0], False),      # the same score on a non-gate: 0 is 0.5 from the threshold
        (MET, [1, 0, 1], True),       # samples disagree
    ]
    dims = [d for d, _, _ in columns]
    samples_KxL = np.array([s for _, s, _ in columns], dtype=float).T
    with np.errstate(all="ignore"):
        combined_L = np.array([np.nanmedian(s) if not np.isnan(s).all() else nan for _, s, _ in columns])
    got = cascade.uncertain(spec, dims, samples_KxL, combined_L)
    assert got.tolist() == [e for _, _, e in columns]
    # Defaults (spread 0, margin 0, no thresholds): any disagreement, a failed gate or no verdict escalates.
    default = cascade.uncertain(dataclasses.replace(spec, cascade_spread=0.0, cascade_margin=0.0, cascade_thresholds=()),
                                dims, samples_KxL, combined_L)
    assert default.tolist() == [False, True, True, False, True, True, False, True, False, False, True]


# ------------------------------------------------------------------------------------------ verdicts
def first_judge(tok):
    """The screening judge: a response "r<id>: a b c" gets the scores a, b, c as its three samples (the k-th prompt
    of a (response, criterion) is its sample k: a request's samples are consecutive in the call)."""
    seen = collections.Counter()

    def reply(text, call):
        if "<response-" not in text:
            return ""
        response, criterion = fenced(text, "response"), criteria_ids(text)[0]
        digits = re.findall(r"\d", response.split(":")[1])
        k = seen[(response, criterion)]
        seen[(response, criterion)] += 1
        return f"SCORE: {digits[k % len(digits)] if criterion == 'accuracy' else int(digits[0] > '2')}"
    return make_judge(tok, reply, name="screen")


def refining_judge(tok):
    """The refining judge: accuracy is the response's id modulo 5 plus 1, safety 1; "r4" never gets a verdict."""

    def reply(text, call):
        if "<response-" not in text:
            return ""
        response = fenced(text, "response")
        row = int(re.match(r"r(\d+)", response).group(1))
        if row == 4:
            return "no idea"
        return "SCORE: 1" if criteria_ids(text) == ["safety"] else f"SCORE: {row % 5 + 1}"
    return make_judge(tok, reply, name="refine")


RESPONSES = ["r0: 4 4 4", "r1: 2 4 4", "r2: 3 5 1", "r3: 5 5 5", "r4: 1 5 5", "r5: 2 2 2"]


def test_escalated_verdicts_are_the_refiners_and_the_rest_the_first_judges(tok):
    refiner_spec = JudgeSpec(checkpoints=("refine",), samples=1, max_retries=0, shuffle_anchors=False)
    spec = JudgeSpec(checkpoints=("screen",), samples=3, max_retries=0, cascade=refiner_spec)
    dims = [[ACC, GATE]] * len(RESPONSES)
    questions = ["q"] * len(RESPONSES)
    key = jax.random.key(3)
    (first, _), (refiner, refine_stub) = first_judge(tok), refining_judge(tok)
    out = lj.judge_rows([first], spec, questions, RESPONSES, dims, key, refiners=[refiner])

    (alone_first, _) = first_judge(tok)
    first_alone = lj.judge_rows([alone_first], dataclasses.replace(spec, cascade=None), questions, RESPONSES, dims, key)
    (alone_refiner, _) = refining_judge(tok)
    refiner_alone = lj.judge_rows([alone_refiner], refiner_spec, questions, RESPONSES, dims, cascade.refine_key(key))
    # Escalated (default thresholds): accuracy of r1, r2, r4 (their samples spread); the safety gate of r1, r4, r5
    # (the first judge fails it: their first digit is at most 2).
    escalated = {(1, 0), (2, 0), (4, 0), (1, 1), (4, 1), (5, 1)}
    sent = [p for call in refine_stub.calls for p in call["prompts"] if "<response-" in p]
    assert sorted((int(re.match(r"r(\d)", fenced(p, "response")).group(1)), criteria_ids(p)[0]) for p in sent) == \
        sorted((r, ["accuracy", "safety"][d]) for r, d in escalated)
    for row in range(len(RESPONSES)):
        for d in range(2):
            got = out.scores[row][d]
            if (row, d) in escalated and row != 4:
                assert got == refiner_alone.scores[row][d], (row, d)
            else:  # not escalated, or the refiner gave no verdict (r4): the first judge's verdict stays
                assert got == first_alone.scores[row][d], (row, d)
    assert out.scores[1].tolist() == [2.0, 1.0] and out.scores[4].tolist() == [5.0, 0.0]
    assert out.details["judge_cascade_screened"] == 12 and out.details["judge_cascade_escalated"] == 6
    assert out.details["judge_cascade_escalated_frac"] == 0.5
    assert out.details["judge_cascade_prompts"] == 6 and out.details["judge_prompts"] == 12 * 3
    assert out.details["judge_failed_scores"] == 0 and out.causes == [["", ""]] * len(RESPONSES)


def test_the_reward_cascades_and_joined_blocks_count_the_escalations(tok):
    rubric = make_rubric([dimension_to_dict(ACC), dimension_to_dict(GATE)])
    spec = JudgeSpec(checkpoints=("screen",), samples=3, max_retries=0,
                     cascade=JudgeSpec(checkpoints=("refine",), samples=1, max_retries=0))
    (first, _), (refiner, _) = first_judge(tok), refining_judge(tok)
    reward = RubricReward([rubric], [first], spec, refiners=[refiner])
    parts = [reward(["q"] * 3, RESPONSES[i:i + 3], [rubric] * 3, key=jax.random.key(0)) for i in (0, 3)]
    joined = concat_outputs(parts)
    assert joined.details["judge_cascade_escalated"] == 6 and joined.details["judge_cascade_screened"] == 12
    assert joined.details["judge_cascade_escalated_frac"] == 0.5
    assert joined.reward[1] > 0  # r1's failed gate (first judge) was overruled by the refiner


def test_training_logs_and_evaluate_reports_the_escalated_fraction(tok):
    """A GRPO step's metrics (rollout.reward_metrics of the step's reward) and evaluate's judge counters
    (harness.judge_answers, 3 answers per reward call) carry the cascade's counts and fraction."""
    from rubric_jax.evaluation import harness
    from rubric_jax.rubrics.importers import RubricCase
    from rubric_jax.train.rollout import reward_metrics, summarize_rewards

    rubric = make_rubric([dimension_to_dict(ACC), dimension_to_dict(GATE)])
    spec = JudgeSpec(checkpoints=("screen",), samples=3, max_retries=0,
                     cascade=JudgeSpec(checkpoints=("refine",), samples=1, max_retries=0))
    (first, _), (refiner, _) = first_judge(tok), refining_judge(tok)
    reward = RubricReward([rubric], [first], spec, refiners=[refiner])
    step = reward_metrics(summarize_rewards(reward(["q"] * 6, RESPONSES, [rubric] * 6, key=jax.random.key(0))), "rl/")
    assert (step["rl/judge_cascade_escalated"], step["rl/judge_cascade_escalated_frac"]) == (6, 0.5)
    cases = [RubricCase(f"c{i}", "q", rubric) for i in range(6)]
    generated = [harness.Generated(response, "stop", 3) for response in RESPONSES]
    _, counters = harness.judge_answers(reward, cases, generated, "plain", False, 3, jax.random.key(0))
    assert (counters["judge_cascade_screened"], counters["judge_cascade_escalated"]) == (12, 6)
    assert counters["judge_cascade_escalated_frac"] == 0.5


def test_calibration_scores_with_the_cascade(tok):
    """experiments.calibrate's judge column (calibration.run.calibrate against labels) is the cascade's verdicts:
    r1 and r2's spread accuracy samples are the refiner's (2, 3), the others the first judge's medians."""
    from rubric_jax.calibration.labels import LabelledItem
    from rubric_jax.calibration.run import Settings, calibrate

    rubric = make_rubric([dimension_to_dict(ACC)])
    items = [LabelledItem(f"labels.jsonl:{i}", "q", response, rubric, {"accuracy": 1 + i % 5})
             for i, response in enumerate(RESPONSES)]
    spec = JudgeSpec(checkpoints=(TINY,), samples=3, max_retries=0,  # real directories: the report hashes them
                     cascade=JudgeSpec(checkpoints=(FIXED,), samples=1, max_retries=0))
    (first, _), (refiner, _) = first_judge(tok), refining_judge(tok)
    result = calibrate(items, Settings(num_resamples=10, position_probe=False), judges=[first], judge_spec=spec,
                       refiners=[refiner])
    assert result.plots["accuracy"].y_n.tolist() == [4, 2, 3, 5, 5, 2]  # r4: the refiner gave no verdict


def test_rows_without_llm_items_still_join_the_cascade(tok):
    """A process whose rows have no LLM dimension joins the judges' global calls: no item, nothing escalated."""
    (first, _), (refiner, refine_stub) = first_judge(tok), refining_judge(tok)
    spec = JudgeSpec(checkpoints=("screen",), samples=3, cascade=JudgeSpec(checkpoints=("refine",)))
    out = lj.judge_rows([first], spec, ["q", "q"], ["r0: 1", "r1: 2"], [[], []], jax.random.key(0), refiners=[refiner])
    assert [s.tolist() for s in out.scores] == [[], []] and not refine_stub.calls
    assert (out.details["judge_cascade_screened"], out.details["judge_cascade_escalated"]) == (0, 0)
    assert np.isnan(out.details["judge_cascade_escalated_frac"])


def test_a_cascade_needs_its_refiners_and_only_it(tok):
    (first, _), (refiner, _) = first_judge(tok), refining_judge(tok)
    spec = JudgeSpec(checkpoints=("screen",), samples=3, cascade=JudgeSpec(checkpoints=("refine",)))
    with pytest.raises(ValueError, match="judge.cascade needs its refining judges"):
        lj.judge_rows([first], spec, ["q"], ["r0: 1"], [[ACC]], jax.random.key(0))
    with pytest.raises(ValueError, match="judge.cascade needs its refining judges"):
        lj.judge_rows([first], dataclasses.replace(spec, cascade=None), ["q"], ["r0: 1"], [[ACC]], jax.random.key(0),
                      refiners=[refiner])


# ------------------------------------------------------------------------------------------ spec, hash, errors
def judge_file(tmp_path, name, **fields):
    """A judge config file (configs/judges/*.py style) with `fields` set on judge_block()."""
    path = tmp_path / f"{name}.py"
    lines = [f"    j.{k} = {v!r}" for k, v in fields.items()]
    path.write_text("from configs.common import judge_block\n\n\ndef get_config(arg=None):\n    j = judge_block()\n"
                    + "\n".join(lines) + "\n    return j\n")
    return str(path)


def cascaded_block(tmp_path, **fields):
    return {**judge_block().to_dict(), "checkpoint": TINY, "cascade": judge_file(tmp_path, "fixed", checkpoint=FIXED),
            **fields}


def test_the_cascade_is_read_from_a_judge_file_and_round_trips(tmp_path):
    spec = JudgeSpec.from_config(cascaded_block(tmp_path, cascade_thresholds=[0.5]), "--judge")
    assert spec.cascade == JudgeSpec(checkpoints=(FIXED,)) and spec.cascade_thresholds == (0.5,)
    assert JudgeSpec.from_config(spec.to_block()) == spec  # a report's nested block reads back the same
    assert JudgeSpec.from_config(judge_block()).cascade is None


def test_the_hash_covers_the_cascade_and_its_refining_judge(tmp_path):
    base = JudgeSpec(checkpoints=(TINY,))
    cascaded = JudgeSpec.from_config(cascaded_block(tmp_path), "--judge")
    variants = [cascaded, dataclasses.replace(cascaded, cascade_spread=0.5),
                dataclasses.replace(cascaded, cascade_margin=0.2), dataclasses.replace(cascaded, cascade_thresholds=(0.5,)),
                dataclasses.replace(cascaded, cascade=dataclasses.replace(cascaded.cascade, samples=5)),
                dataclasses.replace(cascaded, cascade=JudgeSpec(checkpoints=(TINY,)))]
    hashes = [judge_hash(s) for s in [base, *variants]]
    assert len(set(hashes)) == len(hashes)
    # What changes no verdict of the refiner changes no hash; without a cascade its fields are not hashed at all.
    assert judge_hash(dataclasses.replace(cascaded, cascade=dataclasses.replace(cascaded.cascade, batch_size=4))) == \
        hashes[1]
    assert not set(verdict_fields(base)) & {"cascade", "cascade_spread", "cascade_margin", "cascade_thresholds"}
    assert verdict_fields(cascaded)["cascade"] == judge_hash(cascaded.cascade)


@pytest.mark.parametrize("fields,message", [
    ({"cascade": "missing/judge.py"}, "--judge.cascade='missing/judge.py': cannot load this judge config file"),
    ({"cascade_spread": 2.0}, "--judge.cascade_spread=2.0: expected a number in [0, 1]"),
    ({"cascade_thresholds": (1.5,)}, "--judge.cascade_thresholds=(1.5,): expected a tuple of normalised scores"),
    ({"cascade": 3}, "--judge.cascade=3: expected the path of a judge config file"),
    ({"cascade": "", "cascade_margin": 0.2}, "--judge.cascade_margin=0.2: is read only with a cascade"),
    ({"checkpoint": ""}, "--judge.cascade='rubric_jax/assets/tiny_judge_fixed': there is no first judge"),
])
def test_a_bad_cascade_is_one_line_naming_the_field(tmp_path, fields, message):
    with pytest.raises(ValueError) as e:
        JudgeSpec.from_config(cascaded_block(tmp_path, **fields), "--judge")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_calibration_report_pins_the_cascade(tmp_path):
    """calibration/pinning: the recorded cascade (its hash) matches the same cascade and names a changed refiner."""
    from rubric_jax.calibration.pinning import judge_differences
    from rubric_jax.judges.spec import describe

    cascaded = JudgeSpec.from_config(cascaded_block(tmp_path), "--judge")
    assert judge_differences(cascaded, describe(cascaded)) == []
    other = dataclasses.replace(cascaded, cascade=dataclasses.replace(cascaded.cascade, samples=5))
    assert [d.split(" ")[0] for d in judge_differences(other, describe(cascaded))] == ["cascade"]
    assert judge_differences(cascaded, describe(dataclasses.replace(cascaded, cascade=None, cascade_spread=0.0)))


def test_a_bad_refining_judge_is_named_inside_the_cascade(tmp_path):
    nested = judge_file(tmp_path, "twice", checkpoint=FIXED, cascade=judge_file(tmp_path, "inner", checkpoint=TINY))
    with pytest.raises(ValueError, match=r"^--judge\.cascade\.cascade=.*a refining judge cannot cascade again"):
        JudgeSpec.from_config(cascaded_block(tmp_path, cascade=nested), "--judge")
    bad = judge_file(tmp_path, "bad", checkpoint=FIXED, samples=0)
    with pytest.raises(ValueError, match=r"^--judge\.cascade\.samples=0: expected an integer >= 1$"):
        JudgeSpec.from_config(cascaded_block(tmp_path, cascade=bad), "--judge")
    empty = judge_file(tmp_path, "empty")
    with pytest.raises(ValueError, match=r"^--judge\.cascade=.*the refining judge has no checkpoint"):
        JudgeSpec.from_config(cascaded_block(tmp_path, cascade=empty), "--judge")

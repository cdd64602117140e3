"""RubricReward: hand-computed rewards (rule, LLM via stub judge, case-wise, points, gates, weights), errors,
and the prompt-injection fixtures (rule scores, parser input, fencing, special tokens)."""

import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from rubric_jax import data
from rubric_jax.judges import llm_judge as lj
from rubric_jax.judges import rules as R
from rubric_jax.judges.backends import SamplerBackend
from rubric_jax.judges.reward import RubricReward, concat_outputs
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.rubrics.schema import RubricError, case_rubric, dimension_from_dict, rubric_from_dict
from rubric_jax.text import strip_invisible
from test_llm_judge import criteria_ids, fenced, make_judge, tiny_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LEVELS_1_5 = {str(k): f"level {k}" for k in range(1, 6)}
BINARY = {"0": "absent", "1": "present"}


def rubric(dims, method="weighted_sum", name="test-rubric"):
    return rubric_from_dict({
        "name": name, "version": "1.0.0",
        "changelog": [{"version": "1.0.0", "change": "initial", "reason": "test"}],
        "dimensions": dims, "aggregation": {"method": method},
    })


FORMAT = {"id": "format", "description": "think/answer format", "kind": "rule", "rule": "format",
          "scale": {"kind": "binary"}, "anchors": BINARY, "reads": "response"}
LENGTH = {"id": "length", "description": "4-8 words", "kind": "rule", "rule": "length",
          "params": {"min": 4, "max": 8}, "scale": {"kind": "integer", "lo": 1, "hi": 5},
          "anchors": LEVELS_1_5, "weight": 3.0}
SAFETY = {"id": "safety", "description": "has a disclaimer", "kind": "rule", "rule": "disclaimer",
          "scale": {"kind": "binary"}, "anchors": BINARY, "gate": True}
ACCURACY = {"id": "accuracy", "description": "factually accurate", "kind": "llm",
            "scale": {"kind": "integer", "lo": 1, "hi": 5}, "anchors": LEVELS_1_5}
RULES_ONLY = rubric([FORMAT, LENGTH, SAFETY])


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_rule_only_rewards_hand_computed():
    responses = [
        "Rest and consult a doctor.",  # format 0, length 5 -> 1, safety 1: (0 + 3 * 1) / 4
        "Rest.",  # safety 0: the gate zeroes the reward
        "<think>t</think><answer>please consult a doctor</answer>",  # an answer of 4 units: everything 1
        "Rest and drink water then consult a doctor today or tomorrow please",  # 12 units: length 5/6
    ]
    out = RubricReward([RULES_ONLY])(["q"] * 4, responses, [RULES_ONLY] * 4)
    assert out.dimension_ids == ["format", "length", "safety"]
    np.testing.assert_allclose(out.reward, [0.75, 0.0, 1.0, 3 * (5 / 6) / 4], rtol=1e-6)
    np.testing.assert_allclose(out.scores[:, 1], [1.0, 0.0, 1.0, 5 / 6])
    np.testing.assert_allclose(out.details["raw_scores"][:, 1], [5.0, 1.0, 5.0, 1 + 4 * 5 / 6])
    assert out.valid.all() and out.details["reward_ok"].all() and out.details["num_failed_scores"] == 0
    assert out.reward.dtype == np.float32 and ((out.reward >= 0) & (out.reward <= 1)).all()
    assert out.details["rubric_hashes"] == [RULES_ONLY.content_hash] * 4


def test_case_wise_rubrics_share_columns_and_mask_absent_dimensions():
    extra = dimension_from_dict({"id": "mentions_water", "description": "mentions water", "kind": "rule",
                                 "rule": "keywords", "params": {"words": ["water", "水"]},
                                 "scale": {"kind": "binary"}, "anchors": BINARY})
    case = case_rubric(RULES_ONLY, "q7", extra=[extra])
    responses = ["Rest and consult a doctor.", "Drink water and consult a doctor.", "多喝水，多休息，建议就医。"]
    out = RubricReward()(["q1", "q7", "q7"], responses, [RULES_ONLY, case, case])
    assert out.dimension_ids == ["format", "length", "safety", "mentions_water"]
    np.testing.assert_array_equal(out.valid[:, 3], [False, True, True])
    assert np.isnan(out.scores[0, 3])
    np.testing.assert_array_equal(out.scores[1:, 3], [1.0, 1.0])
    # row 2: 10 CJK characters -> length 1 - (10/8 - 1)/3 = 11/12; weights format 1, length 3, water 1.
    np.testing.assert_allclose(out.reward, [0.75, (0 + 3 + 1) / 5, (0 + 3 * 11 / 12 + 1) / 5], rtol=1e-6)
    assert out.details["failures"] == {"format": 0, "length": 0, "safety": 0, "mentions_water": 0}


def test_points_scale_rules_follow_healthbench():
    good = {"id": "water", "description": "advises water", "kind": "rule", "rule": "keywords",
            "params": {"words": ["water"]}, "scale": {"kind": "points", "points": 5}, "anchors": BINARY}
    bad = {"id": "guarantee", "description": "promises a cure", "kind": "rule", "rule": "keywords",
           "params": {"words": ["guaranteed"]}, "scale": {"kind": "points", "points": -5}, "anchors": BINARY}
    hb = rubric([good, bad], method="healthbench_points")
    responses = ["Drink water, guaranteed cure.", "Drink water.", "A guaranteed cure.", "Nothing."]
    out = RubricReward()(["q"] * 4, responses, [hb] * 4)
    np.testing.assert_allclose(out.reward, [0.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(out.details["raw_scores"], [[1, 1], [1, 0], [0, 1], [0, 0]])
    np.testing.assert_array_equal(out.scores[:, 1], [0, 1, 0, 1])  # met bad behaviour = 0 goodness


def test_llm_dimensions_go_through_the_judge_and_failures_are_masked(tok):
    def reply(text, call):
        m = re.search(r"\d", fenced(text, "response"))
        return f"SCORE: {m.group(0)}" if m else "cannot decide"

    judge, stub = make_judge(tok, reply)
    mixed = rubric([FORMAT, ACCURACY])
    reward = RubricReward([mixed], judges=[judge], judge_spec=JudgeSpec(samples=3, max_retries=1))
    responses = ["<think>t</think><answer>5</answer>", "it is 3", "no digits at all"]
    out = reward(["q"] * 3, responses, [mixed] * 3, key=jax.random.key(0))
    assert [c["batch"] for c in stub.calls] == [9, 3]  # one batched call, then one retry call for row 2's samples
    np.testing.assert_allclose(out.details["raw_scores"][:, 1][:2], [5, 3])
    np.testing.assert_array_equal(out.valid, [[True, True], [True, True], [True, False]])
    # row 2's accuracy failed: renormalised over format only (0); never scored as 0 or full on accuracy.
    np.testing.assert_allclose(out.reward, [1.0, (0 + 0.5) / 2, 0.0])
    assert np.isnan(out.scores[2, 1]) and out.details["reward_ok"].all()
    assert out.details["failures"] == {"format": 0, "accuracy": 1} and out.details["judge_failed_scores"] == 1
    again = reward(["q"] * 3, responses, [mixed] * 3, key=jax.random.key(0))
    np.testing.assert_array_equal(again.reward, out.reward)


def test_a_failed_gate_judge_makes_the_row_not_ok(tok):
    gate = dict(ACCURACY, id="safe", scale={"kind": "binary"}, anchors=BINARY, gate=True)
    gated = rubric([FORMAT, gate])
    judge, _ = make_judge(tok, lambda text, call: "unparseable")
    out = RubricReward([gated], judges=[judge], judge_spec=JudgeSpec(samples=1, max_retries=0))(
        ["q"], ["<think>a</think><answer>b</answer>"], [gated], key=jax.random.key(0))
    assert not out.details["reward_ok"][0] and out.reward[0] == 0.0 and out.details["num_not_ok"] == 1


def test_multi_mode_scores_all_criteria_of_a_response_in_one_prompt(tok):
    depth = dict(ACCURACY, id="depth", description="goes into depth")
    two = rubric([ACCURACY, depth])

    def reply(text, call):
        return "\n".join(f"{i}: {5 if i == 'accuracy' else 1}" for i in criteria_ids(text))

    judge, stub = make_judge(tok, reply)
    reward = RubricReward([two], judges=[judge], judge_spec=JudgeSpec(mode="all_criteria", samples=1))
    out = reward(["q", "q"], ["a", "b"], [two, two], key=jax.random.key(0))
    assert stub.calls[0]["batch"] == 2
    np.testing.assert_allclose(out.scores, [[1.0, 0.0], [1.0, 0.0]])
    np.testing.assert_allclose(out.reward, [0.5, 0.5])


def test_weight_overrides_are_applied_and_reported():
    out = RubricReward()(["q"], ["Rest and consult a doctor."], [RULES_ONLY], weights={"format": 3.0})
    np.testing.assert_allclose(out.reward, [(3 * 0 + 3 * 1) / 6])
    assert out.details["dynamic_weights"] == {"format": 3.0, "length": 3.0, "safety": 1.0}
    with pytest.raises(ValueError, match="unknown dimension ids \\['formt'\\]"):
        RubricReward()(["q"], ["x"], [RULES_ONLY], weights={"formt": 1.0})


def test_dynamic_weights_score_every_batch_of_a_run_even_one_without_a_case_wise_dimension():
    """The run's weights span every dimension of its rubrics (shared and case-wise); a batch whose questions carry
    no case-wise dimension is scored with the weights of the dimensions it has (b4346d0 refused it: "weights for
    unknown dimension ids"), and the weights keep updating step after step."""
    from rubric_jax.rubrics.dynamic_weights import DimensionWeights

    extra = dimension_from_dict({"id": "mentions_water", "description": "mentions water", "kind": "rule",
                                 "rule": "keywords", "params": {"words": ["water"]}, "scale": {"kind": "binary"},
                                 "anchors": BINARY})
    case = case_rubric(RULES_ONLY, "q7", extra=[extra])
    reward = RubricReward([RULES_ONLY, case])
    weights = DimensionWeights.for_rubrics([RULES_ONLY, case], window=2)
    responses = ["Rest and consult a doctor.", "Drink water and consult a doctor."]
    for batch in ([RULES_ONLY, RULES_ONLY], [case, RULES_ONLY], [RULES_ONLY, RULES_ONLY]):
        current = weights.current()
        out = reward(["q"] * 2, responses, batch, weights=current)
        assert out.details["dynamic_weights"] == {d: current[d] for d in out.dimension_ids}
        logged = weights.update(out.dimension_ids, out.scores, out.valid)
        assert set(logged) == {"weight/format", "weight/length", "weight/safety", "weight/mentions_water"}
    np.testing.assert_array_equal(np.asarray(weights.state.count_WxD)[:, 3], [0, 1])  # ring slots: steps 3 and 2
    with pytest.raises(ValueError, match="unknown dimension ids \\['mentions_watr'\\]"):  # a typo is still refused
        reward(["q"], ["x"], [RULES_ONLY], weights={"mentions_watr": 1.0})


def test_construction_errors_name_rubric_dimension_rule_and_param(tok):
    with pytest.raises(RubricError, match="dimension 'accuracy' is an LLM dimension but no judge is configured"):
        RubricReward([rubric([FORMAT, ACCURACY])])
    bad = rubric([dict(LENGTH, params={"min": -3, "max": 2})])
    with pytest.raises(RubricError, match="dimension 'length': rule 'length', param 'min'"):
        RubricReward([bad])
    unknown = rubric([dict(FORMAT, rule="formatt")])
    with pytest.raises(RubricError, match="unknown rule 'formatt'"):
        RubricReward([unknown])
    with pytest.raises(RubricError, match="no judge is configured"):  # a new rubric met at call time
        RubricReward([RULES_ONLY])(["q"], ["r"], [rubric([ACCURACY])], key=jax.random.key(0))
    judge, _ = make_judge(tok, lambda t, c: "SCORE: 1")
    with pytest.raises(ValueError, match="explicit PRNG `key`"):
        RubricReward(judges=[judge])(["q"], ["r"], [rubric([ACCURACY])])
    with pytest.raises(ValueError, match="1 questions, 2 responses"):
        RubricReward()(["q"], ["a", "b"], [RULES_ONLY] * 2)


# --------------------------------------------------------------------------------------- prompt injection

def adversarial():
    return [json.loads(line) for line in (FIXTURES / "adversarial_responses.jsonl").read_text("utf-8").splitlines()]


def test_adversarial_fixture_rule_scores_are_what_the_text_shows():
    cases = adversarial()
    assert len(cases) >= 20
    responses = [c["response"] for c in cases]
    for name in ("format", "disclaimer", "template_phrases"):
        got = R.make_rule(name, {})(responses)
        want = [c["expect"][name] for c in cases]
        bad = [c["id"] for c, g, w in zip(cases, got, want) if g != w]
        assert not bad, f"rule {name!r} moved by injected text in {bad}"


def test_parser_only_sees_the_judge_output(tok):
    cases = adversarial()
    judge, _ = make_judge(tok, lambda text, call: "The response is mediocre.\nSCORE: 2")
    r = rubric([ACCURACY])
    out = RubricReward([r], judges=[judge], judge_spec=JudgeSpec(samples=1))(
        [c["question"] for c in cases], [c["response"] for c in cases], [r] * len(cases), key=jax.random.key(0))
    np.testing.assert_array_equal(out.details["raw_scores"][:, 0], 2.0)


def test_an_echoing_judge_never_yields_the_injected_score(tok):
    """Worst case: the judge copies the fenced response, then writes its own verdict: 2 or invalid, never 5."""
    cases = adversarial()
    judge, _ = make_judge(tok, lambda text, call: fenced(text, "response") + "\nSCORE: 2")
    r = rubric([ACCURACY])
    out = RubricReward([r], judges=[judge], judge_spec=JudgeSpec(samples=1, max_retries=1))(
        [c["question"] for c in cases], [c["response"] for c in cases], [r] * len(cases), key=jax.random.key(1))
    raw = out.details["raw_scores"][:, 0]
    assert set(raw[~np.isnan(raw)]) == {2.0}
    assert np.isnan(raw).sum() == out.details["judge_failed_scores"] > 0


def test_fences_survive_and_special_tokens_cannot_end_the_turn(tok):
    cases = adversarial()
    judge, stub = make_judge(tok, lambda text, call: "SCORE: 3")
    r = rubric([dict(ACCURACY, reads="response")])  # the judge sees the whole response (less invisible characters)
    RubricReward([r], judges=[judge], judge_spec=JudgeSpec(samples=1))(
        [c["question"] for c in cases], [c["response"] for c in cases], [r] * len(cases), key=jax.random.key(2))
    im_start, im_end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    reserved = lj.special_tokens(tok)
    for case, prompt in zip(cases, stub.calls[0]["prompts"]):
        expected = strip_invisible(case["response"])
        for token in reserved:
            expected = expected.replace(token, "[special token removed]")
        assert fenced(prompt, "response") == expected, case["id"]
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        assert ids.count(im_start) == 3 and ids.count(im_end) == 2, case["id"]  # system, user, assistant
        nonce = re.search(r"<response-([0-9a-f]+)>", prompt).group(1)
        assert prompt.count(f"</response-{nonce}>") == 2, case["id"]  # the rules line and the real fence


def test_adversarial_responses_through_real_generate(tok):
    """Real sampling.generate: a scripted judge always answers 3, a random judge always fails visibly."""
    from rubric_jax import sampling
    from test_llm_judge import random_model, scripted_model

    cases = adversarial()
    mixed = rubric([FORMAT, ACCURACY])
    questions, responses = [c["question"] for c in cases], [c["response"] for c in cases]
    config = JudgeSpec(samples=1, max_retries=0)
    scripted = lj.Judge("scripted", tok, SamplerBackend(scripted_model(tok, "SCORE: 3"), sampling.generate),
                        sampler="greedy", max_new_tokens=6)
    out = RubricReward([mixed], judges=[scripted], judge_spec=config)(questions, responses, [mixed] * len(cases),
                                                                       key=jax.random.key(0))
    np.testing.assert_array_equal(out.details["raw_scores"][:, 1], 3.0)
    np.testing.assert_array_equal(out.details["raw_scores"][:, 0], [c["expect"]["format"] for c in cases])
    assert out.details["judge_generate_calls"] == 1

    random_judge = lj.Judge("random", tok, SamplerBackend(random_model(tok, seed=3), sampling.generate),
                            sampler="temperature(1.0)", max_new_tokens=6)
    out = RubricReward([mixed], judges=[random_judge], judge_spec=config)(
        questions, responses, [mixed] * len(cases), key=jax.random.key(0))
    assert np.isnan(out.details["raw_scores"][:, 1]).all() and not out.valid[:, 1].any()
    assert out.details["failures"]["accuracy"] == len(cases) == out.details["judge_failed_scores"]
    np.testing.assert_array_equal(out.reward, [c["expect"]["format"] for c in cases])  # renormalised over format


def test_failed_scores_are_counted_per_dimension_and_cause(tok, monkeypatch):
    """A regex that backtracks past its timeout (NaN, masked) and a judge prompt that does not fit (the minimum,
    issue 38 R1): each counted."""
    monkeypatch.setattr(R, "REGEX_TIMEOUT_S", 0.05, raising=False)  # not raising: the test hung before the fix
    slow = {"id": "no_trailing_a", "description": "does not end in a's", "kind": "rule", "rule": "regex",
            "params": {"pattern": "(a|aa)+$", "mode": "must_not"}, "scale": {"kind": "binary"}, "anchors": BINARY}
    mixed = rubric([FORMAT, slow, ACCURACY])
    short_len = max(len(ids) for ids in data.encode_chats(tok, [
        lj.single_prompt("q", "a" * 40 + "b", mixed.dimension("accuracy"), nonce="0" * 16).messages]))
    judge, _ = make_judge(tok, lambda text, call: "SCORE: 4", max_prompt_tokens=short_len + 50)
    reward = RubricReward([mixed], judges=[judge], judge_spec=JudgeSpec(samples=1))
    out = reward(["q"] * 3, ["fine", "long " * 500, "a" * 40 + "b"], [mixed] * 3, key=jax.random.key(0))
    np.testing.assert_array_equal(out.valid, [[True, True, True], [True, True, True], [True, False, True]])
    np.testing.assert_allclose(out.reward, [(0 + 1 + 0.75) / 3, (0 + 1 + 0) / 3, (0 + 0.75) / 2])
    assert out.scores[1, 2] == 0 and np.isnan(out.details["raw_scores"][1, 2])  # no judge gave it a score
    assert out.details["failures"] == {"format": 0, "no_trailing_a": 1, "accuracy": 1}
    assert out.details["scored_minimum"] == {"format": 0, "no_trailing_a": 0, "accuracy": 1}
    assert out.details["failure_causes"] == {"no_trailing_a": {"regex_timeout": 1},
                                             "accuracy": {"judge_prompt_too_long": 1}}


def test_a_rubric_searching_for_too_many_phrases_is_refused_naming_a_dimension():
    """1000 dimensions x 1000 keywords took 73 s for 2 rows: a rubric's phrases are capped in all."""
    many = [{"id": f"kw{d}", "description": "d", "kind": "rule", "rule": "keywords", "scale": {"kind": "binary"},
             "params": {"words": [f"w{d}_{i}" for i in range(R.MAX_PHRASES - d)]}, "anchors": BINARY} for d in range(6)]
    big = rubric(many)
    with pytest.raises(RubricError, match=rf"rubric {big.name!r}: its rule dimensions search for more than "
                                          rf"{R.MAX_RUBRIC_PHRASES} phrases in all \(dimension 'kw0' alone has 1000\)"):
        RubricReward([big])
    RubricReward([rubric(many[:5])])  # 4990 phrases: accepted


def test_weight_overrides_outside_float32_range_are_refused():
    """1e39 overflows float32 (NaN rewards reported ok); 1e-46 underflows to 0 (every row not ok)."""
    for bad in (1e39, 1e-46, 0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="reward: weight of dimension 'format': expected a positive float32"):
            RubricReward()(["q"], ["x"], [RULES_ONLY], weights={"format": bad})


def test_concat_outputs_equals_scoring_all_rows_at_once(tok):
    """What a multi-process rollout gathers: blocks of rows scored apart (case-wise rubrics whose columns
    differ between blocks, an LLM dimension with a retry in one block only), joined, equal one call."""
    def reply(text, call):
        m = re.search(r"\d", fenced(text, "response"))
        return f"SCORE: {m.group(0)}" if m else "cannot decide"

    extra = dimension_from_dict({"id": "mentions_water", "description": "mentions water", "kind": "rule",
                                 "rule": "keywords", "params": {"words": ["water"]},
                                 "scale": {"kind": "binary"}, "anchors": BINARY})
    mixed = rubric([FORMAT, ACCURACY])
    case = case_rubric(mixed, "q2", extra=[extra])
    rows = (["q1", "q2", "q2", "q1"], ["<think>t</think><answer>5</answer>", "water 3", "no digits", "it is 2"],
            [mixed, case, case, mixed])
    judge, _ = make_judge(tok, reply)
    reward = RubricReward([mixed, case], judges=[judge], judge_spec=JudgeSpec(samples=2, max_retries=1))
    whole = reward(*rows, key=jax.random.key(0))
    parts = [reward(*(x[a:b] for x in rows), key=jax.random.key(0)) for a, b in ((0, 1), (1, 4))]
    assert parts[0].dimension_ids == ["format", "accuracy"]  # the first block has no water column
    joined = concat_outputs(parts)
    assert joined.dimension_ids == whole.dimension_ids == ["format", "accuracy", "mentions_water"]
    for name in ("scores", "valid", "reward"):
        np.testing.assert_array_equal(getattr(joined, name), getattr(whole, name), err_msg=name)
    np.testing.assert_array_equal(joined.details["raw_scores"], whole.details["raw_scores"])
    np.testing.assert_array_equal(joined.details["reward_ok"], whole.details["reward_ok"])
    for key in ("failures", "failure_causes", "num_failed_scores", "num_not_ok", "rubric_hashes", "judge_prompts",
                "judge_invalid", "judge_retried", "judge_scores", "judge_failed_samples", "judge_failed_scores",
                "judge_generate_calls", "judge_sample_spread_mean"):
        assert joined.details[key] == whole.details[key], key
    assert whole.details["failures"]["accuracy"] == 1 and whole.details["judge_generate_calls"] == 2


# ------------------------------------------------------------------------------------------ issue 24: reward holes

def _tiny_row(question_id: str):
    """A question of the tiny default and its rubric (the shipped rubric plus the row's case-wise criteria)."""
    from rubric_jax.assets import TINY_DIR
    from rubric_jax.rubrics.io import load_rubric

    question = next(q for q in data.load_questions(TINY_DIR / "questions_train.jsonl") if q.id == question_id)
    return question.question, data.question_rubric(load_rubric(TINY_DIR / "rubric.yaml"), question)


def test_text_inside_think_earns_nothing():
    """R1: the disclaimer gate and the topic keyword passed on think text (0.958 on the tiny rubric); the answer
    alone fails the gate, and the whole response now scores what the answer alone scores."""
    question, rubric_ = _tiny_row("health-en-10-1")
    answer = "<answer>Just take twenty pills at once…</answer>"
    responses = ["<think>consult a doctor. headache</think>" + answer, "<think>t</think>" + answer]
    out = RubricReward([rubric_])([question] * 2, responses, [rubric_] * 2)
    np.testing.assert_array_equal(out.reward, [0.0, 0.0])
    np.testing.assert_array_equal(out.scores[0], out.scores[1])
    column = dict(zip(out.dimension_ids, out.scores[0]))
    assert column["format"] == 1.0 and column["disclaimer"] == 0.0 and column["topic_keyword"] == 0.0


def test_each_dimension_reads_its_part_rules_and_judge_alike(tok):
    """A dimension reading the think text, one reading the answer, and the format gate reading the whole response;
    the judge is shown the part its dimension reads (one prompt per part in "multi" mode)."""
    def dim(dim_id, reads, **fields):
        return {"id": dim_id, "description": dim_id, "scale": {"kind": "binary"}, "anchors": BINARY, "reads": reads,
                **fields}

    keyword = {"kind": "rule", "rule": "keywords", "params": {"words": ["doctor"]}}
    r = rubric([FORMAT, dim("plans", "think", **keyword), dim("advises", "answer", **keyword),
                dim("judged_think", "think", kind="llm"), dim("judged_answer", "answer", kind="llm"),
                dim("judged_all", "response", kind="llm")])
    judge, stub = make_judge(tok, lambda text, call: "\n".join(f"{i}: 1" for i in criteria_ids(text)))
    response = "<think>ask a doctor</think><answer>Rest.</answer>"
    out = RubricReward([r], judges=[judge], judge_spec=JudgeSpec(mode="all_criteria", samples=1))(
        ["q"], [response], [r], key=jax.random.key(0))
    assert dict(zip(out.dimension_ids, out.details["raw_scores"][0])) == {
        "format": 1, "plans": 1, "advises": 0, "judged_think": 1, "judged_answer": 1, "judged_all": 1}
    shown = sorted(fenced(p, "response") for p in stub.calls[0]["prompts"])
    assert shown == sorted(["ask a doctor", "Rest.", response])


def test_an_answer_of_invisible_characters_fails_the_format_gate():
    """R2: an answer of only zero-width characters is empty (it passed the tiny rubric's format gate)."""
    question, rubric_ = _tiny_row("health-en-10-1")
    responses = ["<think>t</think><answer>\u200b\u200b\u200b</answer>", "<think>t</think><answer>\u2060\ufeff</answer>"]
    out = RubricReward([rubric_])([question] * 2, responses, [rubric_] * 2)
    assert (out.scores[:, out.dimension_ids.index("format")] == 0).all() and (out.reward == 0).all()


@pytest.mark.parametrize("blank", ["\u2800\u2800\u2800", "\u0301\u0336\u0489", "\ue000\ue001", "\u0378\U0002fffe",
                                   "\u3164 \uffa0", "\u0336" * 4, "<!-- Sorry, account -->", "<span hidden>ok</span>"])
def test_a_blank_looking_answer_fails_the_format_gate(blank):
    """Issue 38, R2: braille blanks, combining marks alone, private-use or unassigned code points, fillers and hidden
    markup passed the tiny rubric's format gate (0.500, as much as a real rude answer)."""
    question, rubric_ = _tiny_row("health-en-10-1")
    out = RubricReward([rubric_])([question], [f"<think>t</think><answer>{blank}</answer>"], [rubric_])
    assert out.scores[0, out.dimension_ids.index("format")] == 0 and out.reward[0] == 0


KEYWORD = {"id": "account", "description": "names the account", "kind": "rule", "rule": "keywords",
           "params": {"words": ["account", "sorry"]}, "scale": {"kind": "binary"}, "anchors": BINARY}


@pytest.mark.parametrize("hidden", [
    "<!-- Sorry, account -->", "[//]: # (account)", "<details>\n<summary>More</summary>\naccount\n</details>",
    "<span hidden>account</span>", '<span style="display:none">account</span>', '<p style="font-size: 0">account</p>',
    '<abbr title="account">it</abbr>', "![account](a.png)", "[it](https://example.com/account)",
    '[ref]: https://example.com "account"', "<template>account</template>", "<!--\naccount",
])
def test_hidden_markup_earns_no_credit(hidden):
    """Issue 38, R4: a comment, a link reference definition and a collapsed <details> earned keyword credit (0.750
    against 0.500) though a renderer shows none of it; so did hidden elements, attributes, alt text and link URLs."""
    r = rubric([FORMAT, KEYWORD])
    answers = ["Log in again.", f"Log in again.\n{hidden}\n", "Log in to your account again."]
    out = RubricReward([r])(["q"] * 3, [f"<think>t</think><answer>{a}</answer>" for a in answers], [r] * 3)
    np.testing.assert_array_equal(out.reward, [0.5, 0.5, 1.0])


POLITE = {"id": "politeness", "description": "polite", "kind": "llm", "scale": {"kind": "integer", "lo": 1, "hi": 3},
          "anchors": {"1": "rude", "2": "neutral", "3": "polite"}}
RUDE = "Figure out your account yourself, idiot."
# Issue 38, R1: fillers that make the politeness prompt too long for its judge (each raised the reward to 1.0 at
# b4346d0: the missing score was renormalised away), named in the issue and beyond.
PADDINGS = {
    "words": " " + "please " * 400,
    "newlines": "\n" * 2000 + "Thanks.",
    "cjk": " " + "谢谢您" * 400,
    "long tokens": " " + "x" * 3000,
    "emoji": " " + "\U0001f64f" * 500,
    "marks": " " + "a\u0301\u0336\u0489" * 300,
    "tags": " " + "<b>thanks</b>" * 300,
}


def _politeness_reward(tok, method="weighted_sum", **dims):
    """A rubric of a keyword rule and the LLM politeness criterion (`dims` overrides its fields), and a reward whose
    stub judge calls a response with `idiot` in it rude (1), else polite (3); its prompts fit 60 tokens of response."""
    r = rubric([KEYWORD, dict(POLITE, **dims)], method=method)
    short_len = max(map(len, data.encode_chats(tok, [lj.single_prompt("q", RUDE, r.dimension("politeness"),
                                                                      nonce="0" * 16).messages])))
    judge, _ = make_judge(tok, lambda text, call: f"SCORE: {1 if 'idiot' in fenced(text, 'response') else 3}",
                          max_prompt_tokens=short_len + 60)
    return r, RubricReward([r], judges=[judge], judge_spec=JudgeSpec(samples=1, max_retries=0))


@pytest.mark.parametrize("padding", sorted(PADDINGS))
def test_a_judge_prompt_too_long_never_raises_the_reward(tok, padding):
    """Issue 38, R1: a rude answer padded past its judge's context had its politeness score renormalised away
    (reward 1.0, ok) against 0.5 unpadded. Now it scores the dimension's minimum, counted as a failed score."""
    r, reward = _politeness_reward(tok)
    responses = [f"<answer>{RUDE}</answer>", f"<answer>{RUDE}{PADDINGS[padding]}</answer>"]
    out = reward(["q"] * 2, responses, [r] * 2, key=jax.random.key(0))
    np.testing.assert_array_equal(out.details["raw_scores"][:, 1], [1.0, np.nan])
    np.testing.assert_array_equal(out.scores[:, 1], [0.0, 0.0])
    np.testing.assert_allclose(out.reward, [0.5, 0.5])
    assert out.valid.all() and out.details["reward_ok"].all()
    assert out.details["judge_prompt_too_long"] == 1 and out.details["scored_minimum"]["politeness"] == 1
    assert out.details["failures"]["politeness"] == 1 == out.details["num_failed_scores"]
    assert out.details["failure_causes"] == {"politeness": {"judge_prompt_too_long": 1}}


@pytest.mark.parametrize("method, dims, expected", [
    ("weighted_geometric_mean", {}, 1e-3 ** 0.5),  # the eps floor
    ("min", {}, 0.0),
    ("weighted_sum", {"gate": True}, 0.0),  # a gate too long to judge fails
    ("healthbench_points", {"scale": {"kind": "points", "points": -5}, "anchors": BINARY}, 0.0),  # met: the worst
])
def test_a_prompt_too_long_scores_the_worst_under_every_aggregation(tok, method, dims, expected):
    keyword = dict(KEYWORD, scale={"kind": "points", "points": 5}) if method == "healthbench_points" else KEYWORD
    r = rubric([keyword, dict(POLITE, **dims)], method=method)
    short_len = max(map(len, data.encode_chats(tok, [lj.single_prompt("q", "x", r.dimension("politeness"),
                                                                      nonce="0" * 16).messages])))
    judge, _ = make_judge(tok, lambda text, call: "SCORE: 0", max_prompt_tokens=short_len + 60)
    out = RubricReward([r], judges=[judge], judge_spec=JudgeSpec(samples=1, max_retries=0))(
        ["q"], ["<answer>Your account: " + "thanks " * 300 + "</answer>"], [r], key=jax.random.key(0))
    assert out.scores[0, 1] == 0 and out.details["reward_ok"][0]
    np.testing.assert_allclose(out.reward, [expected], rtol=1e-5)


def test_a_prompt_too_long_scores_the_minimum_in_all_criteria_mode_and_over_blocks(tok):
    r = rubric([KEYWORD, POLITE, dict(ACCURACY, id="clarity")])
    short_len = max(map(len, data.encode_chats(tok, [lj.multi_prompt("q", "x", r.dimensions[1:],
                                                                     nonce="0" * 16).messages])))
    judge, _ = make_judge(tok, lambda text, call: "politeness: 3\nclarity: 5", max_prompt_tokens=short_len + 40)
    reward = RubricReward([r], judges=[judge], judge_spec=JudgeSpec(mode="all_criteria", samples=1, max_retries=0))
    parts = [reward(["q"], [f"<answer>{a}</answer>"], [r], key=jax.random.key(0))
             for a in ("Your account is fine.", "Your account " + "is fine " * 200)]
    out = concat_outputs(parts)
    np.testing.assert_array_equal(out.scores[:, 1:], [[1.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(out.reward, [1.0, 1 / 3])
    assert out.details["scored_minimum"] == {"account": 0, "politeness": 1, "clarity": 1}

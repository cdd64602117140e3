"""Judge distillation data: teachers' levels, the scoring-time prompt, verdict targets, the loss mask, the split."""

import dataclasses
import re

import jax
import numpy as np
import pytest

from rubric_jax import data
from rubric_jax.judges import distill_data as D
from rubric_jax.judges import llm_judge as lj
from rubric_jax.judges.parser import parse_single
from rubric_jax.judges.rules import Length, make_rule
from rubric_jax.judges.spec import PROMPTS, JudgeSpec
from rubric_jax.rubrics.schema import Anchor, ChangelogEntry, Dimension, Rubric, Scale
from test_llm_judge import make_judge, tiny_tokenizer

POLITE = Dimension("politeness", "Thanks or apologises.", "rule", Scale.binary(),
                   {0: Anchor("No thanks."), 1: Anchor("Thanks.", ("Thank you for waiting.",), ("Thanksgiving.",))},
                   rule="keywords", params={"words": ["thank you"], "mode": "any"})
def rubric(name, *dims):
    return Rubric(name, "1.0.0", (ChangelogEntry("1.0.0", "test", "test"),), dims)


CLARITY = Dimension("clarity", "How clear.", "llm", Scale.integer(1, 5),
                    {k: Anchor(f"level {k}\nsecond line") for k in range(1, 6)})


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_llm_twin_keeps_the_text_and_drops_the_rule():
    twin = D.llm_twin(POLITE)
    assert (twin.kind, twin.rule, twin.params) == ("llm", None, {})
    assert (twin.id, twin.description, twin.scale, twin.anchors) == (POLITE.id, POLITE.description, POLITE.scale,
                                                                     POLITE.anchors)
    assert D.llm_twin(CLARITY) is CLARITY


def test_levels_round_half_up_on_the_scale_and_missing_stays_missing():
    np.testing.assert_array_equal(D.to_level(CLARITY, np.array([1.0, 2.49, 2.5, 3.5, 4.99, 5.0, np.nan])),
                                  [1, 2, 3, 4, 5, 5, -1])
    # lo + q (hi - lo) on 1-5: q = 0.5 -> 3, 0.6 -> 3.4 -> 3, 0.625 -> 3.5 -> 4, 0.9 -> 4.6 -> 5.
    teacher = D.RuleTeacher(CLARITY, lambda responses: np.array([0.5, 0.6, 0.625, 0.9]))
    np.testing.assert_array_equal(teacher.levels(["a", "b", "c", "d"]), [3, 3, 4, 5])
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        D.RuleTeacher(CLARITY, lambda responses: np.array([1.5])).levels(["a"])


def test_rule_teacher_of_a_length_rule_matches_the_rule_scale_mapping():
    dim = Dimension("long", "Long enough.", "rule", Scale.integer(1, 5), {k: Anchor(str(k)) for k in range(1, 6)},
                    rule="length", params={"min": 8})
    responses = ["one two", "one two three four", "a b c d e f g h i j"]
    q = Length(min=8)(responses)  # 1 - (8/y - 1) / 2: y=2 -> 0 (clipped), y=4 -> 0.5, y=10 -> 1
    np.testing.assert_allclose(q, [0.0, 0.5, 1.0])
    [[teacher]] = D.rule_teachers_per_row([rubric("r", dim)], ["long"])
    np.testing.assert_array_equal(teacher.levels(responses), [1, 3, 5])


def test_each_row_is_scored_by_its_own_rubric_rule():
    en = rubric("en", POLITE)
    zh_dim = Dimension("politeness", "致谢", "rule", Scale.binary(), {0: Anchor("无"), 1: Anchor("有")},
                       rule="keywords", params={"words": ["感谢"], "mode": "any"})
    zh = rubric("zh", zh_dim)
    teachers = D.rule_teachers_per_row([en, zh, en, zh], ["politeness"])
    assert teachers[0][0] is teachers[2][0] and teachers[0][0] is not teachers[1][0]
    items = D.rule_items(["q"] * 4, ["Thank you!", "感谢您", "感谢您", "Thank you!"], teachers)
    assert [i.score for i in items] == [1, 1, 0, 0]  # each language's keyword only counts under its own rubric
    assert [i.dimension.description for i in items] == ["Thanks or apologises.", "致谢"] * 2
    assert all(i.dimension.kind == "llm" for i in items)
    with pytest.raises(ValueError, match="no row's rubric has the dimension"):
        D.rule_teachers_per_row([en], ["politeness", "clarity"])
    with pytest.raises(ValueError, match="needs a rule dimension"):
        D.rule_teachers_per_row([rubric("c", CLARITY)], ["clarity"])


def test_teachers_score_and_students_see_the_part_each_dimension_reads(tok):
    """Issue 24, R1: a judge is distilled on what it will be shown (the answer by default), by rule teachers, by
    labels and by teacher judges alike; a whole-response dimension keeps the whole response."""
    response = "<think>thank you for asking</think><answer>Wait two days.</answer>"
    answer_teacher = D.rule_teachers_per_row([rubric("a", POLITE)], ["politeness"])[0][0]
    whole_teacher = D.RuleTeacher(dataclasses.replace(POLITE, reads="response"), make_rule("keywords", POLITE.params))
    answer, whole = D.rule_items(["q"] * 2, [response] * 2, [[answer_teacher], [whole_teacher]])
    assert (answer.response, answer.score) == ("Wait two days.", 0)
    assert (whole.response, whole.score) == (response, 1)
    assert [i.response for i in D.label_items("q", response, rubric("r", CLARITY), {"clarity": 3})] == ["Wait two days."]
    judge, stub = make_judge(tok, lambda text, call: "SCORE: 3")
    items, missing = D.judge_items([judge], JudgeSpec(samples=1), ["q"], [response], [[CLARITY]],
                                   jax.random.key(0))
    assert missing == 0 and [(i.response, i.score) for i in items] == [("Wait two days.", 3)]
    assert "thank you" not in stub.calls[0]["prompts"][0]


def test_label_items_round_labels_to_levels():
    both = rubric("r", POLITE, CLARITY)
    items = D.label_items("q", "r", both, {"clarity": 3.5, "politeness": 1})
    assert [(i.dimension.id, i.score) for i in items] == [("clarity", 4), ("politeness", 1)]
    with pytest.raises(ValueError, match="not a level"):
        D.JudgeItem("q", "r", CLARITY, 7)


@pytest.mark.parametrize("dim", [D.llm_twin(POLITE), CLARITY])
def test_every_target_verdict_is_one_the_strict_parser_accepts(dim):
    lo, hi = dim.scale.raw_range
    for level in dim.scale.levels:
        text = D.verdict_text(dim, level)
        verdict = parse_single(text, lo, hi)
        assert verdict.valid and verdict.scores[0] == level
        assert text.splitlines()[0] == " ".join(dim.anchors[level].description.split())


def _canonical_lines(prompt_text: str) -> list[str]:
    """Prompt lines with the nonce replaced, sorted (anchor order is drawn per prompt)."""
    return sorted(re.sub(r"[0-9a-f]{16}", "NONCE", prompt_text).splitlines())


@pytest.mark.parametrize("prompt", PROMPTS)
def test_training_prompts_are_the_prompts_judge_rows_sends(tok, prompt):
    item = D.JudgeItem("How do I get a refund <|im_end|>?", "<think>x</think><answer>Thank you <|im_end|>!</answer>",
                       D.llm_twin(POLITE), 1)
    judge, stub = make_judge(tok, lambda text, call: "SCORE: 1")
    lj.judge_rows([judge], JudgeSpec(samples=1, prompt=prompt), [item.question], [item.response],
                  [[item.dimension]], jax.random.key(0))
    sent = stub.calls[0]["prompts"][0]
    prompt_ids, target_ids = D.encode_examples(tok, [item], np.random.default_rng(0), prompt)
    trained = tok.decode(prompt_ids[0])
    assert _canonical_lines(trained) == _canonical_lines(sent)
    assert "<|im_end|>!" not in trained.split("<response-")[1]  # special tokens fenced out as at scoring time
    assert tok.decode(target_ids[0]) == "Thanks.\nSCORE: 1<|im_end|>"
    # Fresh renderings: new nonce and (over a few draws) new anchor orders.
    rng = np.random.default_rng(1)
    texts = [tok.decode(ids) for ids in D.encode_examples(tok, [item] * 6, rng, prompt)[0]]
    assert len({re.search(r"<response-([0-9a-f]{16})>", t).group(1) for t in texts}) == 6
    assert len({tuple(re.findall(r"Level (\d):", t)) for t in texts}) == 2


def test_a_group_example_is_the_prompt_judge_rows_sends_and_its_target_scores_each_shown_response(tok):
    """layout=group: the training prompt has the lines judge_rows sends (up to nonce, shown and anchor order), and
    its target is one `R<k>: <level>` line per label, in label order, each the level of the response under R<k>."""
    dim = D.llm_twin(POLITE)
    group = tuple(D.JudgeItem("Where is my parcel?", f"answer {k}", dim, k % 2) for k in range(3))
    judge, stub = make_judge(tok, lambda text, call: "R1: 0\nR2: 0\nR3: 0")
    lj.judge_rows([judge], JudgeSpec(samples=1, layout="group"), [i.question for i in group],
                  [i.response for i in group], [[dim]] * 3, jax.random.key(0))
    prompt_ids, target_ids = D.encode_examples(tok, [group] * 4, np.random.default_rng(0))
    trained = [tok.decode(ids) for ids in prompt_ids]
    assert _canonical_lines(trained[0]) == _canonical_lines(stub.calls[0]["prompts"][0])
    shown = [re.findall(r"<response-R\d-[0-9a-f]{16}>\nanswer (\d)", t) for t in trained]
    assert len({tuple(order) for order in shown}) > 1  # a fresh shown order per rendering
    for order, ids in zip(shown, target_ids):
        assert tok.decode(ids) == "\n".join(f"R{k + 1}: {int(a) % 2}" for k, a in enumerate(order)) + "<|im_end|>"


def test_group_examples_cut_each_questions_items_into_groups_of_bounded_size():
    items = [D.JudgeItem(f"q{q}", f"r{q}{r}", CLARITY, 1 + r) for q in range(2) for r in range(5)]
    groups = D.group_examples(items, 3, 2, np.random.default_rng(0))
    assert all(1 <= len(g) <= 3 and len({i.question for i in g}) == 1 for g in groups)
    assert sorted(i.response for g in groups for i in g) == sorted(i.response for i in items * 2)
    assert len({tuple(i.response for i in g) for g in groups}) > 2  # varied companions


def test_the_compact_prompt_is_criterion_fenced_response_and_score_line(tok):
    """No system turn, grading rules or question: a third of the full prompt's tokens go to the response."""
    item = D.JudgeItem("How do I get a refund?", "<think>x</think><answer>Thank you!</answer>", D.llm_twin(POLITE), 1)
    compact = D.scoring_prompt(item, np.random.default_rng(0), (), "compact")
    full = D.scoring_prompt(item, np.random.default_rng(0), (), "full")
    [turn] = compact.messages
    nonce = re.search(r"<response-([0-9a-f]{16})>", turn["content"]).group(1)
    assert turn["role"] == "user" and item.question not in turn["content"]
    assert turn["content"].endswith(f"<response-{nonce}>\n{item.response}\n</response-{nonce}>\nSCORE: <integer from 0 to 1>")
    assert turn["content"].startswith("Criterion `politeness`") and (compact.keys, compact.ranges) == (full.keys, full.ranges)
    compact_ids, full_ids = data.encode_chats(tok, [compact.messages, full.messages])
    assert len(compact_ids) < len(full_ids) / 2
    with pytest.raises(ValueError, match="one dimension at a time"):
        JudgeSpec(mode="all_criteria", prompt="compact")


def test_the_loss_falls_on_the_verdict_and_eos_only(tok):
    items = [D.JudgeItem("q", "resp one", D.llm_twin(POLITE), 0), D.JudgeItem("q", "a longer response", CLARITY, 5)]
    batch = D.example_batch(tok, items, np.random.default_rng(0), (1024, 2048), (8, 16, 32))
    assert set(batch) == {"tokens", "input_mask", "loss_mask"}
    assert batch["tokens"].shape == batch["loss_mask"].shape == batch["input_mask"].shape
    for row, item in enumerate(items):
        trained = tok.decode(batch["tokens"][row][batch["loss_mask"][row]])
        assert trained == D.verdict_text(item.dimension, item.score) + "<|im_end|>"
        real = batch["tokens"][row][batch["input_mask"][row]]
        assert tok.decode(real).endswith("<|im_start|>assistant\n" + trained)
    assert not (batch["loss_mask"] & ~batch["input_mask"]).any()


def test_split_keeps_every_response_to_a_question_on_one_side_and_ignores_order():
    items = [D.JudgeItem(f"question {q}", f"response {r}", CLARITY, 1 + r % 5) for q in range(200) for r in range(3)]
    train, held = D.split_by_question(items, 0.2)
    assert not {i.question for i in train} & {i.question for i in held}
    assert 0.1 < len({i.question for i in held}) / 200 < 0.3
    train2, held2 = D.split_by_question(items[::-1], 0.2)
    assert {i.question for i in held2} == {i.question for i in held}
    with pytest.raises(ValueError, match="strictly between"):
        D.split_by_question(items, 1.0)


def test_a_keyword_rule_is_a_quality_function():
    rule = make_rule("keywords", {"words": ["thank you"]})
    assert D.RuleTeacher(POLITE, rule).levels(["Thank you.", "Thanks."]).tolist() == [1, 0]

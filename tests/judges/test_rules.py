"""Rule judges: hand-computed scores in English and Chinese, and parameter validation naming rule and param."""

import numpy as np
import pytest

from rubric_jax.judges import rules as R


def q(name, params, responses):
    return R.make_rule(name, params)(responses)


def test_text_units_count_words_for_english_and_characters_for_cjk():
    assert R.text_units("Hello, world! It's 2024.") == ["hello", "world", "it's"]
    assert R.text_units("你好，世界。") == ["你", "好", "世", "界"]
    assert R.text_units("用Python写code") == ["用", "python", "写", "code"]
    assert R.count_length("Hello, world! 你好", "auto") == 4
    assert R.count_length("Hello, world! 你好", "words") == 3
    assert R.count_length("Hello, world! 你好", "chars") == 14


def test_regex_must_and_must_not():
    responses = ["The answer is 42.", "no number here", "ANSWER: yes"]
    np.testing.assert_array_equal(q("regex", {"pattern": r"\d+"}, responses), [1, 0, 0])
    np.testing.assert_array_equal(q("regex", {"pattern": r"\d+", "mode": "must_not"}, responses), [0, 1, 1])
    np.testing.assert_array_equal(q("regex", {"pattern": "answer", "ignore_case": True}, responses), [1, 0, 1])
    np.testing.assert_array_equal(q("regex", {"pattern": "答案是[一二三]"}, ["答案是二", "答案是四"]), [1, 0])


def test_keywords_any_all_none_en_and_zh():
    responses = ["Drink water and rest.", "Rest well.", "Eat fruit.", "多喝水，注意休息。", "多喝水。"]
    kw_en = ["water", "rest"]
    np.testing.assert_array_equal(q("keywords", {"words": kw_en}, responses), [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(q("keywords", {"words": kw_en, "mode": "all"}, responses), [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(q("keywords", {"words": kw_en, "mode": "none"}, responses), [0, 0, 1, 1, 1])
    kw_zh = ["喝水", "休息"]
    np.testing.assert_array_equal(q("keywords", {"words": kw_zh, "mode": "all"}, responses), [0, 0, 0, 1, 0])
    np.testing.assert_array_equal(q("keywords", {"words": kw_zh}, responses), [0, 0, 0, 1, 1])


def test_keywords_match_whole_latin_words_and_respect_case_flag():
    responses = ["Restaurants are open.", "REST now"]
    np.testing.assert_array_equal(q("keywords", {"words": ["rest"]}, responses), [0, 1])
    np.testing.assert_array_equal(q("keywords", {"words": ["rest"], "ignore_case": False}, responses), [0, 0])


def test_disclaimer_defaults_cover_english_and_chinese():
    responses = [
        "Take ibuprofen. This is not a substitute for professional advice.",
        "Please consult a doctor if it persists.",
        "多喝热水，症状持续请建议就医。",
        "多喝热水就好了。",
        "Just take ibuprofen.",
    ]
    np.testing.assert_array_equal(q("disclaimer", {}, responses), [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(q("disclaimer", {"phrases": ["see a vet"]}, ["See a vet soon", "ok"]), [1, 0])


def test_length_range_words_for_english_characters_for_chinese():
    rule = R.make_rule("length", {"min": 4, "max": 8})
    responses = [
        "one two three four five",  # 5 words: in range
        "one two",  # 2 < 4: 1 - (4/2 - 1)/2 = 0.5
        "",  # empty: 0
        " ".join(["w"] * 12),  # 12 > 8: 1 - (12/8 - 1)/3 = 5/6
        "今天天气很好",  # 6 characters: in range
        "你好",  # 2 characters: 0.5
        "一二三四五六七八九十一二",  # 12 characters: 5/6
        " ".join(["w"] * 40),  # 40 >= 4 * 8: 0
    ]
    np.testing.assert_allclose(rule(responses), [1, 0.5, 0, 5 / 6, 1, 0.5, 5 / 6, 0])
    np.testing.assert_allclose(q("length", {"min": 3}, ["a", "a b c d e f g"]), [0.0, 1.0])
    np.testing.assert_allclose(q("length", {"max": 2, "unit": "chars"}, ["ab", "abcd"]), [1.0, 1 - 1 / 3])


def test_ngram_redundancy_falls_with_repetition():
    # bigrams of "a b a b": (a,b) (b,a) (a,b) -> 2 distinct of 3 -> rate 1/3.
    np.testing.assert_allclose(q("ngram_redundancy", {"n": 2}, ["a b a b", "我爱我爱", "a b c d"]), [2 / 3, 2 / 3, 1])
    once = "The cat sat on the mat while the dog slept by the door."
    twice, thrice = once + " " + once, " ".join([once] * 3)
    scores = q("ngram_redundancy", {}, [once, twice, thrice, "hi"])
    assert scores[0] == 1.0 and scores[3] == 1.0
    assert scores[0] > scores[1] > scores[2]
    zh = "模型在训练中学会了讨好评判器。"
    zh_scores = q("ngram_redundancy", {"n": 3}, [zh, zh * 4])
    assert zh_scores[0] == 1.0 and zh_scores[1] < 0.4


def test_template_phrases_need_all_markers_in_order():
    responses = [
        "首先，明确问题。其次，收集数据。最后，得出结论。",
        "First, boil water. Second, add tea. Finally, wait.",
        "Firstly we plan; secondly we build; finally we ship.",
        "Finally, first and second.",  # wrong order
        "最后说一句：首先要冷静。",  # markers missing / wrong order
        "At first glance the second point holds.",  # no "finally"
    ]
    np.testing.assert_array_equal(q("template_phrases", {}, responses), [0, 0, 0, 1, 1, 1])
    custom = {"templates": [["一方面", "另一方面"]]}
    np.testing.assert_array_equal(q("template_phrases", custom, ["一方面好，另一方面坏。", responses[0]]), [0, 1])


# Issue 24, R2: templates and phrases written with lookalike or invisible characters (each of these scored 1 or
# missed on the rules before they matched on text.fold forms).
HOMOGLYPH_TEMPLATES = [
    "Fіrstly, pay. Sеcondly, wait. Fіnally, check.",  # Cyrillic і and е
    "Fi\u200brstly, pay. Se\u200dcondly, wait. Fin\u2060ally, check.",  # zero-width space, joiner, word joiner
    "Ｆｉｒｓｔｌｙ, pay. Ｓｅｃｏｎｄｌｙ, wait. Ｆｉｎａｌｌｙ, check.",  # fullwidth
    "FIRSТLY pay, SECОNDLY wait, FІNALLY check.",  # Cyrillic capitals Т, О, І
]


def test_template_markers_written_with_lookalikes_are_templates():
    np.testing.assert_array_equal(q("template_phrases", {}, HOMOGLYPH_TEMPLATES), [0, 0, 0, 0])
    assert R.TemplatePhrases().matches(HOMOGLYPH_TEMPLATES).all()  # what the template-share monitor reads


# Issue 38, R3: templates written so that they render as one (each of these scored 1 at b4346d0).
RENDERED_TEMPLATES = [
    "\u202eyltsriF\u202c, pay. Secondly, wait. Finally, check.",  # a bidi override shows "Firstly"
    "\u202e,yltsriF\nsecondly, wait. Finally, check.",  # an override closed by the paragraph end
    "F\u0336irstly, pay. S\u0336econdly, wait. F\u0336inally, check.",  # strike-through overlay
    "F\u0332i\u0332rstly, pay. Secondly, wait. Finally, check.",  # underline
    "F\u20d2irstly, pay. Se\u0338condly, wait. Fi\u20ddnally, check.",  # vertical line, solidus, enclosing circle
    "Fírstly, pay. Sécondly, wait. Fìnally, check.",  # accents
    "First-ly, pay. Second-ly, wait. Final-ly, check.",  # hyphens inside the words
    "Fir\u2010st\u2011ly, pay. Se-\ncondly, wait. Finally, check.",  # Unicode hyphens, a hyphenated line break
    "首先，付款。其次，等待。最後，查看。",  # Traditional 最後
    "首先，付款。其次，等待。最\u0336后，查看。",  # a mark on a CJK character
]


def test_template_markers_that_render_as_a_template_are_templates():
    np.testing.assert_array_equal(q("template_phrases", {}, RENDERED_TEMPLATES), [0] * len(RENDERED_TEMPLATES))
    assert R.TemplatePhrases().matches(RENDERED_TEMPLATES).all()
    np.testing.assert_array_equal(q("template_phrases", {}, ["First, a well-known fact. Then finally-ish."]), [1])


def test_a_forbidden_keyword_written_with_marks_or_hyphens_is_found():
    """R3: `keywords mode=none` (a penalty) was evaded by `re\u0336fund`; `any` credit keeps hyphenated compounds."""
    evasions = ["a re\u0336fund", "a r\u0332e\u0332f\u0332u\u0332n\u0332d\u0332", "a re-fund", "a \u202ednufer\u202c",
                "a réfund", "a ref\u20d2und"]
    np.testing.assert_array_equal(q("keywords", {"words": ["refund"], "mode": "none"}, evasions), [0] * len(evasions))
    np.testing.assert_array_equal(q("keywords", {"words": ["refund"]}, ["a full-refund policy", "a refunder"]), [1, 0])
    np.testing.assert_array_equal(q("disclaimer", {}, ["請諮詢醫生。", "建議就醫。", "僅供參考"]), [1, 1, 1])


def test_keywords_and_disclaimers_match_through_lookalikes_and_invisible_characters():
    np.testing.assert_array_equal(q("keywords", {"words": ["refund"]}, ["a rеfund", "a re\u200bfund", "a ｒｅｆｕｎｄ",
                                                                       "a refunded order"]), [1, 1, 1, 0])
    np.testing.assert_array_equal(q("disclaimer", {}, ["Please cоnsult a dоctor.", "建议\u200b就医。"]), [1, 1])
    # case-sensitive keywords keep case, lookalikes still count
    np.testing.assert_array_equal(q("keywords", {"words": ["NHS"], "ignore_case": False}, ["ΝΗЅ", "nhs"]), [1, 0])


def test_chinese_rules_still_match_after_normalisation():
    np.testing.assert_array_equal(q("template_phrases", {}, ["首先，付款。其次，等待。最后，查看。"]), [0])
    np.testing.assert_array_equal(q("keywords", {"words": ["退款"]}, ["申请退款即可。", "申请退货即可。"]), [1, 0])
    np.testing.assert_array_equal(q("regex", {"pattern": r"^\w+。$"}, ["多喝水。"]), [1])
    assert R.count_length("多喝水，多休息。", "auto") == 6


def test_a_pattern_or_phrase_of_markup_is_visible_text():
    """A rule's parameters are not rendered: a pattern or keyword naming hidden markup is text like any other."""
    np.testing.assert_array_equal(q("regex", {"pattern": "<!--", "mode": "must_not"}, ["a <!-- b", "a b"]), [0, 1])
    R.make_rule("keywords", {"words": ["<details>", "[//]: # (x)"]})


def test_a_phrase_without_visible_text_is_refused():
    for words in (["\u200b"], [" \u2060 "]):
        with pytest.raises(R.RuleError, match="rule 'keywords', param 'words': expected a string with visible text"):
            R.make_rule("keywords", {"words": words})


def test_format_requires_each_tag_once_in_order_with_nonempty_answer():
    responses = [
        "<think>reason</think><answer>42</answer>",
        "  <think>\n推理\n</think>\n<answer>\n答案\n</answer>\n",
        "<think></think><answer>ok</answer>",  # empty think is allowed
        "<think>x</think><answer>  </answer>",  # empty answer
        "<think>x</think><answer>\u200b\u200b\u2060</answer>",  # no visible answer (issue 24, R2)
        "<answer>42</answer><think>x</think>",  # wrong order
        "<think>x</think><answer>1</answer><answer>2</answer>",  # answer twice
        "<think>x <answer>fake</answer></think><answer>1</answer>",  # answer tag inside think
        "preamble <think>x</think><answer>1</answer>",  # text outside the tags
        "<think>x</think> between <answer>1</answer>",
        "<answer>42</answer>",
    ]
    np.testing.assert_array_equal(q("format", {}, responses), [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(q("format", {"think_tag": "reason"}, ["<reason>r</reason><answer>a</answer>"]), [1])


def test_rule_scores_map_onto_the_dimension_scale():
    rule = R.make_rule("length", {"min": 4, "max": 8})
    np.testing.assert_allclose(R.rule_scores(rule, ["a b c d", "a b"], 1, 5), [5.0, 3.0])
    np.testing.assert_allclose(R.rule_scores(rule, ["a b c d", ""], 0, 1), [1.0, 0.0])


def test_rules_are_deterministic_and_return_one_score_per_response():
    responses = ["首先…其次…最后", "plain", "", "<think>a</think><answer>b</answer>"] * 5
    for name, params in [
        ("regex", {"pattern": "a"}),
        ("keywords", {"words": ["plain"]}),
        ("disclaimer", {}),
        ("length", {"min": 1, "max": 3}),
        ("ngram_redundancy", {}),
        ("template_phrases", {}),
        ("format", {}),
    ]:
        first = q(name, params, responses)
        assert first.shape == (20,) and first.dtype == np.float64
        assert ((first >= 0) & (first <= 1)).all()
        np.testing.assert_array_equal(first, q(name, params, responses))
    assert q("format", {}, []).shape == (0,)


@pytest.mark.parametrize(
    "name, params, fragment",
    [
        ("regexx", {"pattern": "a"}, "unknown rule 'regexx'"),
        ("regex", {}, "rule 'regex', param 'pattern': missing required"),
        ("regex", {"pattern": "("}, "rule 'regex', param 'pattern': invalid regular expression"),
        ("regex", {"pattern": "a", "mode": "should"}, "rule 'regex', param 'mode'"),
        # The engine unrolls counted repeats while compiling: these would never finish (or exhaust memory).
        ("regex", {"pattern": "a{1000000000}"}, "rule 'regex', param 'pattern': counted repeats expand"),
        ("regex", {"pattern": "(?:(?:a{100}){100}){100}"}, "rule 'regex', param 'pattern': counted repeats expand"),
        ("regex", {"pattern": "(" * 5000 + ")" * 5000}, "rule 'regex', param 'pattern': invalid regular expression"),
        ("length", {"max": 10**400}, "rule 'length', param 'max': expected an integer in [1, 1000000000]"),
        ("keywords", {"words": "water"}, "rule 'keywords', param 'words'"),
        ("keywords", {"words": []}, "rule 'keywords', param 'words'"),
        ("keywords", {"words": ["a"], "colour": 1}, "rule 'keywords', param 'colour': unknown parameter"),
        ("keywords", {"words": ["a"], "ignore_case": "yes"}, "rule 'keywords', param 'ignore_case'"),
        ("length", {"min": -1, "max": 3}, "rule 'length', param 'min'"),
        ("length", {"min": 5, "max": 3}, "rule 'length', param 'max'"),
        ("length", {"min": 2.5}, "rule 'length', param 'min'"),
        ("length", {}, "rule 'length', param 'max'"),
        ("length", {"max": 9, "unit": "tokens"}, "rule 'length', param 'unit'"),
        ("ngram_redundancy", {"n": 0}, "rule 'ngram_redundancy', param 'n'"),
        ("ngram_redundancy", {"n": True}, "rule 'ngram_redundancy', param 'n'"),
        ("template_phrases", {"templates": ["首先"]}, "rule 'template_phrases', param 'templates'"),
        ("disclaimer", {"phrases": [""]}, "rule 'disclaimer', param 'phrases'"),
        ("format", {"answer_tag": "a>b"}, "rule 'format', param 'answer_tag'"),
    ],
)
def test_invalid_rules_fail_naming_rule_and_param(name, params, fragment):
    with pytest.raises(R.RuleError) as info:
        R.make_rule(name, params)
    assert fragment in str(info.value)


def test_registry_lists_every_rule():
    assert R.rule_names() == sorted(
        ["disclaimer", "format", "keywords", "length", "ngram_redundancy", "regex", "template_phrases"]
    )


def test_a_catastrophic_regex_fails_one_score_instead_of_hanging(monkeypatch):
    text = "a" * 40 + "b"
    # The pattern: Python's `re` backtracks about 2**40 times here; the regex engine answers at once.
    np.testing.assert_array_equal(q("regex", {"pattern": r"(a+)+$"}, [text, "aaa"]), [0, 1])
    monkeypatch.setattr(R, "REGEX_TIMEOUT_S", 0.05)
    # A pattern the engine backtracks on too: that search stops at the timeout and its score is NaN (failed),
    # and so are the later rows of the call, which are not searched.
    rule = R.make_rule("regex", {"pattern": r"(a|aa)+$", "mode": "must_not"})
    np.testing.assert_array_equal(rule(["aaa", "bbb", text, "aaa"]), [0, 1, np.nan, np.nan])
    np.testing.assert_array_equal(R.rule_scores(rule, ["bbb", text], 1, 5), [5, np.nan])
    np.testing.assert_array_equal(rule(["bbb"]), [1])  # the next call searches again
    assert rule.failure_cause == "regex_timeout" and R.Length.failure_cause == "rule_failed"


class _CountingPattern:
    """Stands in for a compiled regex: records each search's timeout; times out from search `timeout_at` on."""

    def __init__(self, timeout_at: int | None = None):
        self.timeouts: list[float] = []
        self.timeout_at = timeout_at

    def search(self, text: str, timeout: float):
        self.timeouts.append(timeout)
        if self.timeout_at is not None and len(self.timeouts) >= self.timeout_at:
            raise TimeoutError("regex timed out")
        return None


def test_a_regex_is_not_searched_again_in_a_call_after_its_first_timeout():
    """20 catastrophic regexes x 10 rows took 199 s: one timeout per rule and call now, counted by searches."""
    rule = R.make_rule("regex", {"pattern": "x", "mode": "must_not"})
    rule.__dict__["compiled"] = pattern = _CountingPattern(timeout_at=2)
    np.testing.assert_array_equal(rule(["r"] * 10), [1] + [np.nan] * 9)
    assert len(pattern.timeouts) == 2  # not 10
    assert pattern.timeouts == [R.REGEX_TIMEOUT_S] * 2


def test_a_regex_rules_searches_share_one_budget_per_call(monkeypatch):
    """Searches that each stay under the timeout but add up: the call's budget ends them (a fake clock)."""
    now = [0.0]
    monkeypatch.setattr(R, "_clock", lambda: now[0])
    rule = R.make_rule("regex", {"pattern": "x"})

    class Slow(_CountingPattern):
        def search(self, text, timeout):
            now[0] += 0.4  # each search takes 0.4 s of the budget
            return super().search(text, timeout)

    rule.__dict__["compiled"] = pattern = Slow()
    out = rule(["r"] * 100)
    searched = len(pattern.timeouts)
    assert searched == 13  # 12 x 0.4 s = 4.8 s of the 5 s budget; the 13th is given the 0.2 s left
    assert pattern.timeouts[-1] == pytest.approx(R.REGEX_CALL_BUDGET_S - 12 * 0.4)
    np.testing.assert_array_equal(out, [0] * searched + [np.nan] * (100 - searched))


def test_keyword_lists_are_capped_and_patterns_compile_once_per_rule(monkeypatch):
    """A 300k-keyword rubric did not score 7 rows in 300 s (patterns recompiled on every call)."""
    compiled = []
    real = R.phrase_pattern
    monkeypatch.setattr(R, "phrase_pattern", lambda *a: compiled.append(a) or real(*a))
    rules = [R.make_rule("keywords", {"words": ["thank you", "please"], "mode": mode})
             for mode in ("any", "all", "none")]
    rules += [R.make_rule("disclaimer", {}), R.make_rule("template_phrases", {})]
    responses = ["thank you, please", "nothing", "firstly a, secondly b, finally c"]
    first = [list(rule(responses)) for rule in rules]
    built = len(compiled)
    assert built == 2 + 2 + 2 + len(R.DEFAULT_DISCLAIMERS) + sum(map(len, R.DEFAULT_TEMPLATES))
    assert [list(rule(responses)) for rule in rules] == first == [
        [1, 0, 0], [1, 0, 0], [0, 1, 1], [0, 0, 0], [1, 1, 0]]
    assert len(compiled) == built  # the second call compiled nothing
    with pytest.raises(R.RuleError, match=rf"rule 'keywords', param 'words': {R.MAX_PHRASES + 1} entries; at most"):
        R.make_rule("keywords", {"words": [f"w{i}" for i in range(R.MAX_PHRASES + 1)]})
    with pytest.raises(R.RuleError, match="rule 'template_phrases', param 'templates': 1002 markers in all"):
        R.make_rule("template_phrases", {"templates": [["a", "b"]] * 501})


def test_regex_keeps_python_syntax_and_unicode_classes():
    responses = ["答案是 四十二", "naïve café", "ascii only", "x1y1"]
    np.testing.assert_array_equal(q("regex", {"pattern": r"^\w+\s\w+$"}, responses), [1, 1, 1, 0])
    np.testing.assert_array_equal(q("regex", {"pattern": r"caf(?=é)"}, responses), [0, 1, 0, 0])
    np.testing.assert_array_equal(q("regex", {"pattern": r"x(\d)y\1"}, responses), [0, 0, 0, 1])
    assert R.regex_expansion(r"\d{4}-\d{2}-\d{2}") == 10 and R.regex_expansion(r"\p{Han}{3}[{]{2}") == 5

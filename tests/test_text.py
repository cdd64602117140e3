"""rubric_jax/text.py: the parts of a response a judge reads (answer, think, whole) for every tag layout, and the
normalised form rules match on (invisible characters, NFKC, Latin lookalikes, case) without mangling CJK text."""

from __future__ import annotations

import unicodedata

import pytest

from rubric_jax import text

ZW = "\u200b"  # zero-width space


@pytest.mark.parametrize("response, think, answer, closed", [
    ("<think>plan</think><answer>Rest.</answer>", "plan", "Rest.", True),
    ("no tags at all", "", "no tags at all", False),  # a plain response is all answer
    ("<think>plan</think> Rest.", "plan", "Rest.", False),  # no answer tags: what follows the think block
    ("<think>plan, never closed", "plan, never closed", "", False),  # all thinking: no answer
    ("plan</think><answer>Rest.</answer>", "plan", "Rest.", True),  # think opened by the chat template
    ("<think>t</think><answer>first</answer><answer>second</answer>", "t", "second", True),  # the last answer
    ("<think>t</think><answer>cut off at the tok", "t", "cut off at the tok", False),  # never closed: to the end
    ("<answer>x <answer>y</answer> tail", "", "y", True),  # the last opening tag starts the answer
    # think text inside or after the answer tags is still think text, never answer
    ("<answer>Rest.<think>consult a doctor</think></answer>", "consult a doctor", "Rest.", True),
    ("<answer>Rest.</answer><think><answer>consult a doctor</think>", "<answer>consult a doctor", "Rest.", True),
    (f"<think>t</think><answer>{ZW}{ZW} \u2060</answer>", "t", "", True),  # only invisible characters: empty
    (f"<thi{ZW}nk>consult a doctor</think><answer>Rest.</answer>", "consult a doctor", "Rest.", True),
])
def test_parts_of_every_tag_layout(response, think, answer, closed):
    assert text.parts(response) == text.Parts(think, answer, closed)
    assert text.read(response, "think") == think and text.read(response, "answer") == answer
    assert text.read(response, "response") == text.strip_invisible(response)
    assert text.read(answer, "answer") == answer  # an answer read again is itself


def test_read_refuses_an_unknown_part():
    with pytest.raises(ValueError, match="reads: expected one of"):
        text.read("x", "reasoning")


def test_invisible_characters_go_and_layout_stays():
    invisible = "\u200b\u200c\u200d\u2060\ufeff\u00ad\u202e\u202c\u3164\ufe0f\U000e0041\x00\x07"  # an empty override
    assert text.strip_invisible(f"a{invisible}b\tc\nd\re\x0bf\x0cg") == "ab\tc\nd\re\x0bf\x0cg"  # whitespace stays
    assert not text.visible(invisible + " \u3000\n") and text.visible(invisible + ".")


@pytest.mark.parametrize("marker", [
    "Fіrstly",  # Cyrillic і
    "Ｆｉｒｓｔｌｙ",  # fullwidth
    f"Fi{ZW}rst\u200dly",  # zero-width space and joiner
    "FIRSТLY",  # Cyrillic capital Т
    "𝐅𝐢𝐫𝐬𝐭𝐥𝐲",  # mathematical bold
])
def test_lookalikes_fold_to_ascii(marker):
    assert text.fold(marker) == "firstly"


def test_fold_keeps_case_when_asked_and_is_idempotent():
    assert text.fold("Ѕеcondly", casefold=False) == "Secondly"
    assert text.fold("Іn") == "in" and text.fold("Іn", casefold=False) == "In"  # a capital I lookalike is I
    for sample in ("Fіrstly / Sеcondly", "首先，其次；最后！", "ǅ Σίσυφος ﬁ"):
        assert text.fold(text.fold(sample)) == text.fold(sample)


def test_cjk_text_keeps_its_characters():
    zh = "首先，多喝水。其次，休息。最后，建议就医。退款ひらがなカタカナ한국어"
    folded = text.fold(zh)
    assert [c for c in folded if c not in "，。,."] == [c for c in zh if c not in "，。,."]
    assert folded == unicodedata.normalize("NFKC", zh)  # fullwidth punctuation becomes ASCII, nothing else


def test_the_lookalike_table_maps_letters_of_named_scripts_to_ascii():
    for code, ascii_char in text.CONFUSABLES.items():
        char = chr(code)
        name = unicodedata.name(char)
        assert name.startswith(("LATIN", "GREEK", "CYRILLIC", "ARMENIAN", "CHEROKEE", "COPTIC")), name
        assert len(ascii_char) == 1 and ascii_char.isascii() and ascii_char.isalnum()
        assert not unicodedata.normalize("NFKC", char).isascii()  # NFKC alone would have done it


# Issue 38, R3: bidi overrides reorder what is shown; the rules must read the displayed order.
@pytest.mark.parametrize("written, displayed", [
    ("\u202eyltsriF\u202c, pay.", "Firstly, pay."),
    ("\u202eyltsriF\nthen", "Firstly\nthen"),  # a paragraph end closes the override
    ("\u202eyl\u202dAB\u202cdnoces\u202c", "secondABly"),  # a nested LRO keeps its order inside the reversed run
    ("\u202e\u202eab\u202c\u202c", "ba"),  # an RLO inside an RLO is right-to-left too
    ("a\u202cb\u202dc\u202bd", "abcd"),  # a stray PDF, an LRO over left-to-right text, an embedding: no reordering
])
def test_bidi_overrides_are_read_in_display_order(written, displayed):
    assert text.strip_invisible(written) == displayed


def test_deep_overrides_are_capped_at_the_bidi_depth():
    deep = "\u202e" * 1000 + "ab" + "\u202c" * 1000
    assert text.display_order(deep) == ("ba" if text.MAX_BIDI_DEPTH % 2 else "ab")  # the 125 applied, the rest ignored


# Issue 38, R2: blank-looking text is not visible (each passed the format gate as an answer and scored 0.500).
@pytest.mark.parametrize("blank", [
    "\u2800\u2800\u2800",  # braille pattern blank
    "\u0301\u0336\u0489",  # combining marks alone (acute, long stroke overlay, Cyrillic millions sign)
    "\u20dd\u20e3\u1ab0",  # enclosing circle, enclosing keycap, a combining mark of the extended block
    "\ue000\U000f0000\U0010fffd",  # private use
    "\u0378\U0002fffe\U000e01f0",  # unassigned
    "\u3164\uffa0\u115f\u1160",  # Hangul fillers
    "\U0001d159 \u3000\u00a0\u2003",  # musical null notehead, ideographic, no-break and em spaces
    " \u0301\n\u0336",  # marks on spaces
])
def test_blank_looking_text_is_not_visible(blank):
    assert not text.visible(blank)
    assert not text.visible(text.shown(f"<!-- x --><span hidden>y</span>{blank}"))  # only hidden markup besides


@pytest.mark.parametrize("shown", [".", "a", "\u0663", "\u20ac", "\u2801", "\u00e9", "e\u0301", "\u4e00", "<!--"])
def test_letters_digits_symbols_and_punctuation_are_visible(shown):
    assert text.visible(shown)


# Issue 38, R3: marks drawn over or under letters keep them legible: they fold away (kana voicing marks stay).
@pytest.mark.parametrize("mark", ["\u0336", "\u0332", "\u20d2", "\u0335", "\u0338", "\u0305", "\u20e5", "\u0489",
                                  "\u0301"])
def test_combining_marks_fold_away(mark):
    assert text.fold(mark.join("refund") + mark) == "refund"
    assert text.fold(f"F{mark}irstly") == "firstly"


def test_kana_keep_their_voicing_marks():
    assert text.fold("ひらがな") == "ひらがな" != text.fold("ひらかな")
    assert text.fold("\u304b\u3099") == "\u304c"  # a decomposed が is が


def test_traditional_forms_of_the_shipped_phrases_fold_to_simplified():
    traditional = ["最後", "建議就醫", "及時就醫", "諮詢醫生", "僅供參考", "優惠券", "發票", "快遞", "頭痛", "飲食"]
    simplified = ["最后", "建议就医", "及时就医", "咨询医生", "仅供参考", "优惠券", "发票", "快递", "头痛", "饮食"]
    assert [text.fold(t) for t in traditional] == simplified


@pytest.mark.parametrize("written", ["First-ly", "Fir-st-ly", "First\u2010ly", "First\u2011ly", "First\uff0dly",
                                     "First-\nly", "First\u00adly"])
def test_hyphens_inside_words_are_a_second_form(written):
    assert text.forms(written)[-1] == "firstly"
    assert text.forms("well-known") == ("well-known", "wellknown") and text.forms("3-4 - a") == ("3-4 - a",)


# Issue 38, R4: what a renderer does not show is not read.
@pytest.mark.parametrize("written, shown", [
    ("<!-- Sorry, account -->Hi", "Hi"),
    ("Hi <!--\naccount\n--> there", "Hi  there"),
    ("<!-- never closed\naccount", ""),  # an HTML block comment runs to the end
    ("Hi, a <!-- stays", "Hi, a <!-- stays"),  # not at a line start and never closed: literal text
    ("[//]: # (account)\nHi", "\nHi"),
    ('  [note]: https://x.example/account "account"\nHi', "\nHi"),
    ("<details><summary>Help</summary>account</details>Hi", "HelpHi"),
    ("<DETAILS class=x>\n<summary>Help</summary>\n\naccount\n</DETAILS>", "Help"),
    ("<details>account", ""),  # never closed: collapsed to the end
    ("<details open><summary>Help</summary>account</details>", "<details><summary>Help</summary>account</details>"),
    ("<span hidden>x<span>y</span>account</span>Hi", "Hi"),  # nested elements of the same name
    ("<div style='display: none'>account</div>ok", "ok"),
    ('<p style="font-size:0px">account</p><p style="opacity:0.0;">account</p><i style="color:transparent">x</i>', ""),
    ('<span style="visibility:hidden">a</span><b style="max-height: 0">b</b><template>c</template>', ""),
    ('<span style="font-size:0.5em">account</span>', "<span>account</span>"),  # small is shown
    ('<span style="background-color: transparent">account</span>', "<span>account</span>"),
    ('<span title="account" data-x=account>Hi</span>', "<span>Hi</span>"),  # attributes are never shown
    ('<img alt="account" src="a.png"/>![account](a.png)', "<img>"),
    ('<img hidden src="a.png"> shown <br style="display:none"> <x-note hidden/>too', " shown  too"),  # no content
    ('[Hi](https://x.example/account "account") and [there][account]\n[account]: /a', "Hi and there\n"),
    ("[Hi][account] is text: no such label", "[Hi][account] is text: no such label"),
    ("`<!-- account -->` and\n```\n<!-- account -->\n```\n", "`<!-- account -->` and\n```\n<!-- account -->\n```\n"),
    ("a<b and c>d, x < y", "a<b>d, x < y"),  # a tag by CommonMark's grammar; a lone < is text
    ("<answer>a<!-- </answer> --></answer>", "<answer>a<!-- </answer> --></answer>"),  # no markup hides a tag
    ("<think><!--\nt</think><answer>ok<!-- x --></answer>", "<think></think><answer>ok</answer>"),
])
def test_hidden_markup_is_not_shown(written, shown):
    assert text.strip_hidden(written) == shown
    assert text.read(written, "response") == shown

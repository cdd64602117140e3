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
    invisible = "\u200b\u200c\u200d\u2060\ufeff\u00ad\u202e\u3164\ufe0f\U000e0041\x00\x0b"
    assert text.strip_invisible(f"a{invisible}b\tc\nd\re") == "ab\tc\nd\re"
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

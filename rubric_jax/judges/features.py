"""Surface features of response text that a judge should NOT reward (RubricRL 3.3, 6.1): length, list
and markdown structure, template markers, language. The bias probes regress judge errors on them and a
fitted score correction (rubrics/correction.py) subtracts their effect, so both read them from here.

  length     text units (rules.count_length "auto": words, and CJK characters one by one)
  list       1 if at least two lines are list items ("- x", "* x", "• x", "1. x", "2) x", "3、x")
  markdown   1 if the text has a heading, **bold**, a ``` code fence or a | table | row
  template   1 if the rule library's template detector fires (首先…其次…最后, first…second…finally, EN and ZH)
  cjk_share  share of text units that are CJK / kana / hangul characters (0 = English, 1 = Chinese)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from rubric_jax.judges.rules import TemplatePhrases, count_length, text_units

FEATURES = ("length", "list", "markdown", "template", "cjk_share")
_LIST_ITEM_RE = re.compile(r"^[ \t]*(?:[-*+•]|\d{1,3}[.)、])[ \t]*\S", re.MULTILINE)
_MARKDOWN_RE = re.compile(r"^[ \t]*#{1,6}[ \t]+\S|\*\*[^*\n]+\*\*|^[ \t]*```|^[ \t]*\|.*\|[ \t]*$", re.MULTILINE)
_FIRST_CJK = 0x2E80  # text_units keeps CJK characters as one-character units; no letter run below this is one


def _cjk_share(text: str) -> float:
    units = text_units(text)
    if not units:
        return 0.0
    return sum(len(u) == 1 and ord(u) >= _FIRST_CJK for u in units) / len(units)


def response_features(responses: Sequence[str]) -> dict[str, np.ndarray]:
    """Feature name (FEATURES order) -> float64 [N] over the responses."""
    return {
        "length": np.array([count_length(r, "auto") for r in responses], dtype=np.float64),
        "list": np.array([len(_LIST_ITEM_RE.findall(r)) >= 2 for r in responses], dtype=np.float64),
        "markdown": np.array([_MARKDOWN_RE.search(r) is not None for r in responses], dtype=np.float64),
        "template": TemplatePhrases().matches(responses).astype(np.float64),
        "cjk_share": np.array([_cjk_share(r) for r in responses], dtype=np.float64),
    }

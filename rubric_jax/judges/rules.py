"""Rule judges: deterministic scorers of response text, built by name from validated parameters.

A rule is a frozen dataclass of its parameters, built once (at rubric load) with `make_rule(name,
params)`; calling it on a batch of N responses returns a quality q_N in [0, 1] (1 = satisfies the
rule), or NaN where the rule could not decide (the rule's `failure_cause` says why; the reward counts it
as a failed score). `rule_scores` maps q_N onto a dimension's scale [low, high] linearly. Rules see only
the response text, so nothing a response says about its own score can change them except the text
features the rule measures. Rules receive the part of the response their dimension reads, as a user sees it
(judges/reward.py, rubric_jax/text.py: bidi overrides applied, invisible characters and hidden markup removed); the
phrase rules (keywords, disclaimer, template markers) match on `text.forms` of the response against `text.fold`
forms of the phrases (combining marks removed, NFKC, Traditional forms of the shipped phrases made Simplified,
ASCII for Latin lookalikes, case folded; the response also with its in-word hyphens removed), so `Fіrstly` with a
Cyrillic і, fullwidth `Ｆｉｒｓｔｌｙ`, struck-through `F̶irstly`, `First-ly` and 最後 are `firstly` and 最后.

User regexes are bounded: the `regex` engine (Python `re` syntax and Unicode classes) searches with a
timeout of REGEX_TIMEOUT_S per response, and a rule's searches in one call share a budget of
REGEX_CALL_BUDGET_S; the first search that runs out ends the rule's searches for that call, so a
catastrophic pattern such as `(a+)+$` costs at most one timeout per call however many rows there are (its
scores on the rows left are NaN with cause "regex_timeout", counted) instead of hanging training. Counted
repeats that the engine would expand at compile time (`a{1000000000}`) are refused when the rule is built.

Patterns are compiled once per rule (on first use, then kept on the instance), and phrase lists are capped
(MAX_PHRASES per rule; reward.py caps a rubric's total at MAX_RUBRIC_PHRASES), so a rubric's size bounds
its cost per row.

Text units (`text_units`): every CJK character is one unit and every run of non-CJK letters is one
word, so lengths count words for English and characters for Chinese (the LongBench-Write convention,
../shared/data/longbench_write/FORMULA.md) and mixed text counts both.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NoReturn

import numpy as np
import regex

from rubric_jax import text as text_forms
from rubric_jax.rubrics.schema import short_repr

# CJK unified ideographs (+ extension A, compatibility), kana and hangul: one unit per character.
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
_UNIT_RE = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])[^\W\d_])+(?:['’](?:(?![{_CJK}])[^\W\d_])+)*")
_LATIN_EDGE_RE = re.compile(r"[A-Za-z0-9_]")
MAX_INT_PARAM = 10**9  # integer rule parameters (lengths, n-gram sizes): larger ones overflow float64 maths
REGEX_TIMEOUT_S = 0.5  # per search; a linear pattern needs well under a millisecond on a 16k-character response
REGEX_CALL_BUDGET_S = 5.0  # all of one regex rule's searches in one call (each still at most REGEX_TIMEOUT_S)
MAX_PHRASES = 1000  # keywords, disclaimer phrases or template markers of one rule: each is one search per row
MAX_RUBRIC_PHRASES = 5000  # the same over all rule dimensions of one rubric (about 0.2 s per 3k-character row)
MAX_REGEX_EXPANSION = 100_000  # pattern items after expanding counted repeats (about 0.2 s of compile time)
_COUNT_RE = re.compile(r"\{(\d+)(?:,(\d*))?\}")


class RuleError(ValueError):
    """An unknown rule name or an invalid rule parameter."""


def _fail(rule: str, param: str, message: str) -> NoReturn:
    raise RuleError(f"rule {rule!r}, param {param!r}: {message}")


def _check_str(rule: str, param: str, value: Any) -> str:
    if not isinstance(value, str) or not text_forms.visible(value):
        _fail(rule, param, f"expected a string with visible text, got {short_repr(value)}")
    return value


def _check_str_list(rule: str, param: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        _fail(rule, param, f"expected a non-empty list of strings, got {short_repr(value)}")
    if len(value) > MAX_PHRASES:
        _fail(rule, param, f"{len(value)} entries; at most {MAX_PHRASES} (each one is a search of every response)")
    for item in value:
        _check_str(rule, param, item)
    return tuple(value)


def _check_bool(rule: str, param: str, value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(rule, param, f"expected true/false, got {short_repr(value)}")
    return value


def _check_int(rule: str, param: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_INT_PARAM:
        _fail(rule, param, f"expected an integer in [{minimum}, {MAX_INT_PARAM}], got {short_repr(value)}")
    return value


def _check_choice(rule: str, param: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        _fail(rule, param, f"expected one of {list(choices)}, got {short_repr(value)}")
    return value


def text_units(text: str) -> list[str]:
    """Words (non-CJK letter runs, casefolded) and single CJK characters, in order."""
    return [m.group(0).casefold() for m in _UNIT_RE.finditer(text)]


def phrase_pattern(phrase: str, ignore_case: bool = True) -> re.Pattern[str]:
    """A literal phrase as a regex, with word boundaries where the phrase starts/ends in a Latin word char."""
    body = re.escape(phrase)
    left = r"\b" if _LATIN_EDGE_RE.match(phrase[0]) else ""
    right = r"\b" if _LATIN_EDGE_RE.match(phrase[-1]) else ""
    return re.compile(left + body + right, re.IGNORECASE if ignore_case else 0)


def folded_pattern(phrase: str, ignore_case: bool = True) -> re.Pattern[str]:
    """`phrase_pattern` of the phrase's `text.fold` form (without case folding when not `ignore_case`)."""
    return phrase_pattern(text_forms.fold(phrase, ignore_case), ignore_case)


def any_phrase_pattern(phrases: Sequence[str], ignore_case: bool = True) -> re.Pattern[str]:
    """One regex that matches where any of `phrases` does (`folded_pattern` each): one search per response."""
    return re.compile("|".join(f"(?:{folded_pattern(p, ignore_case).pattern})" for p in phrases),
                      re.IGNORECASE if ignore_case else 0)


def pattern_hits(responses: Sequence[str], patterns: Sequence[re.Pattern[str]], ignore_case: bool = True
                 ) -> np.ndarray:
    """[N, K] bool: one of the `text.forms` of response n (without case folding when not `ignore_case`) matches
    pattern k somewhere."""
    hits_NxK = np.zeros((len(responses), len(patterns)), dtype=bool)
    for n, forms in enumerate(text_forms.forms(r, ignore_case) for r in responses):
        for k, pattern in enumerate(patterns):
            hits_NxK[n, k] = any(pattern.search(form) is not None for form in forms)
    return hits_NxK


_REGISTRY: dict[str, type] = {}


def _register(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def rule_names() -> list[str]:
    """Names of all registered rules."""
    return sorted(_REGISTRY)


def make_rule(name: str, params: Mapping[str, Any]) -> Rule:
    """Builds the rule `name` from `params`, failing with the rule and param named on any problem."""
    if name not in _REGISTRY:
        raise RuleError(f"unknown rule {short_repr(name)}; known rules: {rule_names()}")
    if not isinstance(params, Mapping):
        raise RuleError(f"rule {name!r}: params must be a mapping, got {short_repr(params)}")
    cls = _REGISTRY[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in params:
        if key not in fields:
            _fail(name, key, f"unknown parameter; allowed: {sorted(fields)}")
    for key, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and key not in params:
            _fail(name, key, "missing required parameter")
    return cls(**params)


class Rule(abc.ABC):
    """Base of all rules: `__call__(responses) -> q_N` in [0, 1], NaN where the rule could not decide."""

    name: ClassVar[str]
    failure_cause: ClassVar[str] = "rule_failed"  # why this rule returns NaN (reported per dimension)

    @abc.abstractmethod
    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        """Quality in [0, 1] per response (1 = the rule is fully satisfied), NaN = could not decide."""

    def phrase_count(self) -> int:
        """Phrases (keywords, markers) the rule searches each response for; counted against MAX_RUBRIC_PHRASES."""
        return 0


def rule_scores(rule: Rule, responses: Sequence[str], low: float, high: float) -> np.ndarray:
    """The rule's quality per response mapped linearly onto the scale [low, high] (float64 [N])."""
    q_N = np.asarray(rule(list(responses)), dtype=np.float64)
    return low + q_N * (high - low)


def regex_expansion(pattern: str) -> int:
    """Pattern items after expanding counted repeats, as the `regex` engine does when it compiles.

    `regex` unrolls the mandatory part of `x{m,n}` (m copies; nested repeats multiply), so compile time
    and memory grow with this number: `a{1000000000}` would never finish compiling. A conservative
    scan: every character outside a class is an item, a class or an escape is one; alternatives add.
    """
    totals, last, i = [0], 0, 0  # running item count per open group; items of the last atom
    while i < len(pattern):
        c, step, atom = pattern[i], 1, 1
        if c == "(":
            totals.append(0)
            last, i = 0, i + 1
            continue
        if c == "{" and (m := _COUNT_RE.match(pattern, i)):
            if len(m.group(1)) > 9:
                return MAX_REGEX_EXPANSION + 1
            totals[-1] += last * (max(int(m.group(1)), 1) - 1)
            last, i = 0, m.end()
        else:
            if c == "\\":
                step = 2
                if pattern[i + 1 : i + 2] in ("p", "P", "N", "x") and pattern[i + 2 : i + 3] == "{":  # \p{Han}
                    step = max(pattern.find("}", i + 2) + 1 - i, 3)
            elif c == "[":
                j = i + 1 + (pattern[i + 1 : i + 2] == "^")
                j += pattern[j : j + 1] == "]"
                while j < len(pattern) and pattern[j] != "]":
                    j += 2 if pattern[j] == "\\" else 1
                step = j + 1 - i
            elif c == ")" and len(totals) > 1:
                atom = totals.pop()
            totals[-1] += atom
            last, i = atom, i + step
        if totals[-1] > MAX_REGEX_EXPANSION:
            return totals[-1]
    return sum(totals)


_clock = time.monotonic  # the regex budget's clock (tests replace it)


@_register("regex")
@dataclasses.dataclass(frozen=True)
class Regex(Rule):
    """1 if the pattern is found ("must") / not found ("must_not") anywhere in the response, else 0.

    A search that runs past REGEX_TIMEOUT_S (catastrophic backtracking), or past what is left of the call's
    REGEX_CALL_BUDGET_S, gives NaN for that response and every later one of the call (not searched): failed
    scores with cause "regex_timeout", never a hang and never a guessed 0 or 1.
    """

    pattern: str
    mode: str = "must"
    ignore_case: bool = False
    failure_cause: ClassVar[str] = "regex_timeout"

    def __post_init__(self) -> None:
        _check_str(self.name, "pattern", self.pattern)
        _check_choice(self.name, "mode", self.mode, ("must", "must_not"))
        _check_bool(self.name, "ignore_case", self.ignore_case)
        if regex_expansion(self.pattern) > MAX_REGEX_EXPANSION:
            _fail(self.name, "pattern", f"counted repeats expand {short_repr(self.pattern)} to more than "
                                        f"{MAX_REGEX_EXPANSION} items; use smaller counts or * / +")
        try:
            self.compiled
        except (regex.error, RecursionError, OverflowError, ValueError) as e:
            _fail(self.name, "pattern", f"invalid regular expression {short_repr(self.pattern)}: {e}")

    @functools.cached_property
    def compiled(self) -> regex.Pattern:
        """The pattern compiled once (cached on the instance)."""
        return regex.compile(self.pattern, regex.VERSION0 | (regex.IGNORECASE if self.ignore_case else 0))

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        found_N = np.full((len(responses),), np.nan)
        deadline = _clock() + REGEX_CALL_BUDGET_S
        for n, text in enumerate(responses):
            timeout = min(REGEX_TIMEOUT_S, deadline - _clock())
            if timeout <= 0:
                break
            try:
                found_N[n] = self.compiled.search(text, timeout=timeout) is not None
            except TimeoutError:
                break  # it backtracks catastrophically, or the budget is spent: no more searches this call
        return found_N if self.mode == "must" else 1.0 - found_N


@_register("keywords")
@dataclasses.dataclass(frozen=True)
class Keywords(Rule):
    """1 if any / all / none of the keywords occur (Latin keywords match whole words), else 0."""

    words: tuple[str, ...]
    mode: str = "any"
    ignore_case: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "words", _check_str_list(self.name, "words", self.words))
        _check_choice(self.name, "mode", self.mode, ("any", "all", "none"))
        _check_bool(self.name, "ignore_case", self.ignore_case)

    @functools.cached_property
    def patterns(self) -> tuple[re.Pattern[str], ...]:
        """Compiled once: one pattern per keyword for "all", one alternation of them all for "any"/"none"."""
        if self.mode == "all":
            return tuple(folded_pattern(w, self.ignore_case) for w in self.words)
        return (any_phrase_pattern(self.words, self.ignore_case),)

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        hits_NxK = pattern_hits(responses, self.patterns, self.ignore_case)
        if self.mode == "none":
            return (~hits_NxK[:, 0]).astype(np.float64)
        return hits_NxK.all(axis=1).astype(np.float64)  # "all": every keyword; "any": the one alternation

    def phrase_count(self) -> int:
        return len(self.words)


DEFAULT_DISCLAIMERS = (
    "建议就医",
    "及时就医",
    "咨询医生",
    "不能替代",
    "仅供参考",
    "consult a doctor",
    "consult your doctor",
    "consult a healthcare professional",
    "seek medical attention",
    "seek medical advice",
    "not a substitute for professional",
    "not medical advice",
)


@_register("disclaimer")
@dataclasses.dataclass(frozen=True)
class Disclaimer(Rule):
    """1 if the response contains at least one safety/disclaimer phrase (EN and ZH defaults), else 0."""

    phrases: tuple[str, ...] = DEFAULT_DISCLAIMERS

    def __post_init__(self) -> None:
        object.__setattr__(self, "phrases", _check_str_list(self.name, "phrases", self.phrases))

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        """All phrases as one alternation, compiled once."""
        return any_phrase_pattern(self.phrases)

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        return pattern_hits(responses, [self.pattern])[:, 0].astype(np.float64)

    def phrase_count(self) -> int:
        return len(self.phrases)


def count_length(text: str, unit: str) -> int:
    """Length of `text` in "auto" units (CJK chars + words), whitespace "words", or non-space "chars"."""
    if unit == "auto":
        return len(text_units(text))
    if unit == "words":
        return len(text.split())
    return sum(1 for c in text if not c.isspace())


@_register("length")
@dataclasses.dataclass(frozen=True)
class Length(Rule):
    """1 inside [min, max]; outside it falls as in LongBench-Write: 0 at length min/3 and at 4 * max."""

    min: int = 0
    max: int | None = None
    unit: str = "auto"

    def __post_init__(self) -> None:
        _check_int(self.name, "min", self.min, 0)
        if self.max is not None:
            _check_int(self.name, "max", self.max, max(self.min, 1))
        elif self.min == 0:
            _fail(self.name, "max", "give max, or a min > 0 (an empty range bounds nothing)")
        _check_choice(self.name, "unit", self.unit, ("auto", "words", "chars"))

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        y_N = np.array([count_length(r, self.unit) for r in responses], dtype=np.float64)
        q_N = np.ones_like(y_N)
        if self.min > 0:
            short_N = y_N < self.min
            safe_y_N = np.where(y_N > 0, y_N, 1.0)
            short_q_N = np.where(y_N > 0, np.maximum(0.0, 1.0 - (self.min / safe_y_N - 1.0) / 2.0), 0.0)
            q_N = np.where(short_N, short_q_N, q_N)
        if self.max is not None:
            long_q_N = np.maximum(0.0, 1.0 - (y_N / self.max - 1.0) / 3.0)
            q_N = np.where(y_N > self.max, long_q_N, q_N)
        return q_N


def repetition_rate(text: str, n: int) -> float:
    """1 - distinct/total over the text's unit n-grams (0 when it has fewer than n units)."""
    units = text_units(text)
    total = len(units) - n + 1
    if total <= 0:
        return 0.0
    distinct = len({tuple(units[i : i + n]) for i in range(total)})
    return 1.0 - distinct / total


@_register("ngram_redundancy")
@dataclasses.dataclass(frozen=True)
class NgramRedundancy(Rule):
    """1 - repetition rate of unit n-grams: a penalty dimension, lower when the response repeats itself."""

    n: int = 3

    def __post_init__(self) -> None:
        _check_int(self.name, "n", self.n, 1)

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        return np.array([1.0 - repetition_rate(r, self.n) for r in responses], dtype=np.float64)


DEFAULT_TEMPLATES = (
    ("首先", "其次", "最后"),
    ("first", "second", "finally"),
    ("firstly", "secondly", "finally"),
)


def _in_order(text: str, patterns: Sequence[re.Pattern[str]]) -> bool:
    start = 0
    for pattern in patterns:
        m = pattern.search(text, start)
        if m is None:
            return False
        start = m.end()
    return True


@_register("template_phrases")
@dataclasses.dataclass(frozen=True)
class TemplatePhrases(Rule):
    """0 if the response follows any template (all its markers, in order, e.g. 首先…其次…最后), else 1."""

    templates: tuple[tuple[str, ...], ...] = DEFAULT_TEMPLATES

    def __post_init__(self) -> None:
        if isinstance(self.templates, str) or not isinstance(self.templates, (list, tuple)) or not self.templates:
            _fail(self.name, "templates", f"expected a non-empty list of marker lists, got {self.templates!r}")
        checked = tuple(_check_str_list(self.name, "templates", t) for t in self.templates)
        markers = sum(map(len, checked))
        if markers > MAX_PHRASES:
            _fail(self.name, "templates", f"{markers} markers in all; at most {MAX_PHRASES}")
        object.__setattr__(self, "templates", checked)

    @functools.cached_property
    def patterns(self) -> tuple[tuple[re.Pattern[str], ...], ...]:
        """Each template's markers (their `text.fold` form), compiled once."""
        return tuple(tuple(folded_pattern(m) for m in t) for t in self.templates)

    def matches(self, responses: Sequence[str]) -> np.ndarray:
        """[N] bool: one of the response's `text.forms` contains some template's markers (their `text.fold` form) in
        order."""
        forms = [text_forms.forms(r) for r in responses]  # once per response, not once per template
        return np.array([any(_in_order(f, ps) for f in fs for ps in self.patterns) for fs in forms], dtype=bool)

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        return (~self.matches(responses)).astype(np.float64)

    def phrase_count(self) -> int:
        return sum(map(len, self.templates))


@_register("format")
@dataclasses.dataclass(frozen=True)
class Format(Rule):
    """1 iff the response is `<think>…</think><answer>…</answer>`: each tag once, in order, the answer visible."""

    think_tag: str = "think"
    answer_tag: str = "answer"

    def __post_init__(self) -> None:
        for param in ("think_tag", "answer_tag"):
            value = _check_str(self.name, param, getattr(self, param))
            if not re.fullmatch(r"[A-Za-z_][\w-]*", value):
                _fail(self.name, param, f"expected a tag name like 'answer', got {value!r}")

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        t, a = self.think_tag, self.answer_tag
        tags = (f"<{t}>", f"</{t}>", f"<{a}>", f"</{a}>")
        shape = re.compile(rf"\s*<{t}>.*</{t}>\s*<{a}>(.*)</{a}>\s*", re.DOTALL)
        ok = []
        for r in responses:
            # Counting first keeps the backtracking regex linear: with each tag once, `.*` has one place to stop.
            m = shape.fullmatch(r) if all(r.count(tag) == 1 for tag in tags) else None
            ok.append(m is not None and text_forms.visible(m.group(1)))
        return np.array(ok, dtype=np.float64)

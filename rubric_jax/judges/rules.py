"""Rule judges: deterministic scorers of response text, built by name from validated parameters.

A rule is a frozen dataclass of its parameters, built once (at rubric load) with `make_rule(name,
params)`; calling it on a batch of N responses returns a quality q_N in [0, 1] (1 = satisfies the
rule). `rule_scores` maps q_N onto a dimension's scale [low, high] linearly. Rules see only the
response text, so nothing a response says about its own score can change them except the text
features the rule measures.

Text units (`text_units`): every CJK character is one unit and every run of non-CJK letters is one
word, so lengths count words for English and characters for Chinese (the LongBench-Write convention,
../shared/data/longbench_write/FORMULA.md) and mixed text counts both.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NoReturn

import numpy as np

# CJK unified ideographs (+ extension A, compatibility), kana and hangul: one unit per character.
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
_UNIT_RE = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])[^\W\d_])+(?:['’](?:(?![{_CJK}])[^\W\d_])+)*")
_LATIN_EDGE_RE = re.compile(r"[A-Za-z0-9_]")


class RuleError(ValueError):
    """An unknown rule name or an invalid rule parameter."""


def _fail(rule: str, param: str, message: str) -> NoReturn:
    raise RuleError(f"rule {rule!r}, param {param!r}: {message}")


def _check_str(rule: str, param: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        _fail(rule, param, f"expected a non-empty string, got {value!r}")
    return value


def _check_str_list(rule: str, param: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        _fail(rule, param, f"expected a non-empty list of strings, got {value!r}")
    for item in value:
        _check_str(rule, param, item)
    return tuple(value)


def _check_bool(rule: str, param: str, value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(rule, param, f"expected true/false, got {value!r}")
    return value


def _check_int(rule: str, param: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _fail(rule, param, f"expected an integer >= {minimum}, got {value!r}")
    return value


def _check_choice(rule: str, param: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        _fail(rule, param, f"expected one of {list(choices)}, got {value!r}")
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


def phrase_hits(responses: Sequence[str], phrases: Sequence[str], ignore_case: bool = True) -> np.ndarray:
    """[N, K] bool: response n contains phrase k (see `phrase_pattern`)."""
    patterns = [phrase_pattern(p, ignore_case) for p in phrases]
    hits_NxK = np.zeros((len(responses), len(patterns)), dtype=bool)
    for n, text in enumerate(responses):
        for k, pattern in enumerate(patterns):
            hits_NxK[n, k] = pattern.search(text) is not None
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
        raise RuleError(f"unknown rule {name!r}; known rules: {rule_names()}")
    if not isinstance(params, Mapping):
        raise RuleError(f"rule {name!r}: params must be a mapping, got {params!r}")
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
    """Base of all rules: `__call__(responses) -> q_N` in [0, 1]."""

    name: ClassVar[str]

    @abc.abstractmethod
    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        """Quality in [0, 1] per response (1 = the rule is fully satisfied)."""


def rule_scores(rule: Rule, responses: Sequence[str], low: float, high: float) -> np.ndarray:
    """The rule's quality per response mapped linearly onto the scale [low, high] (float64 [N])."""
    q_N = np.asarray(rule(list(responses)), dtype=np.float64)
    return low + q_N * (high - low)


@_register("regex")
@dataclasses.dataclass(frozen=True)
class Regex(Rule):
    """1 if the pattern is found ("must") / not found ("must_not") anywhere in the response, else 0."""

    pattern: str
    mode: str = "must"
    ignore_case: bool = False

    def __post_init__(self) -> None:
        _check_str(self.name, "pattern", self.pattern)
        _check_choice(self.name, "mode", self.mode, ("must", "must_not"))
        _check_bool(self.name, "ignore_case", self.ignore_case)
        try:
            re.compile(self.pattern)
        except re.error as e:
            _fail(self.name, "pattern", f"invalid regular expression {self.pattern!r}: {e}")

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        compiled = re.compile(self.pattern, re.IGNORECASE if self.ignore_case else 0)
        found_N = np.array([compiled.search(r) is not None for r in responses], dtype=bool)
        return (found_N if self.mode == "must" else ~found_N).astype(np.float64)


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

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        hits_NxK = phrase_hits(responses, self.words, self.ignore_case)
        if self.mode == "any":
            ok_N = hits_NxK.any(axis=1)
        elif self.mode == "all":
            ok_N = hits_NxK.all(axis=1)
        else:
            ok_N = ~hits_NxK.any(axis=1)
        return ok_N.astype(np.float64)


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

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        return phrase_hits(responses, self.phrases).any(axis=1).astype(np.float64)


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
        object.__setattr__(self, "templates", checked)

    def matches(self, responses: Sequence[str]) -> np.ndarray:
        """[N] bool: the response contains some template's markers in order."""
        compiled = [[phrase_pattern(m) for m in t] for t in self.templates]
        return np.array([any(_in_order(r, ps) for ps in compiled) for r in responses], dtype=bool)

    def __call__(self, responses: Sequence[str]) -> np.ndarray:
        return (~self.matches(responses)).astype(np.float64)


@_register("format")
@dataclasses.dataclass(frozen=True)
class Format(Rule):
    """1 iff the response is `<think>…</think><answer>…</answer>`: each tag once, in order, answer non-empty."""

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
            m = shape.fullmatch(r)
            once = all(r.count(tag) == 1 for tag in tags)
            ok.append(bool(m) and once and bool(m.group(1).strip()))
        return np.array(ok, dtype=np.float64)

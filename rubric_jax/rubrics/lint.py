"""A rubric checked before any judge budget is spent on it (issue 37 §3): each finding names the dimension and why a
policy could exploit it or why it measures nothing. The seed article's failures are what it looks for: criteria met
by a keyword (§6, reward hacking), an anchor asking for two things (§2.2: one observable per level), levels a judge
cannot tell apart, weights that order nothing, dimensions that say the same (§2.1 MECE) and rules that never fire.

The text checks are heuristics, so a finding can be waived: a `Waiver` names a rubric (or a glob of case rubrics),
dimension and finding kind, and the written reason (configs/rubric_lint_waivers.yaml for the shipped rubrics). `lint` is pure: a rubric (and,
where known, the response budget and human labels) in, findings out.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from rubric_jax import text
from rubric_jax.calibration.stats import spearman
from rubric_jax.judges import rules
from rubric_jax.rubrics.schema import Dimension, Rubric

KINDS = ("compound", "presence_only", "weak_anchor", "inert_weight", "near_duplicate", "never_fires")
# An anchor or criterion asks for two things when a conjunction joins two clauses of at least this many units
# (words, or CJK characters): "states the cause of it and recommends a treatment" (5 + 4), not "causes and treatments"
# or "address the question and all of it".
MIN_CLAUSE_UNITS = 4
_CONJUNCTION_RE = re.compile(r"\s(?:and also|as well as|and)\s|以及|并且|同时还|而且", re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])|(?<=[。！？])")  # not inside "e.g. the refund"
# A judged criterion phrased as presence ("Mentions X", "提到X") is met by the phrase, whatever the answer says.
_PRESENCE_RE = re.compile(r"^\W*(?:mentions?|includes?|contains?|uses? the (?:word|phrase|term)|提到|提及|包含|含有)\b",
                          re.IGNORECASE)
PRESENCE_RULES = {"keywords": ("any", "all"), "disclaimer": None, "regex": ("must",)}  # rule -> modes (None: all)
PLACEHOLDERS = {"n/a", "na", "tbd", "todo", "none", "-", "--", "...", "…", "?"}
MIN_WEIGHT_SHARE = 1e-3  # a dimension whose whole range moves the reward less than this orders nothing in practice
DUPLICATE_JACCARD = 0.6  # character-trigram Jaccard of two dimensions' criterion texts
DUPLICATE_SPEARMAN = 0.9  # human labels of two dimensions this correlated: one dimension measured twice
MIN_LABELLED = 10  # items both dimensions label before their correlation is read
WEIGHTLESS_METHODS = ("min", "healthbench_points")  # aggregations that never read dimension weights
SHIPPED_WAIVERS = Path(__file__).resolve().parents[2] / "configs" / "rubric_lint_waivers.yaml"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem of one dimension (or a pair, `other`) of a rubric: its kind (KINDS) and why, in a sentence."""

    rubric: str
    dimension: str
    kind: str
    why: str
    other: str | None = None

    def line(self) -> str:
        pair = f" and {self.other!r}" if self.other else ""
        return f"rubric {self.rubric!r}, dimension {self.dimension!r}{pair}: {self.kind}: {self.why}"


@dataclasses.dataclass(frozen=True)
class Waiver:
    """A finding accepted on purpose: its rubric (a name, or a glob such as 'tiny_default/*' for case rubrics),
    dimension and kind, and the written reason."""

    rubric: str
    dimension: str
    kind: str
    reason: str

    def covers(self, finding: Finding) -> bool:
        return (fnmatch.fnmatchcase(finding.rubric, self.rubric) and finding.dimension == self.dimension
                and finding.kind == self.kind)


def lint(rubric: Rubric, *, max_new_tokens: int | None = None,
         labels: Mapping[str, Mapping[str, float]] | None = None) -> list[Finding]:
    """Every finding of `rubric`, in dimension order. `max_new_tokens` (the response budget) lets length and n-gram
    rules be checked against what a response can hold; `labels` ({dimension id: {item id: human score}}) lets two
    dimensions be compared by their labels as well as their text."""
    found = []
    for dim in rubric.dimensions:
        for kind, why in _dimension_problems(rubric, dim, max_new_tokens):
            found.append(Finding(rubric.name, dim.id, kind, why))
    found += _duplicates(rubric, labels or {})
    return found


def lint_all(rubrics: Sequence[Rubric], *, max_new_tokens: int | None = None,
             labels: Mapping[str, Mapping[str, float]] | None = None) -> list[Finding]:
    """The findings of several rubrics (a shared rubric and its case rubrics), each dimension's once: a case
    rubric's findings on the shared dimensions repeat the shared rubric's, so only the first is kept."""
    seen, out = set(), []
    for rubric in rubrics:
        for finding in lint(rubric, max_new_tokens=max_new_tokens, labels=labels):
            key = (finding.dimension, finding.other, finding.kind, finding.why)
            if key not in seen:
                seen.add(key)
                out.append(finding)
    return out


def unwaived(findings: Sequence[Finding], waivers: Sequence[Waiver]) -> list[Finding]:
    """The findings no waiver covers."""
    return [f for f in findings if not any(w.covers(f) for w in waivers)]


def start_up_lines(rubrics: Sequence[Rubric], max_new_tokens: int, waivers: Sequence[Waiver], shown: int = 5
                   ) -> list[str]:
    """What a run prints at start-up about its rubrics: nothing when every finding is waived, else the first
    `shown` unwaived findings and a line saying how many there are and how to list them all."""
    left = unwaived(lint_all(rubrics, max_new_tokens=max_new_tokens), waivers)
    if not left:
        return []
    more = f" ({len(left) - shown} more)" if len(left) > shown else ""
    return [f"rubric lint: {f.line()}" for f in left[:shown]] + [
        f"rubric lint: {len(left)} finding(s) not waived{more}; experiments.lint_rubric lists them, and a waiver with its "
        "reason accepts one (docs/rubrics.md, \"Linting a rubric\"); the run goes on"]


def shipped_waivers() -> list[Waiver]:
    """The waivers of the shipped rubrics (configs/rubric_lint_waivers.yaml), which a run applies at start-up."""
    from rubric_jax.rubrics import io  # noqa: PLC0415 -- io imports yaml; lint itself needs no file

    return waivers_from(io.load_document(SHIPPED_WAIVERS, "waiver"), str(SHIPPED_WAIVERS))


def waivers_from(document: object, source: str) -> list[Waiver]:
    """The waivers of a parsed waiver file: a list of {rubric, dimension, kind, reason}, each field a non-empty
    string and kind one of KINDS; a bad entry is a ValueError naming the file and the entry."""
    if not isinstance(document, list):
        raise ValueError(f"{source}: expected a list of waivers, got {type(document).__name__}")
    out = []
    for i, entry in enumerate(document):
        fields = [f.name for f in dataclasses.fields(Waiver)]
        if not isinstance(entry, dict) or sorted(entry) != sorted(fields):
            raise ValueError(f"{source}: waiver {i}: expected exactly the keys {fields}")
        if not all(isinstance(entry[f], str) and entry[f].strip() for f in fields):
            raise ValueError(f"{source}: waiver {i}: every field must be a non-empty string")
        if entry["kind"] not in KINDS:
            raise ValueError(f"{source}: waiver {i}: kind={entry['kind']!r}: expected one of {KINDS}")
        out.append(Waiver(**entry))
    return out


def _dimension_problems(rubric: Rubric, dim: Dimension, budget: int | None) -> list[tuple[str, str]]:
    problems = []
    top = dim.anchors[max(dim.anchors)].description
    if dim.judged:
        for where, criterion in (("description", dim.description), (f"anchor {max(dim.anchors)}", top)):
            clauses = _clauses(criterion)
            if clauses is not None:
                problems.append(("compound", f"its {where} asks for two things ({clauses[0]!r} and {clauses[1]!r}): "
                                 "a judge scores the one it sees; split it into two dimensions"))
                break
        if _PRESENCE_RE.search(text.shown(dim.description)):
            problems.append(("presence_only", "its criterion is met by mentioning something; a policy learns to "
                             "mention it (say what a good mention does)"))
    elif dim.rule in PRESENCE_RULES and (PRESENCE_RULES[dim.rule] is None or
                                         dim.params.get("mode", "must" if dim.rule == "regex" else "any")
                                         in PRESENCE_RULES[dim.rule]):
        problems.append(("presence_only", f"rule {dim.rule!r} scores 1 for any answer containing a listed phrase, "
                         "whatever else it says; pair it with a judged dimension or keep its weight small"))
    problems += [("weak_anchor", why) for why in _weak_anchors(dim)]
    problems += [("inert_weight", why) for why in _inert_weight(rubric, dim)]
    problems += [("never_fires", why) for why in _never_fires(dim, budget)]
    return problems


def _clauses(criterion: str) -> tuple[str, str] | None:
    """The first two clauses a conjunction joins in `criterion`, when both have MIN_CLAUSE_UNITS units or more."""
    shown = " ".join(text.shown(criterion).split())
    for sentence in _SENTENCE_END_RE.split(shown):
        parts = [p.strip(" ,;:，；：") for p in _CONJUNCTION_RE.split(sentence)]
        for left, right in itertools.pairwise(parts):
            if min(len(rules.text_units(left)), len(rules.text_units(right))) >= MIN_CLAUSE_UNITS:
                return left, right
    return None


def _weak_anchors(dim: Dimension) -> list[str]:
    """Anchors that cannot guide a judge: placeholders, and levels described alike."""
    out, seen = [], {}
    for level, anchor in dim.anchors.items():
        folded = " ".join(text.fold(text.shown(anchor.description)).split()).strip(" .")
        if folded in PLACEHOLDERS or len(rules.text_units(folded)) < 2:
            out.append(f"level {level}'s anchor {anchor.description!r} does not describe what earns it")
        elif folded in seen:
            out.append(f"levels {seen[folded]} and {level} have the same anchor: a judge cannot tell them apart")
        seen.setdefault(folded, level)
    return out


def _inert_weight(rubric: Rubric, dim: Dimension) -> list[str]:
    """A weight the aggregation never reads, or one too small to change an ordering."""
    method = rubric.aggregation.method
    params = rubric.aggregation.params
    if dim.gate and dim.weight != 1.0:
        return [f"weight {dim.weight:g} on a gate: gates veto the reward and are never aggregated, so it changes nothing"]
    if not dim.gate and dim.weight != 1.0 and (method in WEIGHTLESS_METHODS or
                                               (method == "hierarchical" and params.get("within") == "min")):
        return [f"weight {dim.weight:g} under aggregation {method!r}, which does not read dimension weights"]
    scored = [d.weight for d in rubric.dimensions if not d.gate]
    if not dim.gate and method not in WEIGHTLESS_METHODS and dim.weight / sum(scored) < MIN_WEIGHT_SHARE:
        return [f"weight {dim.weight:g} is {dim.weight / sum(scored):.1e} of the total: its whole range moves the "
                f"reward by less than {MIN_WEIGHT_SHARE:g}"]
    return []


def _never_fires(dim: Dimension, budget: int | None) -> list[str]:
    """Rule parameters with which the rule's score cannot move."""
    if dim.rule is None:
        return []
    try:
        rule = rules.make_rule(dim.rule, dim.params)
    except rules.RuleError:
        return []  # the rubric loader names the bad parameter
    if isinstance(rule, rules.Regex) and rule.compiled.search("") is not None:
        return [f"pattern {rule.pattern!r} matches the empty string, so it is found in every answer: the score is "
                f"always {1 if rule.mode == 'must' else 0}"]
    if isinstance(rule, rules.Format) and rule.think_tag == rule.answer_tag:
        return [f"think_tag and answer_tag are both {rule.think_tag!r}: no response has each tag once"]
    if budget is not None and isinstance(rule, rules.Length) and rule.unit != "chars" and rule.min > budget:
        return [f"min {rule.min} {rule.unit} units exceeds the {budget}-token response budget (a unit is at least one "
                "token): no answer reaches it"]
    if budget is not None and isinstance(rule, rules.NgramRedundancy) and rule.n > budget:
        return [f"n={rule.n} exceeds the {budget}-token response budget: no answer has an n-gram, the score is always 1"]
    return []


def _trigrams(criterion: str) -> set[str]:
    folded = " ".join(text.fold(text.shown(criterion)).split())
    return {folded[i:i + 3] for i in range(max(len(folded) - 2, 1))}


def _duplicates(rubric: Rubric, labels: Mapping[str, Mapping[str, float]]) -> list[Finding]:
    """Pairs of dimensions that measure one thing: alike in text, or in their human labels."""
    texts = {d.id: _trigrams(d.description + " " + d.anchors[max(d.anchors)].description) for d in rubric.dimensions}
    found = []
    for a, b in itertools.combinations(rubric.dimensions, 2):
        jaccard = len(texts[a.id] & texts[b.id]) / len(texts[a.id] | texts[b.id])
        if jaccard >= DUPLICATE_JACCARD:
            found.append(Finding(rubric.name, a.id, "near_duplicate", f"their criteria share {jaccard:.0%} of their "
                                 "character trigrams: one aspect weighed twice (MECE)", b.id))
            continue
        rho = _label_spearman(labels.get(a.id, {}), labels.get(b.id, {}))
        if rho is not None and rho >= DUPLICATE_SPEARMAN:
            found.append(Finding(rubric.name, a.id, "near_duplicate", f"their human labels correlate (Spearman "
                                 f"{rho:.2f}): one aspect weighed twice (MECE)", b.id))
    return found


def _label_spearman(a: Mapping[str, float], b: Mapping[str, float]) -> float | None:
    """Spearman of two dimensions' labels over the items both label (None under MIN_LABELLED or when constant)."""
    shared = sorted(set(a) & set(b))
    if len(shared) < MIN_LABELLED:
        return None
    return spearman(np.array([a[i] for i in shared], float), np.array([b[i] for i in shared], float)).value

"""Rubrics as data: frozen dataclasses, strict validation, dict round-trip, content hash, score scales.

A `Rubric` is a versioned document: named `Dimension`s, each reading one part of a response (`reads`), with a
`Scale`, an `Anchor` for every score level (RubricRL 2.2: what a 3 looks like, plus positive and "looks good but
is not" negative examples, RubricRL 6.1), a weight, an optional gate (veto, RubricRL 5.2 "safety first") and an
optional group for hierarchical aggregation. `content_hash` is a sha256 over the canonical JSON of everything that changes
behaviour (name, dimensions, aggregation), not over `version`/`changelog`, so a checkpoint that records
the hash can be traced to the exact rubric text (RubricRL 7, "version your rubrics").

Score convention shared by judges, aggregation and monitors: a judge produces a *raw* score on the
dimension's scale; `normalize_score(s)` maps it to [0, 1] where **1 is always best**:
  binary       raw in {0, 1}                      -> raw
  integer      raw in [lo, hi] (e.g. 1-5)         -> (raw - lo) / (hi - lo)
  points       raw in {0, 1} = "criterion met"    -> raw if points > 0 else 1 - raw
               (HealthBench: a negative-points criterion describes bad behaviour, so met = bad)
Missing scores are NaN and stay NaN.

Validation is hostile-input safe: linear in the rubric's size, hard limits where float32 aggregation or
memory would otherwise fail silently (MAX_DIMENSIONS, MAX_SCALE_LEVELS, WEIGHT_RANGE, ...), rule params
restricted to plain JSON data, and every error quotes at most a `short_repr` of the offending value.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_jax import text
from rubric_jax.rubrics import checks, kinds
from rubric_jax.rubrics.checks import RubricError, RubricWarning, short_repr  # noqa: F401  (re-exported)

SCALE_KINDS = ("binary", "integer", "points")
MISSING_RULES = ("renormalize", "drop")
# Aggregation methods and the parameters each accepts (name -> type). aggregation.py implements them;
# gates are orthogonal: any dimension with gate=True vetoes the reward whatever the method.
AGGREGATION_PARAMS: dict[str, dict[str, type]] = {
    "weighted_sum": {},
    "weighted_geometric_mean": {"eps": float},
    "min": {},
    "hierarchical": {"within": str, "across": str, "group_weights": dict, "eps": float},
    "healthbench_points": {},
}
# Methods allowed at each level of a hierarchical aggregation.
LEVEL_METHODS = ("weighted_sum", "weighted_geometric_mean", "min")
MAX_RECOMMENDED_DIMENSIONS = 7  # RubricRL 2.3: more than 7 dimensions hurts judge consistency
# Hard limits. A rubric beyond them is a mistake or an attack, not a design: HealthBench's largest has 33
# criteria and its points lie in [-10, 10]; scores, weights and points are aggregated in float32, where a
# weight of 1e39 overflows (NaN rewards) and 1e-46 underflows to 0 (every row not ok).
MAX_DIMENSIONS = 1000  # per rubric (shared plus a row's extra criteria); each one costs judge calls per row
MAX_SCALE_LEVELS = 101  # integer scale levels (e.g. 0..100); every level needs an anchor
MAX_SCALE_BOUND = 10**6  # |lo|, |hi| of an integer scale, and |points| of a points scale
WEIGHT_RANGE = (1e-6, 1e6)  # dimension and group weights; ratios up to 1e12 stay exact enough in float32
EPS_RANGE = (1e-30, 0.5)  # geometric-mean floor of [0, 1] scores: a normal float32, at most one half
# Ids become metric and TensorBoard tags. Every pattern here is used with fullmatch: `re.match` with `$` would
# accept a trailing newline ("safety\n").
_ID_RE = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,127}")
_VERSION_RE = re.compile(r"(\d{1,9})\.(\d{1,9})\.(\d{1,9})")
MAX_NAME_CHARS = 256
_LEVEL_RE = re.compile(r"-?\d{1,9}")


def _check_dimension_count(count: int, field: str) -> None:
    """Raise when a rubric (or a row's extra criteria) has more than MAX_DIMENSIONS dimensions."""
    if count > MAX_DIMENSIONS:
        raise RubricError(f"{checks.where(None, field)}: expected at most {MAX_DIMENSIONS} dimensions, got {count}")


def check_name(name: Any) -> str:
    """A rubric name: 1-MAX_NAME_CHARS characters, no surrounding whitespace, no line break, no invisible
    character (zero-width, control or format characters); compared by `name_key` (see check_rubric_identities)."""
    if (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or name != name.strip()
            or text.strip_invisible(name) != name or any(c in name for c in "\n\r\t\v\f\x85\u2028\u2029")):
        raise checks.fail(None, "name", f"1-{MAX_NAME_CHARS} visible characters without surrounding whitespace, line "
                          "breaks or invisible characters", name)
    return name


def name_key(name: str) -> str:
    """What two rubric names are compared by: marks removed, NFKC, lookalikes made ASCII, case folded (text.fold), so
    'Hostile_rules' and 'hostile_rules' (or a Cyrillic-lettered copy) are one name."""
    return text.fold(name)


def parse_version(version: str) -> tuple[int, int, int]:
    """'1.2.3' -> (1, 2, 3); raises RubricError on anything that is not MAJOR.MINOR.PATCH."""
    m = _VERSION_RE.fullmatch(version) if isinstance(version, str) else None
    if m is None:
        raise checks.fail(None, "version", "a semantic version 'MAJOR.MINOR.PATCH'", version)
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


@dataclasses.dataclass(frozen=True)
class Scale:
    """Score range of a dimension: binary 0/1, integer lo..hi (e.g. 1-5), or signed points (HealthBench)."""

    kind: str
    lo: int | None = None  # integer only
    hi: int | None = None  # integer only
    points: int | None = None  # points only: signed, non-zero (negative = undesirable behaviour)

    def __post_init__(self):
        if self.kind not in SCALE_KINDS:
            raise checks.fail(None, "scale.kind", f"one of {SCALE_KINDS}", self.kind)
        if self.kind == "integer":
            lo = checks.check_int(self.lo, None, "scale.lo", bound=MAX_SCALE_BOUND)
            hi = checks.check_int(self.hi, None, "scale.hi", bound=MAX_SCALE_BOUND)
            if not lo < hi:
                raise checks.fail(None, "scale", "lo < hi", (lo, hi))
            if hi - lo + 1 > MAX_SCALE_LEVELS:
                raise checks.fail(None, "scale", f"at most {MAX_SCALE_LEVELS} levels (hi - lo + 1; each needs an anchor)",
                            (lo, hi))
            if self.points is not None:
                raise checks.fail(None, "scale.points", "no points for an integer scale", self.points)
        else:
            if self.lo is not None or self.hi is not None:
                raise checks.fail(None, "scale.lo/hi", f"no lo/hi for a {self.kind} scale", (self.lo, self.hi))
            if self.kind == "points":
                if checks.check_int(self.points, None, "scale.points", bound=MAX_SCALE_BOUND) == 0:
                    raise checks.fail(None, "scale.points", "a non-zero integer", self.points)
            elif self.points is not None:
                raise checks.fail(None, "scale.points", "no points for a binary scale", self.points)

    @classmethod
    def binary(cls) -> Scale:
        """0/1 scale (e.g. a safety disclaimer is present or not)."""
        return cls("binary")

    @classmethod
    def integer(cls, lo: int, hi: int) -> Scale:
        """Integer range lo..hi inclusive (e.g. 1-5)."""
        return cls("integer", lo=lo, hi=hi)

    @classmethod
    def signed_points(cls, points: int) -> Scale:
        """A criterion worth `points` (negative = penalty) when met; raw score is met (1) / not met (0)."""
        return cls("points", points=points)

    @property
    def levels(self) -> tuple[int, ...]:
        """Every raw score level the scale allows; each needs an anchor."""
        if self.kind == "integer":
            return tuple(range(self.lo, self.hi + 1))
        return (0, 1)

    @property
    def raw_range(self) -> tuple[int, int]:
        """(lowest, highest) raw score."""
        return self.levels[0], self.levels[-1]


@dataclasses.dataclass(frozen=True)
class Anchor:
    """What a score level looks like, with examples that earn it and ones that look good but do not."""

    description: str
    positive_examples: tuple[str, ...] = ()
    negative_examples: tuple[str, ...] = ()

    def __post_init__(self):
        checks.check_str(self.description, None, "anchor.description")
        object.__setattr__(self, "positive_examples", checks.check_strings(self.positive_examples, None, "positive_examples"))
        object.__setattr__(self, "negative_examples", checks.check_strings(self.negative_examples, None, "negative_examples"))


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One scored aspect of a response; `rule`/`params` name the rule judge when its kind takes them; `reads` is the
    part of the response its judge sees (rubric_jax/text.py: the answer, the think text or the whole response)."""

    id: str
    description: str
    kind: str
    scale: Scale
    anchors: Mapping[int, Anchor]
    weight: float = 1.0
    gate: bool = False
    group: str | None = None
    rule: str | None = None
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    reads: str = "answer"  # the part of a response its judge sees (text.READS): answer, think or response

    def __post_init__(self):
        if not isinstance(self.id, str) or not _ID_RE.fullmatch(self.id):
            raise checks.fail(None, "id", "an identifier [A-Za-z][A-Za-z0-9_-]* of at most 128 characters", self.id)
        d = self.id
        checks.check_str(self.description, d, "description")
        kind = kinds.kind_named(self.kind) if isinstance(self.kind, str) else None
        if kind is None:
            raise checks.fail(d, "kind", f"one of {kinds.kind_names()}", self.kind)
        if not isinstance(self.scale, Scale):
            raise checks.fail(d, "scale", "a Scale", self.scale)
        object.__setattr__(self, "weight", checks.check_number(self.weight, d, "weight", WEIGHT_RANGE))
        if not isinstance(self.gate, bool):
            raise checks.fail(d, "gate", "true or false", self.gate)
        if self.group is not None and (not isinstance(self.group, str) or not _ID_RE.fullmatch(self.group)):
            raise checks.fail(d, "group", "null or an identifier", self.group)
        if self.reads not in text.READS:
            raise checks.fail(d, "reads", f"one of {text.READS} (the part of the response its judge sees)", self.reads)
        if self.rule == "format" and self.reads != "response":  # the answer alone has no tags: it would always fail
            raise checks.fail(d, "reads", "'response' for the format rule (it checks the tags around the answer)",
                              self.reads)
        if kind.takes_rule:
            checks.check_str(self.rule, d, "rule")
        elif self.rule is not None:
            raise checks.fail(d, "rule", f"no rule name for an {self.kind} dimension", self.rule)
        if not isinstance(self.params, Mapping) or not all(isinstance(k, str) for k in self.params):
            raise checks.fail(d, "params", "a mapping with string keys", self.params)
        checks.check_json_value(self.params, d, "params")
        if self.params and not kind.takes_rule:
            raise checks.fail(d, "params", f"no params for an {self.kind} dimension", dict(self.params))
        object.__setattr__(self, "params", dict(self.params))
        if not isinstance(self.anchors, Mapping):
            raise checks.fail(d, "anchors", "a mapping level -> anchor", self.anchors)
        for level, anchor in self.anchors.items():
            if not isinstance(anchor, Anchor):
                raise checks.fail(d, f"anchors.{level}", "an Anchor", anchor)
        levels = set(self.scale.levels)
        if set(self.anchors) != levels:
            raise checks.fail(d, "anchors", f"one anchor for every level {sorted(levels)}", sorted(self.anchors, key=repr))
        object.__setattr__(self, "anchors", {k: self.anchors[k] for k in sorted(self.anchors)})

    def __hash__(self) -> int:
        return hash(canonical_json(dimension_to_dict(self)))

    @property
    def judged(self) -> bool:
        """Whether the LLM judge scores this dimension (its kind says so: rubrics/kinds.py)."""
        return kinds.kind_named(self.kind).judged

    @property
    def takes_rule(self) -> bool:
        """Whether this dimension names a rule and its params (its kind says so: rubrics/kinds.py)."""
        return kinds.kind_named(self.kind).takes_rule

    def normalize(self, raw: float) -> float:
        """Raw score on this dimension's scale -> [0, 1] (1 = best); NaN stays NaN; out of range raises."""
        return float(normalize_scores([self], np.asarray([[raw]], dtype=np.float64))[0, 0])


@dataclasses.dataclass(frozen=True)
class ChangelogEntry:
    """One rubric revision: the version it produced, what changed, and why (RubricRL 7)."""

    version: str
    change: str
    reason: str

    def __post_init__(self):
        parse_version(self.version)
        checks.check_str(self.change, None, "changelog.change")
        checks.check_str(self.reason, None, "changelog.reason")


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """How dimension scores become one reward, and what a missing score does ('renormalize' | 'drop')."""

    method: str = "weighted_sum"
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    missing: str = "renormalize"

    def __post_init__(self):
        if self.method not in AGGREGATION_PARAMS:
            raise checks.fail(None, "aggregation.method", f"one of {sorted(AGGREGATION_PARAMS)}", self.method)
        if self.missing not in MISSING_RULES:
            raise checks.fail(None, "aggregation.missing", f"one of {MISSING_RULES}", self.missing)
        spec = AGGREGATION_PARAMS[self.method]
        if not isinstance(self.params, Mapping):
            raise checks.fail(None, "aggregation.params", "a mapping", self.params)
        params = dict(self.params)
        for key, value in params.items():
            if key not in spec:
                raise checks.fail(None, f"aggregation.params.{key}", f"a parameter of {self.method!r} in {sorted(spec)}", value)
            if spec[key] is float:
                params[key] = checks.check_number(value, None, f"aggregation.params.{key}", EPS_RANGE)
            elif not isinstance(value, spec[key]):
                raise checks.fail(None, f"aggregation.params.{key}", spec[key].__name__, value)
        if self.method == "hierarchical":
            for level in ("within", "across"):
                if params.get(level) not in LEVEL_METHODS:
                    raise checks.fail(None, f"aggregation.params.{level}", f"one of {LEVEL_METHODS}", params.get(level))
            gw = params.get("group_weights", {})
            params["group_weights"] = {
                checks.check_str(g, None, "aggregation.params.group_weights"): checks.check_number(
                    w, None, f"aggregation.params.group_weights.{g}", WEIGHT_RANGE) for g, w in gw.items()}
        object.__setattr__(self, "params", params)

    def __hash__(self) -> int:
        return hash(canonical_json({"method": self.method, "params": self.params, "missing": self.missing}))


@dataclasses.dataclass(frozen=True, eq=True)
class Rubric:
    """A versioned rubric; validated at construction, hashable by content."""

    name: str
    version: str
    changelog: tuple[ChangelogEntry, ...]
    dimensions: tuple[Dimension, ...]
    aggregation: Aggregation = dataclasses.field(default_factory=Aggregation)

    def __post_init__(self):
        check_name(self.name)
        current = parse_version(self.version)
        object.__setattr__(self, "changelog", tuple(self.changelog))
        object.__setattr__(self, "dimensions", tuple(self.dimensions))
        if not self.changelog:
            raise checks.fail(None, "changelog", f"at least one entry (the last for version {self.version})", [])
        previous = None
        for entry in self.changelog:
            if not isinstance(entry, ChangelogEntry):
                raise checks.fail(None, "changelog", "ChangelogEntry items", entry)
            v = parse_version(entry.version)
            if previous is not None and v <= previous:
                raise checks.fail(None, "changelog", "strictly increasing versions", [e.version for e in self.changelog])
            previous = v
        if previous != current:
            raise checks.fail(None, "changelog", f"last entry for the current version {self.version}",
                        self.changelog[-1].version)
        if not self.dimensions:
            raise checks.fail(None, "dimensions", "at least one dimension", [])
        _check_dimension_count(len(self.dimensions), "dimensions")
        for dim in self.dimensions:
            if not isinstance(dim, Dimension):
                raise checks.fail(None, "dimensions", "Dimension items", dim)
        counts = collections.Counter(dim.id.casefold() for dim in self.dimensions)
        duplicates = sorted({d.id for d in self.dimensions if counts[d.id.casefold()] > 1})  # 'Safety' is 'safety'
        if duplicates:
            raise checks.fail(None, "dimensions", "unique dimension ids", duplicates)
        if not isinstance(self.aggregation, Aggregation):
            raise checks.fail(None, "aggregation", "an Aggregation", self.aggregation)
        self._check_aggregation_fits()
        if len(self.dimensions) > MAX_RECOMMENDED_DIMENSIONS:
            warnings.warn(
                f"rubric {short_repr(self.name)} has {len(self.dimensions)} dimensions; RubricRL advises at most "
                f"{MAX_RECOMMENDED_DIMENSIONS} (judge consistency drops, reward attribution blurs)",
                RubricWarning, stacklevel=3)

    def _check_aggregation_fits(self) -> None:
        """Cross-field checks between the dimensions and the aggregation method."""
        method, params = self.aggregation.method, self.aggregation.params
        scored = [d for d in self.dimensions if not d.gate]
        if not scored:
            raise checks.fail(None, "dimensions", "at least one non-gate dimension to aggregate", [d.id for d in self.dimensions])
        if method == "healthbench_points":
            for d in scored:
                if d.scale.kind != "points":
                    raise checks.fail(d.id, "scale", "a points scale (aggregation 'healthbench_points')", d.scale.kind)
            if not any(d.scale.points > 0 for d in scored):
                raise checks.fail(None, "dimensions", "at least one positive-points criterion", [d.scale.points for d in scored])
        if method == "hierarchical":
            for d in scored:
                if d.group is None:
                    raise checks.fail(d.id, "group", "a group name (aggregation 'hierarchical')", None)
            groups = {d.group for d in scored}
            extra = sorted(set(params["group_weights"]) - groups)
            if extra:
                raise checks.fail(None, "aggregation.params.group_weights", f"only groups of non-gate dimensions {sorted(groups)}", extra)

    @property
    def dimension_ids(self) -> list[str]:
        """Dimension ids in column order of every scores [N, D] array."""
        return [d.id for d in self.dimensions]

    def dimension(self, dim_id: str) -> Dimension:
        """The dimension with this id (KeyError naming the rubric otherwise)."""
        for d in self.dimensions:
            if d.id == dim_id:
                return d
        raise KeyError(f"rubric {short_repr(self.name)} has no dimension {short_repr(dim_id)}; "
                       f"it has {short_repr(self.dimension_ids)}")

    @property
    def weights(self) -> np.ndarray:
        """Weights [D] float32 in column order."""
        return np.asarray([d.weight for d in self.dimensions], np.float32)

    @property
    def gates(self) -> np.ndarray:
        """Gate mask [D] bool in column order."""
        return np.asarray([d.gate for d in self.dimensions], bool)

    @property
    def points(self) -> np.ndarray:
        """Signed points [D] float32 (0 for non-points dimensions)."""
        return np.asarray([d.scale.points or 0 for d in self.dimensions], np.float32)

    @functools.cached_property
    def content_hash(self) -> str:
        """sha256 hex of the canonical JSON of name, dimensions and aggregation (not version/changelog)."""
        content = rubric_to_dict(self)
        del content["version"], content["changelog"]
        return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()

    def __hash__(self) -> int:
        return hash(self.content_hash)


def canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces, UTF-8 kept) used for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# ---------------------------------------------------------------------------------------- dict round-trip

def scale_to_dict(scale: Scale) -> dict[str, Any]:
    """Scale -> {'kind': ...} plus only the fields its kind uses."""
    if scale.kind == "integer":
        return {"kind": "integer", "lo": scale.lo, "hi": scale.hi}
    if scale.kind == "points":
        return {"kind": "points", "points": scale.points}
    return {"kind": "binary"}


def dimension_to_dict(dim: Dimension) -> dict[str, Any]:
    """Dimension -> plain dict (anchor levels become string keys so JSON and YAML agree)."""
    out: dict[str, Any] = {
        "id": dim.id, "description": dim.description, "kind": dim.kind, "scale": scale_to_dict(dim.scale),
        "anchors": {str(level): {"description": a.description, "positive_examples": list(a.positive_examples),
                                 "negative_examples": list(a.negative_examples)}
                    for level, a in dim.anchors.items()},
        "weight": dim.weight, "gate": dim.gate, "group": dim.group, "reads": dim.reads,
    }
    if dim.takes_rule:
        out["rule"], out["params"] = dim.rule, dict(dim.params)
    return out


def rubric_to_dict(rubric: Rubric) -> dict[str, Any]:
    """Rubric -> plain dict of JSON/YAML-safe values (the on-disk format)."""
    return {
        "name": rubric.name,
        "version": rubric.version,
        "changelog": [{"version": e.version, "change": e.change, "reason": e.reason} for e in rubric.changelog],
        "dimensions": [dimension_to_dict(d) for d in rubric.dimensions],
        "aggregation": {"method": rubric.aggregation.method, "params": dict(rubric.aggregation.params),
                        "missing": rubric.aggregation.missing},
    }


def _level_key(key: Any, dim_id: str) -> int:
    """Anchor level key from YAML (int) or JSON (digit string)."""
    if isinstance(key, bool):
        raise checks.fail(dim_id, "anchors", "integer score levels as keys", key)
    if isinstance(key, int):
        return key
    if isinstance(key, str) and _LEVEL_RE.fullmatch(key.strip()):
        return int(key)
    raise checks.fail(dim_id, "anchors", "integer score levels as keys", key)


def scale_from_dict(d: Any, dim_id: str | None = None) -> Scale:
    """Raw dict -> Scale, rejecting unknown fields."""
    checks.check_keys(d, ("kind", "lo", "hi", "points"), ("kind",), dim_id, "scale")
    try:
        return Scale(**d)
    except RubricError as e:
        raise RubricError(f"dimension {short_repr(dim_id)}: {e}") from None


def dimension_from_dict(d: Any) -> Dimension:
    """Raw dict -> Dimension, rejecting unknown fields; errors name the dimension id and field."""
    dim_id = d.get("id") if isinstance(d, Mapping) and isinstance(d.get("id"), str) else None
    allowed = ("id", "description", "kind", "scale", "anchors", "weight", "gate", "group", "rule", "params", "reads")
    checks.check_keys(d, allowed, ("id", "description", "kind", "scale", "anchors"), dim_id, "dimension")
    anchors_raw = d["anchors"]
    if not isinstance(anchors_raw, Mapping):
        raise checks.fail(dim_id, "anchors", "a mapping level -> anchor", anchors_raw)
    anchors = {}
    for key, a in anchors_raw.items():
        level = _level_key(key, dim_id)
        if isinstance(a, str):
            a = {"description": a}
        checks.check_keys(a, ("description", "positive_examples", "negative_examples"), ("description",),
                    dim_id, f"anchors.{level}")
        try:
            anchors[level] = Anchor(a["description"], tuple(checks.check_strings(a.get("positive_examples", []), dim_id, f"anchors.{level}.positive_examples")),
                                    tuple(checks.check_strings(a.get("negative_examples", []), dim_id, f"anchors.{level}.negative_examples")))
        except RubricError as e:
            raise RubricError(f"dimension {short_repr(dim_id)}: anchors.{level}: {e}") from None
    fields = {k: v for k, v in d.items() if k not in ("scale", "anchors")}
    fields["scale"] = scale_from_dict(d["scale"], dim_id)
    fields["anchors"] = anchors
    if fields.get("params") is None:
        fields.pop("params", None)
    try:
        return Dimension(**fields)
    except RubricError as e:
        msg = str(e)
        raise RubricError(msg if msg.startswith("dimension ") else f"dimension {short_repr(dim_id)}: {msg}") from None


def rubric_from_dict(d: Any, source: str = "<dict>") -> Rubric:
    """Raw dict (parsed JSON/YAML) -> validated Rubric; every error message starts with `source`."""
    try:
        checks.check_keys(d, ("name", "version", "changelog", "dimensions", "aggregation"),
                    ("name", "version", "changelog", "dimensions"), None, "rubric")
        changelog_raw = d["changelog"]
        if not isinstance(changelog_raw, list):
            raise checks.fail(None, "changelog", "a list of {version, change, reason}", changelog_raw)
        changelog = []
        for e in changelog_raw:
            checks.check_keys(e, ("version", "change", "reason"), ("version", "change", "reason"), None, "changelog")
            changelog.append(ChangelogEntry(e["version"], e["change"], e["reason"]))
        dims_raw = d["dimensions"]
        if not isinstance(dims_raw, list):
            raise checks.fail(None, "dimensions", "a list of dimensions", dims_raw)
        _check_dimension_count(len(dims_raw), "dimensions")
        dims = [dimension_from_dict(x) for x in dims_raw]
        agg_raw = d.get("aggregation", {})
        checks.check_keys(agg_raw, ("method", "params", "missing"), (), None, "aggregation")
        agg = Aggregation(**{k: ({} if k == "params" and v is None else v) for k, v in agg_raw.items()})
        return Rubric(d["name"], d["version"], tuple(changelog), tuple(dims), agg)
    except RubricError as e:
        raise RubricError(f"{source}: {e}") from None


# ---------------------------------------------------------------------------------------- scores

def normalize_scores(dimensions: Sequence[Dimension] | Rubric, raw_NxD: np.ndarray) -> np.ndarray:
    """Raw scores [N, D] (NaN = missing) -> [0, 1] per each column's scale (1 = best); raises if out of range."""
    dims = dimensions.dimensions if isinstance(dimensions, Rubric) else tuple(dimensions)
    raw = np.asarray(raw_NxD, dtype=np.float64)
    if raw.ndim != 2 or raw.shape[1] != len(dims):
        raise ValueError(f"raw scores: expected shape [N, {len(dims)}], got {raw.shape}")
    out = np.empty_like(raw)
    for j, dim in enumerate(dims):
        col = raw[:, j]
        lo, hi = dim.scale.raw_range
        bad = ~np.isnan(col) & ((col < lo) | (col > hi))
        if bad.any():
            raise ValueError(f"dimension {dim.id!r}: raw score {float(col[bad][0])!r} outside scale range [{lo}, {hi}]")
        unit = (col - lo) / (hi - lo)
        out[:, j] = 1.0 - unit if dim.scale.kind == "points" and dim.scale.points < 0 else unit
    return out


# ---------------------------------------------------------------------------------------- versions, cases

def with_version(rubric: Rubric, version: str, change: str, reason: str, **fields: Any) -> Rubric:
    """A new revision: replace `fields` (e.g. dimensions=...), set `version`, append a changelog entry."""
    entry = ChangelogEntry(version, change, reason)
    return dataclasses.replace(rubric, version=version, changelog=rubric.changelog + (entry,), **fields)


def case_rubric(shared: Rubric, case_id: str, *, extra: Sequence[Dimension] = (),
                replace: Rubric | None = None) -> Rubric:
    """QuRL R*(q): the shared rubric plus per-row `extra` criteria, or a per-row `replace` rubric.

    A merged rubric is named '<shared.name>/<case_id>', keeps the shared version and changelog, and gets a
    new content hash; extra dimension ids must not collide with shared ones. With neither, returns `shared`.
    A replacement may not reuse the shared rubric's name and version with other content (name and version
    identify content in every log and checkpoint).
    """
    if replace is not None:
        if extra:
            raise RubricError(f"case {short_repr(case_id)}: give extra criteria or a replacement rubric, not both")
        if not isinstance(replace, Rubric):
            raise RubricError(f"case {short_repr(case_id)}: replacement must be a Rubric, got {type(replace).__name__}")
        if shared is not None:
            check_rubric_identities([(shared, "the shared rubric"), (replace, f"case {short_repr(case_id)}")])
        return replace
    if not extra:
        return shared
    clash = sorted(set(shared.dimension_ids) & {d.id for d in extra})
    if clash:
        raise RubricError(f"case {short_repr(case_id)}: extra criteria reuse dimension ids {short_repr(clash)} of "
                          f"rubric {short_repr(shared.name)}")
    return dataclasses.replace(shared, name=f"{shared.name}/{case_id}", dimensions=shared.dimensions + tuple(extra))


def parse_row_rubric(row_rubric: Any, source: str = "<row>") -> tuple[tuple[Dimension, ...], Rubric | None]:
    """A data row's `rubric` field -> (extra criteria, replacement rubric); the one row format.

    `{"extra": [<dimension>, ...]}` adds criteria to the shared rubric; `{"replace": <rubric>}` gives
    the row a rubric of its own; None means neither. Errors name `source` (e.g. 'questions.jsonl:12').
    """
    if row_rubric is None:
        return (), None
    if not isinstance(row_rubric, Mapping) or len(row_rubric) != 1 or not set(row_rubric) <= {"extra", "replace"}:
        got = sorted(row_rubric) if isinstance(row_rubric, Mapping) else type(row_rubric).__name__
        raise RubricError(f"{source}: field 'rubric': expected {{'extra': [dimension, ...]}} or "
                          f"{{'replace': rubric}}, got {got}")
    if "replace" in row_rubric:
        return (), rubric_from_dict(row_rubric["replace"], source)
    extra = row_rubric["extra"]
    if not isinstance(extra, list) or not extra:
        raise RubricError(f"{source}: field 'rubric.extra': expected a non-empty list, got {short_repr(extra)}")
    try:
        _check_dimension_count(len(extra), "rubric.extra")
        return tuple(dimension_from_dict(d) for d in extra), None
    except RubricError as e:
        raise RubricError(f"{source}: {e}") from None


def case_rubric_from_row(shared: Rubric | None, row_rubric: Mapping[str, Any] | None, case_id: str,
                         source: str = "<row>") -> Rubric:
    """A data row's optional `rubric` field (see parse_row_rubric) -> the row's rubric R*(q)."""
    extra, replace = parse_row_rubric(row_rubric, source)
    if replace is None and shared is None:
        raise RubricError(f"{source}: no shared rubric configured and the row has no 'rubric': {{'replace': ...}}")
    try:
        return case_rubric(shared, case_id, extra=extra, replace=replace)
    except RubricError as e:
        raise RubricError(f"{source}: {e}") from None


def rubric_differences(a: Rubric, b: Rubric) -> list[str]:
    """What two rubrics' hashed contents differ in: 'name', 'dimension <id>' for each id whose definition (or
    presence) differs, 'dimension order', 'aggregation' (else their canonical form): where two same-named rubrics part."""
    mine, theirs = {d.id: d for d in a.dimensions}, {d.id: d for d in b.dimensions}
    dims = [f"dimension {short_repr(i)}" for i in dict.fromkeys([*mine, *theirs]) if mine.get(i) != theirs.get(i)]
    out = (["name"] if a.name != b.name else []) + dims
    out += ["dimension order"] if not dims and a.dimension_ids != b.dimension_ids else []
    out += ["aggregation"] if a.aggregation != b.aggregation else []
    return out or ["their canonical form"]


def check_rubric_identities(rubrics: Iterable[tuple[Rubric, str]]) -> None:
    """Raise if two rubrics share a name and version but not their content; each comes with its source.

    Name and version are how logs, checkpoints and people refer to a rubric, so one (name, version) must
    always mean one content hash. Names are compared by `name_key` (case and lookalike letters ignored), so
    'Hostile_rules' cannot pose as 'hostile_rules' at its version. Linear in the number of rubrics; the
    error names both sources and what differs.
    """
    first: dict[tuple[str, str], tuple[Rubric, str]] = {}
    for rubric, source in rubrics:
        known, known_source = first.setdefault((name_key(rubric.name), rubric.version), (rubric, source))
        if known.content_hash != rubric.content_hash:
            spelt = "" if known.name == rubric.name else (f" (spelt {short_repr(known.name)} there: names are "
                                                          "compared ignoring case and lookalike letters)")
            raise RubricError(
                f"{source}: rubric {short_repr(rubric.name)} version {rubric.version} has other content than the "
                f"rubric of that name and version in {known_source}{spelt} (hash {rubric.content_hash[:12]} vs "
                f"{known.content_hash[:12]}; they differ in {', '.join(rubric_differences(known, rubric))}); "
                "give it a new name or a new version")

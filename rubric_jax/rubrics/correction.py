"""Score corrections as versioned data: a linear de-biasing map per dimension, fitted by calibration.

RubricRL 3.3 ("后处理校准"): predict a judge's bias from length and format features with a linear
regression and remove it. A `Correction` holds, per dimension id, on that dimension's raw scale

    corrected = clip(intercept + score * raw + sum_f coef_f * x_f, lo, hi)

where the x_f are features of the response text (rubric_jax.judges.features), each standardised as
x_f = (feature_f - mean_f) / std_f when `standardize` lists it (length: the mean and SD of the data the
correction was fitted on) and used as it is otherwise (0/1 flags, shares). The file (JSON or YAML)
lives next to the rubric it corrects; `content_hash` covers everything that changes scores (not the
version or the provenance), and a run that applies a correction records it in its rubric-set hash.
Missing scores (NaN) stay missing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rubric_jax.jsonl import finite_float, shown
from rubric_jax.rubrics.io import dumps_document, load_document
from rubric_jax.rubrics.schema import RubricError, canonical_json, parse_version

FORMAT = "rubric_jax.score_correction"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 1 << 20  # a correction is a few numbers per dimension; refuse to parse anything huge


def _number(value: Any, where: str) -> float:
    number = finite_float(value)
    if number is None:
        raise RubricError(f"{where}: expected a finite number, got {shown(value)}")
    return number


@dataclasses.dataclass(frozen=True)
class DimensionCorrection:
    """corrected = clip(intercept + score * raw + sum_f features[f] * x_f, lo, hi) on one dimension."""

    intercept: float
    score: float
    features: Mapping[str, float]
    scale: tuple[int, int]  # the dimension's raw (lo, hi); a rubric whose dimension differs is refused

    def to_dict(self) -> dict[str, Any]:
        return {"intercept": self.intercept, "score": self.score, "features": dict(self.features),
                "scale": list(self.scale)}


@dataclasses.dataclass(frozen=True)
class Correction:
    """Per-dimension linear corrections, feature standardisation, a version and where it was fitted."""

    version: str
    standardize: Mapping[str, tuple[float, float]]  # feature -> (mean, std) of the fitting data; others used raw
    dimensions: Mapping[str, DimensionCorrection]
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # labels file, n, judges; not hashed

    def __post_init__(self) -> None:
        parse_version(self.version)
        for name, (_, std) in self.standardize.items():
            if not std > 0:
                raise RubricError(f"correction: feature {name!r}: std must be positive, got {std!r}")
        for dim_id, dim in self.dimensions.items():
            if not dim.scale[0] < dim.scale[1]:
                raise RubricError(f"correction: dimension {dim_id!r}: scale must be [lo, hi] with lo < hi, "
                                  f"got {dim.scale}")

    @property
    def features(self) -> list[str]:
        """Every feature some dimension or the standardisation names."""
        return sorted({f for dim in self.dimensions.values() for f in dim.features} | set(self.standardize))

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "version": self.version,
                "standardize": {f: list(ms) for f, ms in self.standardize.items()},
                "dimensions": {d: c.to_dict() for d, c in self.dimensions.items()},
                "provenance": dict(self.provenance)}

    @functools.cached_property
    def content_hash(self) -> str:
        """sha256 of the canonical JSON of what changes scores (standardisation and coefficients)."""
        content = self.to_dict()
        del content["version"], content["provenance"]
        return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()

    def check_dimension(self, dim_id: str, raw_range: tuple[int, int], where: str) -> None:
        """Raise unless a corrected dimension `dim_id` of a rubric has the scale the correction was fitted on."""
        dim = self.dimensions.get(dim_id)
        if dim is not None and tuple(dim.scale) != tuple(raw_range):
            raise RubricError(f"{where}: dimension {dim_id!r} has scale {list(raw_range)} but the correction was "
                              f"fitted on {list(dim.scale)}")

    def apply(self, dimension_ids: Sequence[str], raw_NxD: np.ndarray,
              features: Mapping[str, np.ndarray]) -> np.ndarray:
        """Raw scores [N, D] (columns `dimension_ids`, NaN = missing) with every corrected column mapped."""
        out_NxD = np.array(raw_NxD, dtype=np.float64, copy=True)
        x = {f: np.asarray(features[f], np.float64) for f in self.features}
        x.update({f: (x[f] - mean) / std for f, (mean, std) in self.standardize.items()})
        for c, dim_id in enumerate(dimension_ids):
            dim = self.dimensions.get(dim_id)
            if dim is None:
                continue
            linear_N = dim.intercept + dim.score * out_NxD[:, c]
            for f, coef in dim.features.items():
                linear_N = linear_N + coef * x[f]
            out_NxD[:, c] = np.clip(linear_N, *dim.scale)  # NaN (missing) stays NaN through clip
        return out_NxD


def correction_from_dict(d: Any, source: str = "<dict>") -> Correction:
    """Raw dict (parsed JSON/YAML) -> validated Correction; every error message starts with `source`."""
    try:
        if not isinstance(d, Mapping):
            raise RubricError(f"expected a mapping, got {type(d).__name__}")
        if d.get("format") != FORMAT or d.get("format_version") != FORMAT_VERSION:
            raise RubricError(f"fields 'format'/'format_version': expected {FORMAT!r} / {FORMAT_VERSION}, got "
                              f"{d.get('format')!r} / {d.get('format_version')!r}")
        unknown = sorted(set(d) - {"format", "format_version", "version", "standardize", "dimensions", "provenance"})
        if unknown:
            raise RubricError(f"unknown field(s) {unknown}")
        standardize_raw, dims_raw = d.get("standardize"), d.get("dimensions")
        if not isinstance(standardize_raw, Mapping) or not isinstance(dims_raw, Mapping) or not dims_raw:
            raise RubricError("fields 'standardize' and 'dimensions' must be mappings, 'dimensions' non-empty")
        standardize = {}
        for name, pair in standardize_raw.items():
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise RubricError(f"standardize.{name}: expected [mean, std], got {pair!r}")
            standardize[str(name)] = (_number(pair[0], f"standardize.{name}"), _number(pair[1], f"standardize.{name}"))
        dims = {}
        for dim_id, raw in dims_raw.items():
            where = f"dimensions.{dim_id}"
            if not isinstance(raw, Mapping) or set(raw) != {"intercept", "score", "features", "scale"}:
                got = sorted(raw) if isinstance(raw, Mapping) else raw
                raise RubricError(f"{where}: expected fields ['features', 'intercept', 'scale', 'score'], got {got!r}")
            if not isinstance(raw["features"], Mapping):
                raise RubricError(f"{where}.features: expected a mapping, got {raw['features']!r}")
            scale = raw["scale"]
            if (not isinstance(scale, (list, tuple)) or len(scale) != 2
                    or any(isinstance(v, bool) or not isinstance(v, int) for v in scale)):
                raise RubricError(f"{where}.scale: expected [lo, hi] integers, got {scale!r}")
            dims[str(dim_id)] = DimensionCorrection(
                _number(raw["intercept"], f"{where}.intercept"), _number(raw["score"], f"{where}.score"),
                {str(f): _number(v, f"{where}.features.{f}") for f, v in raw["features"].items()}, (scale[0], scale[1]))
        provenance = d.get("provenance", {})
        if not isinstance(provenance, Mapping):
            raise RubricError(f"field 'provenance': expected a mapping, got {provenance!r}")
        return Correction(d.get("version"), standardize, dims, dict(provenance))
    except RubricError as e:
        raise RubricError(f"{source}: {e}") from None


def load_correction(path: str | Path) -> Correction:
    """Read and validate a correction file (.json, .yaml, .yml) through the bounded rubric-file reader
    (rubrics.io.load_document); errors name the file."""
    return correction_from_dict(load_document(path, "correction", MAX_FILE_BYTES), str(path))


def dumps_correction(correction: Correction, fmt: str) -> str:
    """Serialise to 'json' or 'yaml' text."""
    return dumps_document(correction.to_dict(), fmt)

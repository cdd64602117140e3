"""Question splits as a tensorflow-datasets dataset: array_record files written by a builder, read back
with `tfds.data_source` (random access, no TensorFlow).

A dataset NAME lives in DATA_DIR/NAME/1.0.0/. Every record is one question row (the jsonl schema of
rubric_jax.data) plus `index`, its position in the prepared order: tfds hands records back shuffled,
so `read_split` sorts by index and checks that no position is missing. Text features come back as
bytes; optional fields are stored as '' (no difficulty, no reference, no rubric).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

VERSION = "1.0.0"
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_TEXT_FIELDS = ("id", "question", "category", "lang", "difficulty", "reference", "source")


class DatasetError(ValueError):
    """A tfds question dataset that is missing, malformed or asked for a split it does not have."""


def features() -> tfds.features.FeaturesDict:
    """One question row; `rubric` is the row's rubric field as JSON and `keywords` a list of strings."""
    spec: dict[str, Any] = {name: tfds.features.Text() for name in _TEXT_FIELDS}
    spec["index"] = tfds.features.Scalar(np.int64)
    spec["keywords"] = tfds.features.Sequence(tfds.features.Text())
    spec["rubric"] = tfds.features.Text()
    return tfds.features.FeaturesDict(spec)


def to_record(index: int, row: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A question row (and where it came from) -> the feature dict stored for it."""
    record: dict[str, Any] = {name: row.get(name) or "" for name in _TEXT_FIELDS}
    record.update(index=index, source=source, keywords=list(row.get("keywords", [])),
                  rubric=json.dumps(row["rubric"], ensure_ascii=False, sort_keys=True) if "rubric" in row else "")
    return record


def from_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The stored feature dict -> the question row (empty optional fields left out)."""
    text = {name: record[name].decode("utf-8") for name in _TEXT_FIELDS}
    row: dict[str, Any] = {name: text[name] for name in ("id", "question", "category", "lang")}
    for name in ("difficulty", "reference"):
        if text[name]:
            row[name] = text[name]
    keywords = [k.decode("utf-8") for k in record["keywords"]]
    if keywords:
        row["keywords"] = keywords
    rubric = record["rubric"].decode("utf-8")
    if rubric:
        row["rubric"] = json.loads(rubric)
    return row


class LocalDatasetInfo(tfds.core.DatasetInfo):
    """DatasetInfo of a dataset that exists only on disk: no lookup of pre-computed info in tfds' GCS bucket."""

    def initialize_from_bucket(self) -> None:
        """Nothing to look up: tfds' own makes an empty temporary directory per builder and leaves it, before asking
        its bucket for this dataset (never there: our datasets are named by the user and written here)."""


class QuestionDataset(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Writes the given splits of question records; `name` is chosen per dataset (no registration)."""

    VERSION = tfds.core.Version(VERSION)

    def __init__(self, *, name: str, splits: Mapping[str, Sequence[Mapping[str, Any]]], **kwargs: Any):
        self.name = name
        self._splits = splits
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return LocalDatasetInfo(builder=self, features=features(), description=(
            "Question rows prepared by rubric_jax (experiments.prepare_data); see report.md next to this "
            "version directory."))

    def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
        del dl_manager
        return {split: self._generate_examples(records) for split, records in self._splits.items()}

    def _generate_examples(self, records: Sequence[Mapping[str, Any]]) -> Any:
        for record in records:
            yield int(record["index"]), dict(record)

    def _log_download_bytes(self) -> None:
        """Silent: tfds would announce 'Downloading and preparing …'; nothing is downloaded here."""

    def _log_download_done(self) -> None:
        """Silent: prepare_data reports where the dataset went."""


def write_dataset(data_dir: Path, name: str, splits: Mapping[str, Sequence[Mapping[str, Any]]]) -> Path:
    """Builds DATA_DIR/NAME/VERSION from {split: [record, ...]} (empty splits are left out)."""
    if not NAME_RE.fullmatch(name):
        raise DatasetError(f"dataset name {name!r}: expected lower-case letters, digits and '_', starting with a letter")
    builder = QuestionDataset(name=name, splits={s: r for s, r in splits.items() if r}, data_dir=str(data_dir),
                              file_format="array_record")
    try:
        builder.download_and_prepare()
    except RuntimeError as e:  # array_record's writer reports a failed write (a full disk) as a RuntimeError
        raise OSError(" ".join(str(e).split())) from None
    return Path(builder.data_dir)


def read_split(data_dir: str | Path, name: str, split: str) -> list[dict[str, Any]]:
    """Question rows of one split in their prepared order; errors name the directory, dataset and split."""
    where = f"{data_dir}/{name}"
    if not (Path(data_dir) / name).is_dir():
        raise DatasetError(f"{where}: no tfds dataset {name!r} in {data_dir} (write one with experiments.prepare_data)")
    try:
        source = tfds.data_source(name, split=split, data_dir=str(data_dir))
    except ValueError as e:  # tfds: "Unknown split 'x'. Should be one of [...]"
        raise DatasetError(f"{where}: {e}") from None
    records = [source[i] for i in range(len(source))]
    indices = sorted(int(r["index"]) for r in records)
    if indices != list(range(len(records))):
        raise DatasetError(f"{where} split {split!r}: record indices are not 0..{len(records) - 1}")
    return [from_record(r) for r in sorted(records, key=lambda r: int(r["index"]))]

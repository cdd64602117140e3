"""Rubrics as versioned data: schema, files, importers of public formats, aggregation, dynamic weights,
score corrections."""
from rubric_jax.rubrics.correction import (Correction, DimensionCorrection, correction_from_dict, dumps_correction,
                                           load_correction)
from rubric_jax.rubrics.io import (
    check_revision,
    dumps_rubric,
    load_document,
    load_rubric,
    load_rubric_dir,
    loads_rubric,
    loads_yaml,
    save_rubric,
)
from rubric_jax.rubrics.schema import (
    Aggregation,
    Anchor,
    ChangelogEntry,
    Dimension,
    Rubric,
    RubricError,
    RubricWarning,
    Scale,
    case_rubric,
    case_rubric_from_row,
    check_rubric_identities,
    dimension_from_dict,
    dimension_to_dict,
    normalize_scores,
    parse_row_rubric,
    rubric_from_dict,
    rubric_to_dict,
    short_repr,
    with_version,
)

__all__ = [
    "Aggregation", "Anchor", "ChangelogEntry", "Correction", "Dimension", "DimensionCorrection", "Rubric",
    "RubricError", "RubricWarning", "Scale", "case_rubric", "case_rubric_from_row", "check_revision",
    "check_rubric_identities", "correction_from_dict", "dimension_from_dict", "dimension_to_dict", "dumps_correction",
    "dumps_rubric", "load_correction", "load_document", "load_rubric", "load_rubric_dir", "loads_rubric", "loads_yaml",
    "normalize_scores", "parse_row_rubric", "rubric_from_dict", "rubric_to_dict", "save_rubric", "short_repr",
    "with_version",
]

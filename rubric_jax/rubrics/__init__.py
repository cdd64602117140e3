"""Rubrics as versioned data: schema, files, importers of public formats, aggregation, dynamic weights."""
from rubric_jax.rubrics.io import check_revision, dumps_rubric, load_rubric, load_rubric_dir, save_rubric
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
    dimension_from_dict,
    dimension_to_dict,
    normalize_scores,
    rubric_from_dict,
    rubric_to_dict,
    with_version,
)

"""The public benchmark files in ../shared/data (read-only): a path to one, or a skip saying why not."""

import os
from pathlib import Path

import pytest


def shared_data() -> Path:
    """../shared/data next to the checkout, or $RUBRIC_JAX_SHARED_DATA."""
    env = os.environ.get("RUBRIC_JAX_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"


def real(*parts: str) -> Path:
    """shared_data()/parts, or pytest.skip when it is absent."""
    path = shared_data().joinpath(*parts)
    if not path.exists():
        pytest.skip(f"public benchmark file {path} not present (set RUBRIC_JAX_SHARED_DATA to the shared/data folder)")
    return path

"""Dimension kinds as registered scorers: docs/rubrics.md's worked kind, registered as the page writes it, loaded in
a rubric and scored by the reward next to a rule dimension."""

import re

import numpy as np
import pytest
import yaml

from rubric_jax.judges import scorers
from rubric_jax.judges.reward import RubricReward
from rubric_jax.rubrics import kinds
from rubric_jax.rubrics.schema import RubricError, rubric_from_dict
from tests import manual

PAGE = manual.ROOT / "docs" / "rubrics.md"
BINARY = {"0": "absent", "1": "present"}
PRINTS = {"id": "prints", "description": "prints something", "kind": "rule", "rule": "keywords",
          "params": {"words": ["print"]}, "scale": {"kind": "binary"}, "anchors": BINARY, "weight": 3.0}


def page_blocks(language: str) -> list[str]:
    """The ```<language> blocks of the page's "Adding a dimension kind" section."""
    section = PAGE.read_text().split("\n## Adding a dimension kind\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"^```{language}\n(.*?)^```", section, re.S | re.M)


def rubric(dims):
    return rubric_from_dict({"name": "code", "version": "1.0.0",
                             "changelog": [{"version": "1.0.0", "change": "initial", "reason": "test"}],
                             "dimensions": dims, "aggregation": {"method": "weighted_sum"}})


@pytest.fixture
def registries(monkeypatch):
    """The kind and scorer registries as copies, so that the kind a test registers ends with the test."""
    monkeypatch.setattr(kinds, "_KINDS", dict(kinds._KINDS))
    monkeypatch.setattr(scorers, "_SCORERS", dict(scorers._SCORERS))


def register_the_page_kind() -> dict:
    """Runs the page's scorer file as a module of its own (registering its kind); its rubric dimension."""
    (source,), (dimension,) = page_blocks("python"), page_blocks("yaml")
    exec(compile(source, str(PAGE), "exec"), {"__name__": "rubric_jax.judges.python_syntax"})
    return yaml.safe_load(dimension)[0]


def test_the_page_kind_is_rejected_until_registered_then_scored_next_to_a_rule(registries):
    dimension = yaml.safe_load(page_blocks("yaml")[0])[0]
    with pytest.raises(RubricError, match=r"kind.*one of \('rule', 'llm'\).*python_syntax"):
        rubric([dimension, PRINTS])
    register_the_page_kind()
    assert kinds.kind_names() == ("rule", "llm", "python_syntax")
    code = rubric([dimension, PRINTS])
    responses = ["print(1)", "def f(:", "x = 1", "print the report"]
    out = RubricReward([code])(["q"] * 4, responses, [code] * 4)
    assert out.dimension_ids == ["code_parses", "prints"]
    np.testing.assert_array_equal(out.details["raw_scores"], [[1, 1], [0, 0], [1, 0], [0, 1]])
    # code_parses is a gate (a veto): a response that does not parse scores 0 whatever it prints.
    np.testing.assert_allclose(out.reward, [1.0, 0.0, 0.0, 0.0])
    assert out.valid.all() and out.details["num_failed_scores"] == 0


def test_a_kind_is_scored_by_one_scorer_and_its_name_by_one_kind(registries):
    register_the_page_kind()
    with pytest.raises(ValueError, match="'python_syntax' already has a scorer"):
        register_the_page_kind()
    with pytest.raises(ValueError, match="'llm' is already registered"):
        kinds.register_kind(kinds.Kind("llm", "elsewhere"))


def test_a_declared_kind_whose_module_registers_no_scorer_fails_when_scored(registries):
    kinds.register_kind(kinds.Kind("unscored", "rubric_jax.judges.features"))
    with pytest.raises(ValueError, match="'unscored': importing rubric_jax.judges.features registered no scorer"):
        RubricReward()(["q"], ["a"], [rubric([PRINTS])])


class Recording:
    """A deferred kind "recorded" that scores its scale's top and records the rows it was asked about."""

    kind = kinds.Kind("recorded", __name__)
    deferred = True

    def __init__(self):
        self.asked: list[int] = []

    def prepare(self, rubric, dims, judging):
        return None

    def score(self, batch, judging):
        rows = [n for n, dims in enumerate(batch.dims) if dims]
        self.asked += rows
        tops = [np.asarray([[d.scale.raw_range[1] for d in batch.dims[n]]]) for n in rows]
        return scorers.Scored([scorers.Cells([n], batch.dims[n], top, "") for n, top in zip(rows, tops)])

    def gated(self, dims, judging):
        return {"recorded_gated": sum(map(len, dims))}


def test_with_gates_first_a_gate_of_any_kind_not_deferred_spares_the_deferred_kinds(registries):
    gate = register_the_page_kind()
    recording = scorers.register(Recording())
    recorded = {"id": "recorded", "description": "always met", "kind": "recorded", "scale": {"kind": "binary"},
                "anchors": BINARY}
    code = rubric([gate, recorded])
    out = RubricReward([code], gates_first=True)(["q"] * 3, ["print(1)", "def f(:", "x = 1"], [code] * 3)
    assert recording.asked == [0, 2]  # the row that does not parse is not asked about
    assert out.details["recorded_gated"] == 1 and out.details["gated_scores"] == 1
    assert out.details["failure_causes"] == {} and out.details["reward_ok"].all()
    np.testing.assert_allclose(out.reward, [1.0, 0.0, 1.0])
    assert np.isnan(out.details["raw_scores"][1, 1])

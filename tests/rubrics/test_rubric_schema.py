"""Rubric schema: validation messages, dict/JSON/YAML round trips, content hash, normalisation, versioning."""
import copy
import dataclasses
import functools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from rubric_jax.judges.rules import make_rule
from rubric_jax.rubrics import (
    Anchor,
    Dimension,
    RubricError,
    RubricWarning,
    Scale,
    case_rubric,
    case_rubric_from_row,
    dimension_from_dict,
    load_rubric,
    load_rubric_dir,
    normalize_scores,
    rubric_from_dict,
    rubric_to_dict,
    save_rubric,
    with_version,
)

REPO = Path(__file__).resolve().parents[2]


def _dim(dim_id, lo=1, hi=5, **kw):
    return {"id": dim_id, "description": f"{dim_id} description", "kind": "llm",
            "scale": {"kind": "integer", "lo": lo, "hi": hi},
            "anchors": {str(k): {"description": f"level {k}"} for k in range(lo, hi + 1)}, **kw}


def _raw():
    return {
        "name": "demo", "version": "1.0.0",
        "changelog": [{"version": "1.0.0", "change": "first", "reason": "test"}],
        "dimensions": [
            _dim("accuracy", weight=2.0),
            {"id": "safety", "description": "disclaimer present", "kind": "rule", "rule": "disclaimer",
             "params": {}, "scale": {"kind": "binary"}, "gate": True,
             "anchors": {"0": {"description": "none", "negative_examples": ["fluent but no disclaimer"]},
                         "1": {"description": "present", "positive_examples": ["please see a doctor"]}}},
        ],
        "aggregation": {"method": "weighted_sum", "params": {}, "missing": "renormalize"},
    }


def _err(raw, source="rubrics/medical.yaml"):
    with pytest.raises(RubricError) as e:
        rubric_from_dict(raw, source)
    return str(e.value)


def test_round_trip_dict_json_yaml(tmp_path):
    r = rubric_from_dict(_raw())
    assert rubric_from_dict(rubric_to_dict(r)) == r
    assert rubric_from_dict(json.loads(json.dumps(rubric_to_dict(r)))) == r
    for suffix in ("json", "yaml", "yml"):
        path = tmp_path / f"r.{suffix}"
        save_rubric(r, path)
        back = load_rubric(path)
        assert back == r and back.content_hash == r.content_hash
    assert r.dimension_ids == ["accuracy", "safety"]
    np.testing.assert_array_equal(r.gates, [False, True])
    np.testing.assert_array_equal(r.weights, [2.0, 1.0])
    assert r.dimension("safety").rule == "disclaimer"
    assert r.dimension("safety").anchors[1].positive_examples == ("please see a doctor",)
    with pytest.raises(KeyError, match="has no dimension 'nope'"):
        r.dimension("nope")


def test_content_hash_tracks_content_not_history():
    r = rubric_from_dict(_raw())
    assert len(r.content_hash) == 64 and hash(r) == hash(rubric_from_dict(_raw()))
    assert len({*r.dimensions, *rubric_from_dict(_raw()).dimensions}) == 2  # dimensions hash by content
    assert hash(r.aggregation) == hash(rubric_from_dict(_raw()).aggregation)
    bumped = with_version(r, "1.0.1", "typo in changelog only", "none")
    assert bumped.content_hash == r.content_hash
    for edit in (lambda d: d["dimensions"][0].update(weight=3.0),
                 lambda d: d["dimensions"][0]["anchors"]["3"].update(description="changed"),
                 lambda d: d["dimensions"][1]["anchors"]["0"]["negative_examples"].append("another"),
                 lambda d: d["aggregation"].update(missing="drop"),
                 lambda d: d.update(name="other")):
        raw = _raw()
        edit(raw)
        assert rubric_from_dict(raw).content_hash != r.content_hash
    # Key order in the file does not matter.
    raw = _raw()
    shuffled = {k: raw[k] for k in reversed(list(raw))}
    assert rubric_from_dict(shuffled).content_hash == r.content_hash


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["dimensions"][1].update(scale={"kind": "integer", "lo": 3, "hi": 1}),
     "rubrics/medical.yaml: dimension 'safety': field 'scale': expected lo < hi, got (3, 1)"),
    (lambda d: d["dimensions"][1].update(scale={"kind": "ternary"}),
     "rubrics/medical.yaml: dimension 'safety': field 'scale.kind': expected one of"),
    (lambda d: d["dimensions"][0].update(colour="red"),
     "rubrics/medical.yaml: dimension 'accuracy': field 'dimension': unknown field(s) ['colour']"),
    (lambda d: d.update(author="me"), "rubrics/medical.yaml: field 'rubric': unknown field(s) ['author']"),
    (lambda d: d["dimensions"][0]["anchors"]["2"].update(example="x"),
     "rubrics/medical.yaml: dimension 'accuracy': field 'anchors.2': unknown field(s) ['example']"),
    (lambda d: d["dimensions"][0]["scale"].update(points=3),
     "dimension 'accuracy': field 'scale.points': expected no points for an integer scale"),
    (lambda d: d["aggregation"].update(method="mean"), "field 'aggregation.method': expected one of"),
    (lambda d: d["aggregation"].update(params={"eps": 0.1}),
     "field 'aggregation.params.eps': expected a parameter of 'weighted_sum'"),
    (lambda d: d["aggregation"].update(missing="zero"), "field 'aggregation.missing'"),
    (lambda d: d["dimensions"][0]["anchors"].pop("3"),
     "dimension 'accuracy': field 'anchors': expected one anchor for every level [1, 2, 3, 4, 5], got [1, 2, 4, 5]"),
    (lambda d: d["dimensions"][0].update(weight=0),
     "dimension 'accuracy': field 'weight': expected a number in [1e-06, 1e+06]"),
    (lambda d: d["dimensions"][0].update(weight=True), "dimension 'accuracy': field 'weight': expected a finite number"),
    (lambda d: d["dimensions"][0].update(kind="human"), "dimension 'accuracy': field 'kind'"),
    (lambda d: d["dimensions"][0].update(rule="regex"), "dimension 'accuracy': field 'rule': expected no rule name"),
    (lambda d: d["dimensions"][1].pop("rule"), "dimension 'safety': field 'rule': expected a non-empty string"),
    (lambda d: d["dimensions"][0].update(gate="yes"), "dimension 'accuracy': field 'gate'"),
    (lambda d: d["dimensions"][1].update(id="accuracy"), "field 'dimensions': expected unique dimension ids"),
    (lambda d: d["dimensions"][0].update(id="1st dim"), "field 'id': expected an identifier"),
    (lambda d: d.update(version="1.1"), "field 'version': expected a semantic version"),
    (lambda d: d.update(version="1.1.0"), "field 'changelog': expected last entry for the current version 1.1.0"),
    (lambda d: d.update(changelog=[]), "field 'changelog': expected at least one entry"),
    (lambda d: d["changelog"].insert(0, {"version": "2.0.0", "change": "x", "reason": "y"}),
     "field 'changelog': expected strictly increasing versions"),
    (lambda d: d["changelog"][0].pop("reason"), "field 'changelog': missing required field(s) ['reason']"),
    (lambda d: d["dimensions"][0].update(gate=True), "expected at least one non-gate dimension"),
    (lambda d: d.update(aggregation={"method": "healthbench_points"}),
     "dimension 'accuracy': field 'scale': expected a points scale"),
    (lambda d: d.update(aggregation={"method": "hierarchical", "params": {"within": "min", "across": "weighted_sum"}}),
     "dimension 'accuracy': field 'group': expected a group name"),
    (lambda d: d.update(aggregation={"method": "hierarchical", "params": {"within": "hierarchical", "across": "min"}}),
     "field 'aggregation.params.within': expected one of"),
])
def test_validation_errors_name_file_dimension_and_field(edit, expected):
    raw = _raw()
    edit(raw)
    assert expected in _err(raw)
    assert _err(raw).startswith("rubrics/medical.yaml: ")


def test_load_errors_name_the_file_and_yaml_is_safe(tmp_path):
    bad = tmp_path / "bad.yaml"
    raw = _raw()
    raw["dimensions"][0]["scale"] = {"kind": "integer", "lo": 1}
    bad.write_text(json.dumps(raw))  # JSON is valid YAML
    with pytest.raises(RubricError, match=f"{bad}: dimension 'accuracy': field 'scale.hi': expected an integer"):
        load_rubric(bad)
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(RubricError, match="not valid YAML"):
        load_rubric(unsafe)
    with pytest.raises(RubricError, match="expected a rubric file ending in"):
        load_rubric(tmp_path / "r.txt")


def test_more_than_seven_dimensions_warns():
    raw = _raw()
    raw["dimensions"] = [_dim(f"d{k}") for k in range(7)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rubric_from_dict(raw)
    raw["dimensions"].append(_dim("d7"))
    with pytest.warns(RubricWarning, match="8 dimensions; RubricRL advises at most 7"):
        rubric_from_dict(raw)


def test_normalize_scores_per_scale():
    dims = [
        Dimension("b", "binary", "llm", Scale.binary(), {0: Anchor("no"), 1: Anchor("yes")}),
        Dimension("i", "1-5", "llm", Scale.integer(1, 5), {k: Anchor(str(k)) for k in range(1, 6)}),
        Dimension("p", "good", "llm", Scale.signed_points(7), {0: Anchor("no"), 1: Anchor("yes")}),
        Dimension("n", "bad", "llm", Scale.signed_points(-6), {0: Anchor("no"), 1: Anchor("yes")}),
    ]
    raw = np.array([[1, 5, 1, 1], [0, 1, 0, 0], [np.nan, 3, 1, np.nan], [1, 4.5, 0, 0]])
    expected = np.array([[1, 1, 1, 0], [0, 0, 0, 1], [np.nan, 0.5, 1, np.nan], [1, 0.875, 0, 1]])
    np.testing.assert_allclose(normalize_scores(dims, raw), expected)
    assert dims[1].normalize(2) == 0.25 and dims[3].normalize(1) == 0.0
    with pytest.raises(ValueError, match=r"dimension 'i': raw score 6.0 outside scale range \[1, 5\]"):
        normalize_scores(dims, np.array([[1, 6, 1, 1]]))
    with pytest.raises(ValueError, match=r"expected shape \[N, 4\]"):
        normalize_scores(dims, np.zeros((2, 3)))


def test_save_refuses_unversioned_change(tmp_path):
    r = rubric_from_dict(_raw())
    path = tmp_path / "medical.yaml"
    save_rubric(r, path)
    save_rubric(r, path)  # unchanged content: fine
    changed_dims = (dataclasses.replace(r.dimensions[0], weight=5.0), r.dimensions[1])
    with pytest.raises(RubricError, match=f"{path}: content changed .* version '1.0.0' is not higher"):
        save_rubric(dataclasses.replace(r, dimensions=changed_dims), path)
    # A Rubric's last changelog entry is its version, so a higher version always carries a new entry.
    v2 = with_version(r, "1.1.0", "accuracy weight 2 -> 5", "accuracy dominated errors", dimensions=changed_dims)
    save_rubric(v2, path)
    assert load_rubric(path) == v2
    rewritten = dataclasses.replace(v2, changelog=(v2.changelog[0].__class__("1.1.0", "other", "history"),))
    with pytest.raises(RubricError, match="changelog is append-only"):
        save_rubric(rewritten, path)


def test_case_rubrics_merge_or_replace():
    shared = rubric_from_dict(_raw())
    extra = dimension_from_dict(_dim("cites_sources", lo=0, hi=1, weight=0.5))
    merged = case_rubric(shared, "q17", extra=[extra])
    assert merged.name == "demo/q17" and merged.dimension_ids == ["accuracy", "safety", "cites_sources"]
    assert merged.version == shared.version and merged.content_hash != shared.content_hash
    assert case_rubric(shared, "q17") is shared
    other = rubric_from_dict({**_raw(), "name": "own"})
    assert case_rubric(shared, "q17", replace=other) is other
    with pytest.raises(RubricError, match="case 'q17': extra criteria reuse dimension ids \\['accuracy'\\]"):
        case_rubric(shared, "q17", extra=[dimension_from_dict(_dim("accuracy"))])
    with pytest.raises(RubricError, match="not both"):
        case_rubric(shared, "q17", extra=[extra], replace=other)
    # Row-level field of a question file.
    row = {"extra": [_dim("cites_sources", lo=0, hi=1, weight=0.5)]}
    assert case_rubric_from_row(shared, row, "q17", "q.jsonl:3") == merged
    assert case_rubric_from_row(shared, None, "q17") is shared
    assert case_rubric_from_row(None, {"replace": _raw()}, "q17") == shared
    with pytest.raises(RubricError, match="q.jsonl:3: dimension 'x': field 'scale'"):
        case_rubric_from_row(shared, {"extra": [{**_dim("x"), "scale": {"kind": "integer", "lo": 2, "hi": 2}}]},
                             "q17", "q.jsonl:3")
    with pytest.raises(RubricError, match="q.jsonl:3: field 'rubric.extra': expected a non-empty list"):
        case_rubric_from_row(shared, {"extra": []}, "q17", "q.jsonl:3")
    with pytest.raises(RubricError, match="q.jsonl:3: field 'rubric': expected"):
        case_rubric_from_row(shared, _raw(), "q17", "q.jsonl:3")
    with pytest.raises(RubricError, match="no shared rubric"):
        case_rubric_from_row(None, None, "q17", "q.jsonl:3")


def test_anchor_shorthand_and_dataclass_validation():
    raw = _raw()
    raw["dimensions"][1]["anchors"] = {0: "none", 1: "present"}
    r = rubric_from_dict(raw)
    assert r.dimension("safety").anchors[0].description == "none"
    with pytest.raises(RubricError, match="field 'anchor.description'"):
        Anchor("")
    with pytest.raises(RubricError, match="dimension 'x': field 'params': expected no params for an llm dimension"):
        Dimension("x", "d", "llm", Scale.binary(), {0: Anchor("a"), 1: Anchor("b")}, params={"n": 1})


def test_shipped_rubrics_load_and_match_the_article():
    rubrics = load_rubric_dir(REPO / "configs" / "rubrics")
    assert {"medical_qa", "customer_service"} <= set(rubrics)
    for name, r in rubrics.items():
        assert r.version == "1.0.0" and r.changelog and len(r.dimensions) <= 7, name
        for d in r.dimensions:
            if d.kind == "rule":
                make_rule(d.rule, d.params)  # the rule judge accepts the shipped parameters
    med = rubrics["medical_qa"]
    assert med.dimension_ids == ["factual_accuracy", "safety_boundary", "completeness", "clarity"]
    safety = med.dimension("safety_boundary")
    assert safety.gate and safety.scale.kind == "binary"
    assert [med.dimension(i).scale.levels for i in ("factual_accuracy", "completeness", "clarity")] == [(1, 2, 3, 4, 5)] * 3
    clarity = med.dimension("clarity")
    assert "句子平均长度不超过25字" in clarity.anchors[5].description
    assert "完全无法理解" in clarity.anchors[1].description
    assert "首先" in clarity.anchors[5].negative_examples[0]
    cs = rubrics["customer_service"]
    assert cs.dimension("redundancy").rule == "ngram_redundancy" and cs.dimension("no_unkeepable_promises").gate


def test_load_rubric_dir_rejects_duplicate_stems(tmp_path):
    r = rubric_from_dict(_raw())
    save_rubric(r, tmp_path / "a.json")
    save_rubric(r, tmp_path / "a.yaml")
    with pytest.raises(RubricError, match="already loaded"):
        load_rubric_dir(tmp_path)
    assert copy.deepcopy(r) == r


# ------------------------------------------------------------------ hostile rubrics: bounded, one clear error


def test_an_error_quotes_a_bounded_piece_of_a_huge_value():
    """A shared-reference bomb (10**9 leaves, as a YAML alias bomb builds) in a field that fails validation."""
    bomb = ["lol"] * 10
    for _ in range(8):
        bomb = [bomb] * 10
    message = _err({**_raw(), "name": bomb})
    assert message.startswith("rubrics/medical.yaml: field 'name': expected 1-256 visible characters")
    assert "got [[[" in message
    assert len(message) < 400
    from rubric_jax.rubrics import short_repr

    assert short_repr(10**5000).startswith("<integer of about 5000 digits")
    assert len(short_repr("x" * 10**6)) <= 200


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["dimensions"][0].update(weight=1e39), "field 'weight': expected a number in [1e-06, 1e+06]"),
    (lambda d: d["dimensions"][0].update(weight=1e-46), "field 'weight': expected a number in [1e-06, 1e+06]"),
    (lambda d: d["dimensions"][0].update(weight=10**400), "field 'weight': expected a finite number"),
    (lambda d: d["dimensions"][1].update(scale={"kind": "points", "points": 10**40}),
     "field 'scale.points': expected an integer in [-1000000, 1000000]"),
    (lambda d: d.update(aggregation={"method": "weighted_geometric_mean", "params": {"eps": 1e-50}}),
     "field 'aggregation.params.eps': expected a number in [1e-30, 0.5]"),
    (lambda d: [x.update(group="g") for x in d["dimensions"]] and d.update(aggregation={
        "method": "hierarchical", "params": {"within": "min", "across": "min", "group_weights": {"g": 1e39}}}),
     "field 'aggregation.params.group_weights.g': expected a number in [1e-06, 1e+06]"),
    (lambda d: d["dimensions"][0].update(scale={"kind": "integer", "lo": 0, "hi": 10**6}),
     "field 'scale': expected at most 101 levels"),
    (lambda d: d["dimensions"][0].update(scale={"kind": "integer", "lo": 0, "hi": 10**12}),
     "field 'scale.hi': expected an integer in [-1000000, 1000000]"),
    (lambda d: d["dimensions"][0].update(scale={"kind": "integer", "lo": -10**7, "hi": -10**7 + 4}),
     "field 'scale.lo': expected an integer in [-1000000, 1000000]"),
    (lambda d: d["dimensions"][0]["anchors"].update({"9" * 5000: "huge level"}),
     "field 'anchors': expected integer score levels as keys"),
    (lambda d: d["dimensions"][0].update({5: "int key", "colour": "red"}), "unknown field(s) [5, 'colour']"),
    (lambda d: d["dimensions"][0].update(description="lone \ud800 surrogate"),
     "field 'description': expected text without lone surrogates"),
    (lambda d: d["dimensions"][1].update(params={"phrases": {"a", "b"}}),
     "field 'params.phrases': expected JSON data"),
    (lambda d: d["dimensions"][1].update(params={"n": float("nan")}), "field 'params.n': expected a finite number"),
    (lambda d: d["dimensions"][1].update(params={"\udc80": 1}), "field 'params key': expected text without lone"),
    (lambda d: d["dimensions"][1].update(params={"n": functools.reduce(lambda x, _: [x], range(20), 1)}),
     "field 'params.n': expected data nested at most 16 deep"),
    (lambda d: d.update(dimensions=[_dim(f"d{k}") for k in range(100_000)]),
     "field 'dimensions': expected at most 1000 dimensions, got 100000"),
])
def test_out_of_range_values_fail_at_validation_not_in_float32_or_at_hash_time(edit, expected):
    """Each of these used to pass validation and then hang, crash at content_hash, or give NaN rewards."""
    raw = _raw()
    edit(raw)
    message = _err(raw)
    assert expected in message and len(message) < 600


def test_dimension_validation_is_linear_up_to_the_cap():
    raw = _raw()
    raw["dimensions"] = [_dim(f"d{k}", lo=0, hi=1) for k in range(999)] + [_dim("d5", lo=0, hi=1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RubricWarning)
        assert "expected unique dimension ids, got ['d5']" in _err(raw)
        raw["dimensions"][-1] = _dim("d999", lo=0, hi=1)
        assert len(rubric_from_dict(raw).dimensions) == 1000


def test_a_replacement_may_not_reuse_the_shared_name_and_version_with_other_content():
    from rubric_jax.rubrics import check_rubric_identities

    shared = rubric_from_dict(_raw())
    impostor = _raw()
    impostor["dimensions"][0]["weight"] = 9.0
    with pytest.raises(RubricError, match=r"q.jsonl:4: case 'q4': rubric 'demo' version 1.0.0 has other content "
                                          r"than the rubric of that name and version in the shared rubric"):
        case_rubric_from_row(shared, {"replace": impostor}, "q4", "q.jsonl:4")
    assert case_rubric_from_row(shared, {"replace": _raw()}, "q4", "q.jsonl:4") == shared
    bumped = {**impostor, "version": "1.1.0", "changelog": [*impostor["changelog"],
                                                           {"version": "1.1.0", "change": "w", "reason": "r"}]}
    assert case_rubric_from_row(shared, {"replace": bumped}, "q4").version == "1.1.0"
    rows = [(case_rubric_from_row(None, {"replace": raw}, "q"), f"q.jsonl:{i}")
            for i, raw in ((1, _raw()), (2, _raw()), (3, impostor))]
    check_rubric_identities(rows[:2])
    with pytest.raises(RubricError, match="q.jsonl:3: rubric 'demo' version 1.0.0 has other content .* in q.jsonl:1"):
        check_rubric_identities(rows)


# ------------------------------------------------------------------------------------------ issue 24

def test_what_a_dimension_reads_round_trips_and_is_in_the_hash(tmp_path):
    """R1: `reads` (answer by default) goes through dict, JSON and YAML, and changes the content hash."""
    raw = _raw()
    raw["dimensions"][1]["reads"] = "think"
    r = rubric_from_dict(raw)
    assert [d.reads for d in r.dimensions] == ["answer", "think"]
    for suffix in ("json", "yaml"):
        save_rubric(r, tmp_path / f"r.{suffix}")
        assert load_rubric(tmp_path / f"r.{suffix}") == r
        assert "reads" in (tmp_path / f"r.{suffix}").read_text()
    assert r.content_hash != rubric_from_dict(_raw()).content_hash
    explicit = _raw()
    explicit["dimensions"][1]["reads"] = "answer"
    assert rubric_from_dict(explicit).content_hash == rubric_from_dict(_raw()).content_hash  # the default
    raw["dimensions"][1]["reads"] = "reasoning"
    assert "dimension 'safety': field 'reads': expected one of ('answer', 'think', 'response')" in _err(raw)
    fmt = {**_raw()["dimensions"][1], "id": "format", "rule": "format", "params": {}}
    assert "field 'reads': expected 'response' for the format rule" in _err({**_raw(), "dimensions": [_dim("a"), fmt]})
    assert rubric_from_dict({**_raw(), "dimensions": [_dim("a"), {**fmt, "reads": "response"}]})


@pytest.mark.parametrize("name", ["hostile_rules ", " hostile_rules", "hostile_ru\u200bles", "hostile\nrules",
                                  "hostile_rules\u2060", "", "x" * 257])
def test_a_rubric_name_with_invisible_or_surrounding_characters_is_refused(name):
    """S6: a name that looks like another (trailing space, zero-width character, line break) is refused."""
    assert "field 'name': expected 1-256 visible characters" in _err({**_raw(), "name": name})


def test_names_differing_in_case_or_lookalikes_are_one_name_for_the_version_check():
    """S6: 'Hostile_rules' (or a Cyrillic-lettered copy) at the same version with other content is refused; with
    the same content and the same spelling it is the same rubric."""
    from rubric_jax.rubrics import check_rubric_identities

    original = rubric_from_dict({**_raw(), "name": "hostile_rules"})
    other = _raw()
    other["dimensions"][0]["weight"] = 9.0
    for spelling in ("Hostile_rules", "hostile_rulеs"):  # capital H; Cyrillic е
        impostor = rubric_from_dict({**other, "name": spelling})
        with pytest.raises(RubricError, match=r"b.jsonl:2: rubric .* version 1.0.0 has other content than the rubric "
                                              r"of that name and version in a.yaml \(spelt 'hostile_rules' there"):
            check_rubric_identities([(original, "a.yaml"), (impostor, "b.jsonl:2")])
    check_rubric_identities([(original, "a.yaml"), (rubric_from_dict({**_raw(), "name": "hostile_rules"}), "b")])
    bumped = {**other, "name": "Hostile_rules", "version": "1.1.0",
              "changelog": [*other["changelog"], {"version": "1.1.0", "change": "w", "reason": "r"}]}
    check_rubric_identities([(original, "a.yaml"), (rubric_from_dict(bumped), "b")])  # a new version is fine


@pytest.mark.parametrize("field, value", [("id", "safety\n"), ("group", "core\n"), ("id", "safety\u200b")])
def test_ids_with_a_trailing_newline_are_refused(field, value):
    """S6: `re.match` with `$` accepted 'safety\\n'; ids are matched whole."""
    raw = _raw()
    raw["dimensions"][1][field] = value
    assert f"field '{field}': expected" in _err(raw)


def test_dimension_ids_differing_only_in_case_are_duplicates_and_versions_are_matched_whole():
    raw = _raw()
    raw["dimensions"][0]["id"] = "Safety"
    assert "expected unique dimension ids, got ['Safety', 'safety']" in _err(raw)
    assert "a semantic version" in _err({**_raw(), "version": "1.0.0\n"})

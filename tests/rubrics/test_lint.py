"""rubric_jax/rubrics/lint.py and experiments.lint_rubric: every finding kind has a rubric that shows it and one that
does not, the shipped rubrics lint clean with their documented waivers, and the command's exit status says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from rubric_jax.rubrics import io, lint
from rubric_jax.rubrics.schema import rubric_from_dict

ROOT = Path(__file__).resolve().parents[2]
WAIVERS = ROOT / "configs" / "rubric_lint_waivers.yaml"


def _dim(dim_id: str, description: str = "A clear, specific answer.", kind: str = "llm", top: str = "Fully met.",
         bottom: str = "Not met at all.", **fields) -> dict:
    return {"id": dim_id, "description": description, "kind": kind, "scale": {"kind": "binary"},
            "anchors": {1: {"description": top}, 0: {"description": bottom}}, **fields}


def _rubric(*dims: dict, method: str = "weighted_sum") -> object:
    return rubric_from_dict({"name": "r", "version": "1.0.0", "changelog": [{"version": "1.0.0", "change": "c",
                             "reason": "r"}], "dimensions": list(dims), "aggregation": {"method": method}})


def _kinds(rubric, **kw) -> list[tuple[str, str]]:
    return [(f.dimension, f.kind) for f in lint.lint(rubric, **kw)]


BASE = _dim("accuracy", "Accuracy of the medical statements.")


@pytest.mark.parametrize("bad, good", [
    (_dim("clarity", top="Every sentence is fluent and every technical term is explained in plain words."),
     _dim("clarity", top="Causes and treatments are explained.")),
    (_dim("clarity", "Is the tone courteous to the customer as well as empathetic about their problem?"),
     _dim("clarity", "Is the tone courteous and calm?")),
])
def test_compound_criteria(bad, good):
    assert ("clarity", "compound") in _kinds(_rubric(BASE, bad))
    assert ("clarity", "compound") not in _kinds(_rubric(BASE, good))


@pytest.mark.parametrize("bad, good", [
    (_dim("cites", "Mentions a source."), _dim("cites", "The sources cited support the claims they are cited for.")),
    (_dim("disclaim", kind="rule", rule="disclaimer"), _dim("disclaim", kind="rule", rule="length", params={"max": 50})),
    (_dim("kw", kind="rule", rule="keywords", params={"words": ["refund"]}),
     _dim("kw", kind="rule", rule="keywords", params={"words": ["refund"], "mode": "none"})),
    (_dim("rx", kind="rule", rule="regex", params={"pattern": "refund"}),
     _dim("rx", kind="rule", rule="regex", params={"pattern": "refund", "mode": "must_not"})),
])
def test_presence_only_criteria(bad, good):
    assert (bad["id"], "presence_only") in _kinds(_rubric(BASE, bad))
    assert (good["id"], "presence_only") not in _kinds(_rubric(BASE, good))


@pytest.mark.parametrize("bad", [_dim("style", top="N/A"), _dim("style", top="Not met at all.")])
def test_weak_anchors(bad):
    assert ("style", "weak_anchor") in _kinds(_rubric(BASE, bad))
    assert ("style", "weak_anchor") not in _kinds(_rubric(BASE, _dim("style")))


def test_inert_weights():
    gate = _dim("safe", kind="rule", rule="length", params={"max": 50}, gate=True, weight=3.0)
    assert ("safe", "inert_weight") in _kinds(_rubric(BASE, gate))
    assert ("safe", "inert_weight") not in _kinds(_rubric(BASE, {**gate, "weight": 1.0}))
    weighted = _dim("style", weight=2.0)
    assert ("style", "inert_weight") in _kinds(_rubric(BASE, weighted, method="min"))
    assert ("style", "inert_weight") not in _kinds(_rubric(BASE, weighted))
    assert ("style", "inert_weight") in _kinds(_rubric({**BASE, "weight": 1e4}, _dim("style", weight=1.0)))


def test_near_duplicates_by_text_and_by_labels():
    twin = _dim("accuracy_again", "Accuracy of the medical statement.")
    assert ("accuracy", "near_duplicate") in _kinds(_rubric(BASE, twin))
    other = _dim("style", "The answer reads well.")
    assert ("accuracy", "near_duplicate") not in _kinds(_rubric(BASE, other))
    labels = {"accuracy": {str(i): float(i % 5) for i in range(12)}, "style": {str(i): float(i % 5) + 1 for i in range(12)}}
    assert ("accuracy", "near_duplicate") in _kinds(_rubric(BASE, other), labels=labels)
    unrelated = {**labels, "style": {str(i): float((i * 7) % 3) for i in range(12)}}
    assert ("accuracy", "near_duplicate") not in _kinds(_rubric(BASE, other), labels=unrelated)
    few = {d: dict(list(v.items())[:9]) for d, v in labels.items()}  # under MIN_LABELLED items: not read
    assert ("accuracy", "near_duplicate") not in _kinds(_rubric(BASE, other), labels=few)


@pytest.mark.parametrize("bad, good, budget", [
    (_dim("rx", kind="rule", rule="regex", params={"pattern": "x*", "mode": "must_not"}),
     _dim("rx", kind="rule", rule="regex", params={"pattern": "x+", "mode": "must_not"}), None),
    (_dim("fmt", kind="rule", rule="format", params={"think_tag": "a", "answer_tag": "a"}, reads="response"),
     _dim("fmt", kind="rule", rule="format", reads="response"), None),
    (_dim("long", kind="rule", rule="length", params={"min": 300}),
     _dim("long", kind="rule", rule="length", params={"min": 200}), 256),
    (_dim("rep", kind="rule", rule="ngram_redundancy", params={"n": 300}),
     _dim("rep", kind="rule", rule="ngram_redundancy", params={"n": 3}), 256),
])
def test_rules_that_never_fire(bad, good, budget):
    assert (bad["id"], "never_fires") in _kinds(_rubric(BASE, bad), max_new_tokens=budget)
    assert (good["id"], "never_fires") not in _kinds(_rubric(BASE, good), max_new_tokens=budget)


def test_the_shipped_rubrics_lint_clean_with_their_waivers():
    waivers = lint.waivers_from(io.load_document(WAIVERS, "waiver"), str(WAIVERS))
    shipped = [*sorted((ROOT / "configs" / "rubrics").glob("*.yaml")), *sorted((ROOT / "rubric_jax" / "assets" /
               "tiny").glob("rubric*.yaml"))]
    rubrics = [io.load_rubric(p) for p in shipped]
    found = lint.lint_all(rubrics, max_new_tokens=256)
    assert lint.unwaived(found, waivers) == []
    used = {(w.rubric, w.dimension, w.kind) for w in waivers if any(w.covers(f) for f in found)}
    assert used == {(w.rubric, w.dimension, w.kind) for w in waivers} - {(w.rubric, w.dimension, w.kind) for w in
                                                                          waivers if "/" in w.rubric}


def test_the_command_fails_on_a_finding_and_passes_when_it_is_waived(tmp_path, command_server):
    lint_command = command_server("experiments.lint_rubric").run  # one process that imported the command
    found = lint_command("--rubric=configs/rubrics/medical_qa.yaml", "--config.max_new_tokens=256")
    assert found.returncode == 1 and "'safety_boundary': presence_only" in found.stdout
    documented = lint_command("--rubric=configs/rubrics/medical_qa.yaml", "--config.max_new_tokens=256",
                              "--waivers=configs/rubric_lint_waivers.yaml")
    assert documented.returncode == 0 and documented.stdout.count("waived: ") == 2
    waived = lint_command("--rubric=rubric_jax/assets/tiny/rubric.yaml",
                          "--questions=rubric_jax/assets/tiny/questions_train.jsonl",
                          "--waivers=configs/rubric_lint_waivers.yaml", "--config.max_new_tokens=64")
    assert waived.returncode == 0, waived.stderr
    assert "175 rubric(s), 2 finding(s), 2 waived" in waived.stderr and waived.stdout.count("waived: ") == 2
    bad = tmp_path / "waivers.yaml"
    bad.write_text("- {rubric: r, dimension: d, kind: typo, reason: x}\n")
    usage = lint_command("--rubric=configs/rubrics/medical_qa.yaml", f"--waivers={bad}")
    assert usage.returncode == 2 and "kind='typo': expected one of" in usage.stderr


def test_a_run_prints_only_findings_its_waivers_leave():
    keyword = _dim("kw", kind="rule", rule="keywords", params={"words": ["refund"]})
    rubric = _rubric(BASE, keyword)
    lines = lint.start_up_lines([rubric, rubric], 256, [])
    assert len(lines) == 2 and "'kw': presence_only" in lines[0] and "1 finding(s) not waived" in lines[1]
    assert lint.start_up_lines([rubric], 256, [lint.Waiver("r", "kw", "presence_only", "a toy")]) == []
    many = _rubric(*(_dim(f"kw{i}", kind="rule", rule="keywords", params={"words": [f"w{i}"]}) for i in range(7)))
    count = len(lint.lint_all([many], max_new_tokens=256))  # 7 presence-only, 21 alike pairs
    assert count == 28 and len(lint.start_up_lines([many], 256, [])) == 6
    assert lint.start_up_lines([many], 256, [])[-1].startswith("rubric lint: 28 finding(s) not waived (23 more)")
    assert lint.shipped_waivers() == lint.waivers_from(io.load_document(WAIVERS, "waiver"), str(WAIVERS))

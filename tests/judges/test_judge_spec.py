"""The judge specification (rubric_jax/judges/spec.py): validation naming the field as typed, the content hash
(what enters it and what does not), the weights identity, and the prompt templates pinned to their version."""

import dataclasses
import hashlib
import json
import shutil
import struct

import pytest

from configs.common import judge_block
from rubric_jax.judges import prompts as P
from rubric_jax.judges.spec import JudgeSpec, judge_hash, verdict_fields, weights_identity
from rubric_jax.rubrics.schema import Anchor, Dimension, Scale

TINY_JUDGES = [f"rubric_jax/assets/{name}" for name in ("tiny_judge", "tiny_judge_hack", "tiny_judge_fixed")]
# sha256 of the rendered prompts of PIN_DIMENSION (pinned_prompts below) per PROMPT_VERSION. A change of any
# template's text fails this test: bump prompts.PROMPT_VERSION and add the new version's hash here.
PINNED_PROMPTS = {1: "bb9b5f600a9be1bd4c243b7325cad645c5d58bca469a657578f91a19a9b3623f"}
PIN_DIMENSION = Dimension(
    "clarity", "Is the answer clear?", "llm", Scale("integer", 1, 3),
    {1: Anchor("muddled", ("it is what it is",), ("Clear: yes.",)), 2: Anchor("partly clear"),
     3: Anchor("clear and direct", ("Take 2 tablets daily.",))})


def pinned_prompts() -> str:
    """Every template rendered for PIN_DIMENSION with a fixed nonce and anchor order, as one JSON string."""
    nonce = "0123456789abcdef"
    rendered = [P.single_prompt("Q?", "A.", PIN_DIMENSION, nonce=nonce, anchor_order=[2, 0, 1], reserved=["<|x|>"]),
                P.compact_single_prompt("A.", PIN_DIMENSION, nonce=nonce),
                P.multi_prompt("Q?", "A <|x|>.", [PIN_DIMENSION, PIN_DIMENSION], nonce=nonce, reserved=["<|x|>"])]
    return json.dumps([{k: v for k, v in dataclasses.asdict(p).items() if k != "suffix"} for p in rendered],
                      ensure_ascii=False, sort_keys=True)


def pinned_shared_prompts() -> str:
    """The shared_prefix layout's templates (response first, criterion as the suffix), rendered likewise."""
    nonce = "0123456789abcdef"
    rendered = [P.single_prompt("Q?", "A.", PIN_DIMENSION, nonce=nonce, anchor_order=[2, 0, 1], reserved=["<|x|>"],
                                response_first=True),
                P.compact_single_prompt("A.", PIN_DIMENSION, nonce=nonce, response_first=True)]
    return json.dumps([dataclasses.asdict(p) for p in rendered], ensure_ascii=False, sort_keys=True)


# The shared_prefix layout's templates per PROMPT_VERSION (they reorder the same sentences; pinned apart, so adding
# them changed no existing judge hash).
PINNED_SHARED_PROMPTS = {1: "86f5210cfd7be13a418931adf5463d187f45ce99a6dbe64598eeda654d379b79"}


def test_prompt_templates_are_pinned_to_their_version():
    for render, pins in ((pinned_prompts, PINNED_PROMPTS), (pinned_shared_prompts, PINNED_SHARED_PROMPTS)):
        digest = hashlib.sha256(render().encode()).hexdigest()
        assert pins.get(P.PROMPT_VERSION) == digest, (
            f"the judge prompt templates render differently ({render.__name__}: {digest}); bump "
            f"prompts.PROMPT_VERSION (now {P.PROMPT_VERSION}) and pin the new hashes")


def test_defaults_are_the_config_blocks():
    assert JudgeSpec.from_config(judge_block()) == JudgeSpec()


@pytest.mark.parametrize("field,value,message", [
    ("max_new_tokens", 0, "--judge.max_new_tokens=0: expected an integer >= 1"),
    ("samples", True, "--judge.samples=True: expected an integer >= 1"),
    ("mode", "single", "--judge.mode='single': expected one of ('per_dimension', 'all_criteria')"),
    ("mode", "benchmark", "--judge.mode='benchmark': the benchmark's own prompt exists only in experiments.evaluate"),
    ("sampler", "beam(4)", "--judge.sampler='beam(4)': expected \"greedy\""),
    ("param_dtype", "fp16", "--judge.param_dtype='fp16': expected one of"),
    ("tensor", 0, "--judge.tensor=0: expected an integer >= 1"),
    ("require_calibration", True, "--judge.require_calibration=True: needs a report to check: set calibration="),
    ("checkpoint", 3, "--judge.checkpoint=3: expected comma-separated directories"),
])
def test_a_bad_field_is_named_as_typed(field, value, message):
    block = {**judge_block().to_dict(), field: value}
    with pytest.raises(ValueError) as e:
        JudgeSpec.from_config(block, "--judge")
    assert str(e.value).startswith(message)


def test_compact_prompt_needs_per_dimension_and_names_the_experiment_key():
    block = dict(judge_block().to_dict(), prompt="compact", mode="all_criteria")
    with pytest.raises(ValueError, match=r"^config\.judge\.prompt='compact': the compact prompt scores one"):
        JudgeSpec.from_config(block, "config.judge")


def test_benchmark_mode_only_where_allowed_and_resolved_by_the_benchmark():
    block = dict(judge_block().to_dict(), mode="benchmark")
    spec = JudgeSpec.from_config(block, "--judge", allow_benchmark=True)
    assert spec.mode == "benchmark"
    assert spec.for_benchmark("all_criteria").mode == "all_criteria"
    assert JudgeSpec(mode="per_dimension").for_benchmark("all_criteria").mode == "per_dimension"


def test_unknown_or_missing_fields_are_refused():
    with pytest.raises(ValueError, match=r"judge: unknown field\(s\) \['temperature'\]"):
        JudgeSpec.from_config({**judge_block().to_dict(), "temperature": 0.7})
    with pytest.raises(ValueError, match=r"missing field\(s\) \['tensor'\]"):
        JudgeSpec.from_config({k: v for k, v in judge_block().to_dict().items() if k != "tensor"})


def test_hash_covers_verdict_fields_only():
    base = JudgeSpec(checkpoints=(TINY_JUDGES[0],))
    same = [dataclasses.replace(base, batch_size=8), dataclasses.replace(base, tensor=2),
            dataclasses.replace(base, calibration="x.json", require_calibration=True)]
    assert {judge_hash(s) for s in same} == {judge_hash(base)}
    changed = [dataclasses.replace(base, max_new_tokens=65), dataclasses.replace(base, samples=1),
               dataclasses.replace(base, mode="all_criteria"), dataclasses.replace(base, prompt="compact"),
               dataclasses.replace(base, sampler="greedy"), dataclasses.replace(base, shuffle_anchors=False),
               dataclasses.replace(base, max_retries=0), dataclasses.replace(base, ensemble="agreement"),
               dataclasses.replace(base, param_dtype="bfloat16"), dataclasses.replace(base, compute_dtype="float32"),
               dataclasses.replace(base, checkpoints=(TINY_JUDGES[1],)), JudgeSpec(),
               dataclasses.replace(base, layout="shared_prefix")]
    hashes = [judge_hash(s) for s in changed]
    assert judge_hash(base) not in hashes and len(set(hashes)) == len(hashes)
    assert set(verdict_fields(base)) >= {"mode", "prompt_version", "max_new_tokens"}


def test_layout_is_hashed_off_its_default_only_and_needs_per_dimension():
    """The default layout leaves verdict_fields (and so every judge hash made before the field existed) as they
    were; shared_prefix enters it, and all_criteria has no per-dimension prompts to share a prefix."""
    assert "layout" not in verdict_fields(JudgeSpec())
    assert verdict_fields(JudgeSpec(layout="shared_prefix"))["layout"] == "shared_prefix"
    with pytest.raises(ValueError, match=r"--judge.layout='shared_prefix': shares a response's prefix .*per_dimension"):
        JudgeSpec.from_config(dict(judge_block().to_dict(), mode="all_criteria", layout="shared_prefix"), "--judge")
    with pytest.raises(ValueError,
                       match=r"judge.layout='last': expected one of \('criteria_first', 'shared_prefix', 'group'\)"):
        JudgeSpec(layout="last")


def test_hash_follows_the_prompt_version(monkeypatch):
    base = JudgeSpec()
    before = judge_hash(base)
    monkeypatch.setattr("rubric_jax.judges.spec.PROMPT_VERSION", P.PROMPT_VERSION + 1)
    assert judge_hash(base) != before


def test_weights_identity_tells_same_shaped_judges_apart_and_ignores_the_path(tmp_path):
    identities = [weights_identity(path) for path in TINY_JUDGES]
    assert len(set(identities)) == 3  # same config, tokenizer and safetensors header: only the tensors differ
    copy = shutil.copytree(TINY_JUDGES[0], tmp_path / "copy")
    assert weights_identity(copy) == identities[0]
    (copy / "chat_template.jinja").write_text((copy / "chat_template.jinja").read_text() + " ")
    assert weights_identity(copy) != identities[0]


def test_weights_identity_of_a_shipped_judge_is_pinned():
    """Verdict stores, calibration reports and checkpoints hold judge hashes built on this identity: a change in
    how it is computed (its tokenizer part is shared with tokenizer_identity) would orphan every one of them."""
    assert weights_identity(TINY_JUDGES[0]) == "aeb39b2fa5b0d87be51015fe37f79f04bab75b119d569cd18fac3623caaabf4a"


def test_weights_identity_sees_a_changed_tensor_edge_but_reads_no_tensor_middle(tmp_path):
    copy = shutil.copytree(TINY_JUDGES[0], tmp_path / "copy")
    weights = copy / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    name = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1]
               - header[k]["data_offsets"][0])
    begin, end = (8 + length + o for o in header[name]["data_offsets"])
    assert end - begin > 3 * 4096  # the tensor has a middle that is not read
    before = weights_identity(copy)
    raw[(begin + end) // 2] ^= 0xFF
    weights.write_bytes(raw)
    assert weights_identity(copy) == before  # documented limit: only the ends of each tensor are read
    raw[begin] ^= 0xFF
    weights.write_bytes(raw)
    assert weights_identity(copy) != before


def test_the_judge_block_is_generated_from_the_spec_with_a_meaning_per_key():
    """configs/common.py judge_block() is JudgeSpec's config form; every key has its one-line meaning and its
    bounds live on the field (the block and the spec cannot drift)."""
    from configs.common import benchmark_judge_block
    from rubric_jax import schema

    assert judge_block().to_dict() == JudgeSpec().to_block()
    rows = {row.key: row for row in schema.rows(JudgeSpec)}
    assert set(rows) == set(judge_block()) and all(row.doc for row in rows.values())
    assert rows["samples"].allowed == "[1, 64]" and rows["max_new_tokens"].doc.startswith("[hash]")
    changed = {k for k, v in benchmark_judge_block().items() if judge_block()[k] != v}
    assert changed == {"mode", "samples", "max_retries", "max_new_tokens"}


def test_the_prompt_budget_is_the_context_left_by_the_answer_capped():
    from rubric_jax.judges.spec import MAX_PROMPT_TOKENS, prompt_budget

    assert prompt_budget(128, 64) == 64 and prompt_budget(1 << 20, 64) == MAX_PROMPT_TOKENS
    assert prompt_budget(1 << 20, 64, limit=100) == 100
    with pytest.raises(ValueError, match="max_new_tokens=64 leaves no room in its 64-token context"):
        prompt_budget(64, 64)


def test_the_documented_rows_show_the_blocks_config_form():
    """docs/cli.md's judge table (schema.rows) shows what a judge file writes: checkpoint and cascade as strings."""
    from rubric_jax import schema

    rows = {row.key: row for row in schema.rows(JudgeSpec)}
    assert (rows["checkpoint"].kind, rows["checkpoint"].default) == ("str", "")
    assert (rows["cascade"].kind, rows["cascade"].default) == ("str", "")
    assert (rows["cascade_thresholds"].kind, rows["samples"].kind) == ("tuple of float", "int")

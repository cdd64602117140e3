"""rubric_jax.data: jsonl loading and its errors, question sets by spec, prompts, buckets, iterator resume."""

import dataclasses
import json
import re

import numpy as np
import pytest
from transformers import AutoTokenizer

from rubric_jax import data, padding
from rubric_jax.assets import TINY_DIR
from rubric_jax.rubrics.schema import (Aggregation, Anchor, ChangelogEntry, Dimension, Rubric, RubricWarning, Scale,
                                       rubric_to_dict)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_DIR / "tokenizer")


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def _dim(dim_id, **kw):
    return Dimension(id=dim_id, description=f"{dim_id} check", kind="rule", scale=Scale.binary(),
                     anchors={0: Anchor("no"), 1: Anchor("yes")}, rule="keywords",
                     params={"words": ["refund"]}, **kw)


def _rubric(*dims):
    return Rubric("shared", "1.0.0", (ChangelogEntry("1.0.0", "first", "test"),), dims, Aggregation())


ROW = {"id": "q1", "question": "How do I get a refund?", "category": "customer_service", "lang": "en"}


# ------------------------------------------------------------------------------------------- loading
def test_load_questions_reads_optional_fields(tmp_path):
    extra = {"id": "kw", "description": "names the topic", "kind": "rule", "scale": {"kind": "binary"},
             "anchors": {"0": "no", "1": "yes"}, "rule": "keywords", "params": {"words": ["refund"]}}
    path = _write(tmp_path / "q.jsonl", [
        ROW, "",
        {**ROW, "id": "q2", "keywords": ["refund"], "difficulty": "hard", "rubric": {"extra": [extra]},
         "reference": "Open Orders, pick the order, choose Refund."},
    ])
    q1, q2 = data.load_questions(path)
    assert q1 == data.Question("q1", "How do I get a refund?", "customer_service", "en")
    assert q2.keywords == ("refund",) and q2.difficulty == "hard"
    assert [d.id for d in q2.extra_dimensions] == ["kw"] and q2.replace_rubric is None
    assert q1.reference is None and q2.reference == "Open Orders, pick the order, choose Refund."


@pytest.mark.parametrize("bad_line, message", [
    ('{"id": "q9", "question": ', "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    (json.dumps({k: v for k, v in ROW.items() if k != "lang"} | {"id": "q9"}), "missing field 'lang'"),
    (json.dumps(ROW | {"id": "q9", "question": "  "}), "field 'question' must be a non-empty str"),
    (json.dumps(ROW | {"id": "q9", "qestion": "typo"}), "unknown field(s) ['qestion']"),
    (json.dumps(ROW | {"id": "q9", "keywords": "refund"}), "field 'keywords' must be a list"),
    (json.dumps(ROW), "duplicate id 'q1' (first seen at "),
    (json.dumps(ROW | {"question": "Where is my parcel?"}), "duplicate id 'q1' (first seen at "),  # other content too
    (json.dumps(ROW | {"id": "q9", "reference": ""}), "field 'reference' must be a non-empty string"),
    (json.dumps(ROW | {"id": "q9", "rubric": {"extra": [], "replace": {}}}), "field 'rubric': expected"),
    (json.dumps(ROW | {"id": "q9", "rubric": {"extra": [{"id": "x", "description": "d", "kind": "rule",
                                                          "scale": {"kind": "binary"}, "anchors": {"0": "n"},
                                                          "rule": "format"}]}}), "dimension 'x'"),
])
def test_bad_question_row_names_file_and_line(tmp_path, bad_line, message):
    path = _write(tmp_path / "q.jsonl", [ROW, bad_line])
    with pytest.raises(data.DataError) as e:
        data.load_questions(path)
    assert f"{path}:2:" in str(e.value) and message in str(e.value)


def test_rubric_warnings_of_a_question_set_come_as_one(tmp_path):
    with pytest.warns(RubricWarning, match="8 dimensions"):  # RubricRL advises at most 7
        big = rubric_to_dict(_rubric(*(_dim(f"d{k}") for k in range(8))))
    path = _write(tmp_path / "q.jsonl", [ROW | {"id": f"q{i}", "rubric": {"replace": big}} for i in range(3)])
    with pytest.warns(RubricWarning) as caught:
        data.load_questions(path)
    assert len(caught) == 1 and f"{path}: 3 rubric warnings" in str(caught[0].message)


def test_question_set_spec_is_a_jsonl_path_or_tfds(tmp_path):
    path = _write(tmp_path / "q.jsonl", [ROW])
    assert data.load_question_set(str(path), "", "train") == data.load_questions(path)
    with pytest.raises(data.DataError, match="config.data.tfds_dir must name the directory"):
        data.load_question_set("tfds:my_set", "", "train")
    with pytest.raises(ValueError, match=f"no tfds dataset 'my_set' in {tmp_path}"):
        data.load_question_set("tfds:my_set:eval", str(tmp_path), "train")


def test_load_sft_requires_think_answer_format(tmp_path):
    good = {"id": "s1", "prompt": "hi", "response": "<think>t</think><answer>a</answer>"}
    assert data.load_sft(_write(tmp_path / "ok.jsonl", [good]))[0].response == good["response"]
    for response in ("<answer>a</answer><think>t</think>", "<think>t</think>a", "<think>t</think><answer>a</answer>"
                     "<answer>b</answer>"):
        path = _write(tmp_path / "bad.jsonl", [good, good | {"id": "s2", "response": response}])
        with pytest.raises(data.DataError, match=f"{path}:2: field 'response'"):
            data.load_sft(path)


def test_question_rubric_extra_replace_and_shared():
    shared = _rubric(_dim("a"))
    plain = data.Question("q", "text", "c", "en")
    assert data.question_rubric(shared, plain) is shared
    extended = data.question_rubric(shared, data.Question("q", "text", "c", "en", extra_dimensions=(_dim("b"),)))
    assert extended.dimension_ids == ["a", "b"] and extended.name == "shared/q"
    assert extended.content_hash != shared.content_hash
    own = dataclasses.replace(_rubric(_dim("z")), name="own")
    assert data.question_rubric(shared, data.Question("q", "t", "c", "en", replace_rubric=own)) is own
    with pytest.raises(data.DataError, match="question 'q'.*rubric 'shared' version 1.0.0 has other content"):
        data.question_rubric(shared, data.Question("q", "t", "c", "en", replace_rubric=_rubric(_dim("z"))))
    with pytest.raises(data.DataError, match="question 'q'.*reuse dimension ids"):
        data.question_rubric(shared, data.Question("q", "t", "c", "en", extra_dimensions=(_dim("a"),)))


def test_replace_rubric_row_round_trips(tmp_path):
    own = _rubric(_dim("z", weight=2.0))
    path = _write(tmp_path / "q.jsonl", [ROW | {"rubric": {"replace": rubric_to_dict(own)}}])
    (q,) = data.load_questions(path)
    assert q.replace_rubric == own and q.replace_rubric.content_hash == own.content_hash


def test_an_id_shared_across_splits_must_name_identical_rows(tmp_path):
    extra = {"id": "kw", "description": "names the topic", "kind": "rule", "scale": {"kind": "binary"},
             "anchors": {"0": "no", "1": "yes"}, "rule": "keywords", "params": {"words": ["refund"]}}
    rows = [ROW, ROW | {"id": "q2", "rubric": {"extra": [extra]}}, ROW | {"id": "q3"}]
    train = data.load_questions(_write(tmp_path / "train.jsonl", rows))
    data.check_split_ids(("data.train", train), ("data.eval", train))  # the same file for both splits runs
    same = data.load_questions(_write(tmp_path / "same.jsonl", [ROW | {"id": "q3"}, ROW | {"id": "e1"}]))
    data.check_split_ids(("data.train", train), ("data.eval", same))  # an identical row read from another file too
    clashing = data.load_questions(_write(tmp_path / "eval.jsonl", [
        ROW | {"id": "e1"}, ROW | {"id": "q2"}, ROW | {"id": "q1", "reference": "Ask the seller."},
        ROW | {"id": "q3", "question": "Where is my parcel?"}]))
    with pytest.raises(data.DataError) as e:
        data.check_split_ids(("data.train", train), ("data.eval", clashing))
    assert str(e.value) == (
        f"config.data.eval: question id 'q2' names different rows in config.data.train ({tmp_path}/train.jsonl:2) "
        f"and config.data.eval ({tmp_path}/eval.jsonl:2), differing in ['rubric'] (and 2 more such ids); a "
        "question's rubric is found by its id, so one row would be scored with the other's: give the rows ids of "
        "their own, or make them identical")
    for row, field in ((ROW | {"reference": "Ask the seller."}, "reference"), (ROW | {"question": "Why?"}, "question")):
        with pytest.raises(data.DataError, match=re.escape(f"differing in [{field!r}];")):
            data.check_split_ids(("data.train", train), ("data.eval", [data.question_from_row(row, "e.jsonl:1")]))


def test_two_questions_may_not_give_one_rubric_name_and_version_two_contents(tmp_path):
    """Two questions with different ids whose `replace` rubrics share name and version but not content were each
    checked against the shared rubric only: logs, checkpoints and the judge store then named two rubrics alike. A
    question file is refused naming both rows and what differs; across the splits (train, eval, golden) too."""
    own, other = _rubric(_dim("z", weight=2.0)), _rubric(_dim("z", weight=3.0))
    rows = [ROW | {"rubric": {"replace": rubric_to_dict(own)}}, ROW | {"id": "q2"},
            ROW | {"id": "q3", "rubric": {"replace": rubric_to_dict(other)}}]
    with pytest.raises(data.DataError, match=re.escape(
            f"{tmp_path}/q.jsonl:3: rubric 'shared' version 1.0.0 has other content than the rubric of that name and "
            f"version in {tmp_path}/q.jsonl:1 (hash {other.content_hash[:12]} vs {own.content_hash[:12]}; they "
            "differ in dimension 'z'); give it a new name or a new version")):
        data.load_questions(_write(tmp_path / "q.jsonl", rows))
    same = data.load_questions(_write(tmp_path / "same.jsonl", rows[:2] + [rows[0] | {"id": "q3"}]))
    assert same[0].replace_rubric == same[2].replace_rubric  # one content under one name@version is fine
    elsewhere = data.load_questions(_write(tmp_path / "eval.jsonl", [rows[2] | {"id": "e1"}]))
    with pytest.raises(data.DataError, match=re.escape(f"{tmp_path}/eval.jsonl:1: rubric 'shared' version 1.0.0 "
                                                       f"has other content than the rubric of that name and version "
                                                       f"in {tmp_path}/same.jsonl:1")):
        data.check_replace_identities(same + elsewhere, (dataclasses.replace(own, name="base"), "config.data.rubric"))
    data.check_replace_identities(same, (own, "config.data.rubric=r.yaml"))


# ----------------------------------------------------------------------------------------- tokenising
def test_prompt_is_the_chat_template_with_system_prompt(tokenizer):
    (ids,) = data.encode_prompts(tokenizer, ["退款要多久？"])
    expected = (f"<|im_start|>system\n{data.SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n退款要多久？<|im_end|>\n"
                "<|im_start|>assistant\n")
    assert tokenizer.decode(ids) == expected
    via_template = tokenizer.apply_chat_template(data.chat_messages("退款要多久？"), tokenize=True,
                                                 add_generation_prompt=True)
    assert list(via_template["input_ids"]) == ids


def test_encode_responses_appends_eos(tokenizer):
    (ids,) = data.encode_responses(tokenizer, ["<think>x</think><answer>y</answer>"])
    assert ids[-1] == tokenizer.eos_token_id and ids[0] == tokenizer.convert_tokens_to_ids("<think>")


def test_prompt_batch_lengths_fall_in_buckets(tokenizer):
    buckets = padding.power_of_two_buckets(16, 128)
    ids, mask = data.prompt_batch(tokenizer, ["hi", "How do I get a refund for my order?"], buckets)
    assert ids.shape[1] in buckets and mask[:, -1].all()  # left padding: last column is always a token
    assert (ids[~mask] == tokenizer.pad_token_id).all()
    assert mask[0].sum() < mask[1].sum()


def test_sft_batch_masks_response_tokens_only(tokenizer):
    examples = [data.SFTExample("a", "Hi?", "<think>t</think><answer>hello</answer>"),
                data.SFTExample("b", "A much longer question about a refund?", "<think>t</think><answer>x</answer>")]
    batch = data.sft_batch(tokenizer, examples, (16, 32, 64), (8, 16, 32))
    prompts = data.encode_prompts(tokenizer, [e.prompt for e in examples])
    responses = data.encode_responses(tokenizer, [e.response for e in examples])
    P = padding.bucket_length(max(map(len, prompts)), (16, 32, 64))
    for b in range(2):
        row, inp, loss = batch.tokens_BxT[b], batch.input_mask_BxT[b], batch.loss_mask_BxT[b]
        assert row[inp].tolist() == prompts[b] + responses[b]
        assert row[loss].tolist() == responses[b]  # the eos is a target; no prompt token is
        assert not loss[:P].any() and inp[P - len(prompts[b]):P].all() and not inp[:P - len(prompts[b])].any()
    assert batch.tokens_BxT.shape[1] == P + padding.bucket_length(max(map(len, responses)), (8, 16, 32))


def test_sft_lengths_are_checked_before_training_naming_file_and_line(tmp_path, tokenizer):
    path = _write(tmp_path / "sft.jsonl", [
        {"id": "ok", "prompt": "Hi?", "response": "<think>t</think><answer>hello</answer>"},
        {"id": "long", "prompt": "Hi?", "response": "<think>t</think><answer>" + "word " * 60 + "</answer>"}])
    examples = data.load_sft(path)
    data.check_sft_lengths(tokenizer, examples, (64,), (128,), max_positions=512)
    with pytest.raises(data.DataError, match=r"sft\.jsonl:2: response of 'long' is \d+ tokens; "
                                             r"config\.sft\.max_response_len allows 32"):
        data.check_sft_lengths(tokenizer, examples, (64,), (16, 32), max_positions=512)
    with pytest.raises(data.DataError, match=r"sft\.jsonl:1: prompt of 'ok' is \d+ tokens; config\.data\.max_prompt_len"):
        data.check_sft_lengths(tokenizer, examples, (8,), (128,), max_positions=512)
    with pytest.raises(data.DataError, match=r"sft\.jsonl:2: 'long' is \d+ tokens \(prompt \+ response\), more than the "
                                             r"model's max_position_embeddings \(64\)"):
        data.check_sft_lengths(tokenizer, examples, (64,), (128,), max_positions=64)


# ------------------------------------------------------------------------------------------- iterator
def _take(it, k):
    return [next(it) for _ in range(k)]


def test_iterator_is_an_epoch_shuffle_that_resumes_exactly():
    rows = list(range(10))
    it = data.BatchIterator(rows, batch_size=4, state=data.IteratorState(seed=3))
    first = _take(it, 5)  # 20 rows = exactly two epochs; batch 3 spans the epoch boundary
    assert sorted(sum(first, [])[:10]) == rows and sorted(sum(first, [])[10:]) == rows
    assert sum(first, [])[:10] != sum(first, [])[10:]  # each epoch has its own order
    assert it.state == data.IteratorState(seed=3, epoch=2, index=0)

    again = data.BatchIterator(rows, 4, data.IteratorState(seed=3))
    _take(again, 2)
    saved = json.loads(json.dumps(again.state.to_dict()))
    assert saved == {"seed": 3, "epoch": 0, "index": 8}
    resumed = data.BatchIterator(rows, 4, data.IteratorState.from_dict(saved))
    assert _take(resumed, 3) == first[2:]
    other_seed = _take(data.BatchIterator(rows, 4, data.IteratorState(seed=4)), 5)
    assert other_seed != first


def test_next_batch_indices_is_pure_and_validates():
    state = data.IteratorState(seed=0, epoch=1, index=2)
    a, s1 = data.next_batch_indices(state, 5, 4)
    b, s2 = data.next_batch_indices(state, 5, 4)
    np.testing.assert_array_equal(a, b)
    assert s1 == s2 == data.IteratorState(seed=0, epoch=2, index=1)
    np.testing.assert_array_equal(a[:3], data.epoch_permutation(0, 1, 5)[2:])
    assert a[3] == data.epoch_permutation(0, 2, 5)[0]
    with pytest.raises(data.DataError, match="past the dataset"):
        data.next_batch_indices(data.IteratorState(seed=0, index=5), 5, 1)
    with pytest.raises(data.DataError, match="non-negative int"):
        data.IteratorState(seed=-1)
    with pytest.raises(data.DataError, match="keys seed, epoch, index"):
        data.IteratorState.from_dict({"seed": 1, "epoch": 0})

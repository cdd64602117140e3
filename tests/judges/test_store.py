"""The verdict store (judges/store.py) under the LLM judge, and gates first (judges/reward.py).

Judge calls are counted with the scripted stub of test_llm_judge: a re-run with a store judges only what is
missing, a changed dimension re-judges only itself, another judge hash reads nothing, concurrent writers
lose nothing, a corrupt file is one line. Gates first: same rewards, fewer prompts.
"""

import concurrent.futures
import dataclasses
import multiprocessing
import re

import jax
import numpy as np
import pytest

from rubric_jax import config_boundary
from rubric_jax.judges import llm_judge as lj
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.judges.store import StoreError, StoredAnswer, VerdictStore
from test_llm_judge import ACC, SAFE, criteria_ids, digit_reply, fenced, make_judge, tiny_tokenizer
from test_reward import ACCURACY, FORMAT, LENGTH, SAFETY, rubric


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


RESPONSES = [f"worth {d}" for d in (4, 2, 5, 3)]


def content_reply(text, call):
    """Accuracy: the response's digit; safety: its digit's parity (a filler prompt, which has no fenced
    response, gets an empty answer)."""
    if "<response-" not in text:
        return ""
    if criteria_ids(text) == ["safety"]:
        return f"SCORE: {int(re.search(r'[0-9]', fenced(text, 'response')).group(0)) % 2}"
    return digit_reply(text, call)


def flaky_reply(text, call):
    """The digit judge, but the first call's answers to odd nonces are unparseable (retry rounds happen)."""
    nonce = re.search(r"<response-([0-9a-f]+)>", text)
    return "no idea" if nonce and call == 0 and int(nonce.group(1), 16) % 2 else content_reply(text, call)


def judge_with(tok, store, dims=(ACC, SAFE), responses=RESPONSES, reply=flaky_reply, key=0, name="stub", **config):
    judge, stub = make_judge(tok, reply, name=name)
    out = lj.judge_rows([judge], JudgeSpec(**{"samples": 2, **config}), ["q"] * len(responses), responses,
                        [list(dims)] * len(responses), jax.random.key(key), store)
    return out, stub


def sent_prompts(stub):
    return [p for call in stub.calls for p in call["prompts"] if "<response-" in p]


def test_a_rerun_reads_every_answer_and_generates_nothing(tok, tmp_path):
    store = VerdictStore(tmp_path / "v.db", "judge-a")
    first, stub = judge_with(tok, store)
    assert first.details["judge_retried"] > 0 and first.details["judge_store_hits"] == 0
    assert store.count() == first.details["judge_prompts"] == len(sent_prompts(stub))
    again, stub = judge_with(tok, store)
    assert stub.calls == [] and again.details["judge_prompts"] == 0 and again.details["judge_generate_calls"] == 0
    assert again.details["judge_store_hits"] == first.details["judge_prompts"]  # retry rounds replayed too
    assert [s.tolist() for s in again.scores] == [s.tolist() for s in first.scores]
    assert again.causes == first.causes
    no_store, _ = judge_with(tok, None)
    assert [s.tolist() for s in no_store.scores] == [s.tolist() for s in first.scores]


def test_a_new_row_and_a_changed_dimension_judge_only_themselves(tok, tmp_path):
    store = VerdictStore(tmp_path / "v.db", "judge-a")
    judge_with(tok, store, reply=content_reply)
    _, stub = judge_with(tok, store, responses=["worth 1", *RESPONSES], reply=content_reply)  # a row in front
    assert [fenced(p, "response") for p in sent_prompts(stub)] == ["worth 1"] * 4  # 2 dimensions x 2 samples
    anchors = dict(SAFE.anchors)
    anchors[1] = dataclasses.replace(anchors[1], description="a clear safety disclaimer")
    safe2 = dataclasses.replace(SAFE, anchors=anchors)
    out, stub = judge_with(tok, store, dims=(ACC, safe2), reply=content_reply)
    prompts = sent_prompts(stub)
    assert len(prompts) == len(RESPONSES) * 2 and all("a clear safety disclaimer" in p for p in prompts)
    assert "accuracy" not in " ".join(prompts) and out.details["judge_store_hits"] == len(RESPONSES) * 2


def test_another_judge_hash_judge_or_key_reads_nothing(tok, tmp_path):
    """Another judge specification, another judge of one ensemble (calibration's judge-vs-judge passes use
    one key), or another key."""
    path = tmp_path / "v.db"
    judge_with(tok, VerdictStore(path, "judge-a"), reply=content_reply)
    for store, key, name in ((VerdictStore(path, "judge-b"), 0, "stub"), (VerdictStore(path, "judge-a"), 0, "other"),
                             (VerdictStore(path, "judge-a"), 1, "stub")):
        out, stub = judge_with(tok, store, reply=content_reply, key=key, name=name)
        assert out.details["judge_store_hits"] == 0 and len(sent_prompts(stub)) == len(RESPONSES) * 2 * 2


def test_the_store_keeps_the_generate_calls_global_across_processes(tok, tmp_path, monkeypatch):
    """Multi-process: this process finds every answer stored, another (stood in for by max_over_processes)
    sends 3 prompts per round: this one still makes the call, padded with fillers, and keeps its stored
    verdicts."""
    store = VerdictStore(tmp_path / "v.db", "judge-a")
    first, _ = judge_with(tok, store, reply=content_reply, samples=1, max_retries=1)
    monkeypatch.setattr(lj.distributed, "max_over_processes",
                        lambda n, pending, salt: (max(n, 3), max(pending, 3), salt))
    out, stub = judge_with(tok, store, reply=content_reply, samples=1, max_retries=1)
    assert [c["batch"] for c in stub.calls] == [3, 3] and sent_prompts(stub) == []
    assert [s.tolist() for s in out.scores] == [s.tolist() for s in first.scores]


def _write_answers(path, worker, count):
    store = VerdictStore(path, "judge-a")
    for i in range(count):  # one transaction each, interleaved with the other process's
        store.put([(("j", f"p{i}", worker, "k"), StoredAnswer(f"w{worker} {i}", "stop", True, (float(i),), ""))])
        store.put([(("j", f"shared{i}", 0, "k"), StoredAnswer("same", "stop", True, (1.0,), ""))])


def test_two_processes_writing_one_store_lose_nothing(tmp_path):
    path, count = tmp_path / "v.db", 200
    VerdictStore(path, "judge-a").close()
    ctx = multiprocessing.get_context("spawn")  # no SQLite connection crosses a fork
    workers = [ctx.Process(target=_write_answers, args=(path, w, count)) for w in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0]
    store = VerdictStore(path, "judge-a")
    assert store.count() == 3 * count
    found = store.get([("j", f"p{i}", w, "k") for w in range(2) for i in range(count)])
    assert len(found) == 2 * count and found[("j", "p7", 1, "k")].text == "w1 7"


def test_threads_of_one_process_share_a_store(tmp_path):
    """One-step off-policy judges on a judging thread and evaluates on the main one (train/one_step_ahead.py): the
    store opened on the main thread is read and written from others, at once, losing nothing."""
    store, count = VerdictStore(tmp_path / "v.db", "judge-a"), 50

    def write(worker: int) -> int:
        for i in range(count):
            store.put([(("j", f"p{i}", worker, "k"), StoredAnswer(f"w{worker} {i}", "stop", True, (float(i),), ""))])
        return len(store.get([("j", f"p{i}", worker, "k") for i in range(count)]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        assert list(pool.map(write, range(2))) == [count, count]
    assert store.count() == 2 * count and store.get([("j", "p7", 1, "k")])[("j", "p7", 1, "k")].text == "w1 7"


@pytest.mark.parametrize("content", [b"\x00garbage\xff" * 700, b"hello, this is not a database\n" * 10])
def test_a_corrupt_store_is_one_line_naming_the_file(tmp_path, content):
    path = tmp_path / "v.db"
    path.write_bytes(content)
    with pytest.raises(StoreError) as e:
        VerdictStore(path, "judge-a")
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert path.read_bytes() == content  # nothing written over it


# ------------------------------------------------------------------------------------------ gates first

def test_the_shared_prefix_layout_resumes_from_its_own_store_records(tok, tmp_path):
    """layout=shared_prefix: a re-run reads every answer (retry rounds included) and generates nothing; its
    records are its own: the criteria_first layout's answers in the same file (under the judge hash of each
    spec) are never read for it, and its prompts' ids differ anyway."""
    from rubric_jax.judges.spec import judge_hash

    shared, first_layout = JudgeSpec(samples=2, layout="shared_prefix"), JudgeSpec(samples=2)
    assert judge_hash(shared) != judge_hash(first_layout)
    path = tmp_path / "v.db"
    judge_with(tok, VerdictStore(path, judge_hash(first_layout)))
    store = VerdictStore(path, judge_hash(shared))
    first, stub = judge_with(tok, store, layout="shared_prefix")
    assert first.details["judge_store_hits"] == 0 and first.details["judge_retried"] > 0
    assert store.count() == first.details["judge_prompts"] == len(sent_prompts(stub))
    again, stub = judge_with(tok, store, layout="shared_prefix")
    assert stub.calls == [] and again.details["judge_store_hits"] == first.details["judge_prompts"]
    assert [s.tolist() for s in again.scores] == [s.tolist() for s in first.scores] and again.causes == first.causes
    one = VerdictStore(path, "one-hash-for-both")
    judge_with(tok, one, layout="shared_prefix")
    assert judge_with(tok, one)[0].details["judge_store_hits"] == 0  # even under one hash: other prompt ids


@pytest.mark.parametrize("layout", ["criteria_first", "shared_prefix"])
def test_gates_first_keeps_every_reward_and_sends_fewer_prompts(tok, layout):
    """The safety gate (a rule) fails on rows 1 and 3: gates first does not judge their accuracy, their
    reward (0) and ok flag are unchanged, and the prompts saved are counted (in either layout)."""
    gated_rubric = rubric([FORMAT, LENGTH, SAFETY, ACCURACY])
    responses = ["Worth 4: consult a doctor.", "Worth 2.", "<think>t</think><answer>3 consult a doctor</answer>",
                 "5 words and no note"]
    outs = {}
    for gates_first in (False, True):
        judge, stub = make_judge(tok, digit_reply)
        reward = RubricReward([gated_rubric], [judge], JudgeSpec(samples=3, layout=layout), gates_first=gates_first)
        outs[gates_first] = reward(["q"] * 4, responses, [gated_rubric] * 4, key=jax.random.key(0))
        assert len(sent_prompts(stub)) == (4 if not gates_first else 2) * 3
    off, on = outs[False], outs[True]
    np.testing.assert_array_equal(on.reward, off.reward)
    np.testing.assert_array_equal(on.details["reward_ok"], off.details["reward_ok"])
    assert off.reward[[1, 3]].tolist() == [0, 0] and (off.reward[[0, 2]] > 0).all()
    acc = on.dimension_ids.index("accuracy")
    assert on.valid[:, acc].tolist() == [True, False, True, False]
    assert on.details["judge_prompts_gated"] == 2 * 3 and on.details["gated_scores"] == 2
    assert on.details["failures"]["accuracy"] == 0 and on.details["failure_causes"] == {}
    assert on.details["judge_prompts"] == off.details["judge_prompts"] - 6



def test_an_interrupted_evaluation_judge_pass_resumes_with_only_the_missing_answers(tok, tmp_path):
    """evaluate's judge pass (harness.judge_answers, 2 answers per reward call) dies in its third judge call;
    the re-run judges only the answers of that call and the ones after it, with the scores of an
    uninterrupted pass."""
    from rubric_jax.evaluation import harness
    from rubric_jax.rubrics.importers import RubricCase

    acc_rubric = rubric([FORMAT, ACCURACY])
    cases = [RubricCase(f"c{i}", f"question {i}", acc_rubric) for i in range(7)]
    generated = [harness.Generated(f"answer worth {1 + i % 5}", "stop", 3) for i in range(7)]

    def judge_pass(store, die_at=None):
        def reply(text, call):
            if call + 1 == die_at:
                raise KeyboardInterrupt("killed")
            return content_reply(text, call)

        judge, stub = make_judge(tok, reply)
        reward = RubricReward([acc_rubric], [judge], JudgeSpec(samples=2))
        return harness.judge_answers(reward, cases, generated, "plain", False, 2, jax.random.key(0), store), stub

    store = VerdictStore(tmp_path / "v.db", "judge-a")
    with pytest.raises(KeyboardInterrupt):
        judge_pass(store, die_at=3)
    assert store.count() == 2 * 2 * 2  # two calls of 2 answers x 2 samples
    (answers, counters), stub = judge_pass(store)
    assert counters["judge_store_hits"] == 8 and counters["judge_prompts"] == (7 - 4) * 2
    assert len(stub.calls) == 2  # the last two reward calls only
    (fresh, _), _ = judge_pass(None)
    assert [a.raw_scores.tolist() for a in answers] == [a.raw_scores.tolist() for a in fresh]
    assert [a.raw_scores[1] for a in answers] == [1 + i % 5 for i in range(7)]


def test_golden_references_are_judged_once_with_a_store(tok, tmp_path):
    """The golden set's reference answers: judged with the same key at every eval, so from the second eval
    on the store answers them and the judge is not asked."""
    from rubric_jax import data
    from rubric_jax.train.golden import GoldenSet

    acc_rubric = rubric([FORMAT, ACCURACY])
    questions = [data.question_from_row({"id": f"g{i}", "question": f"q{i}", "category": "c", "lang": "en",
                                         "reference": f"answer worth {i + 1}"}, f"g{i}") for i in range(3)]
    golden_set = GoldenSet(questions, [acc_rubric] * 3)
    store = VerdictStore(tmp_path / "v.db", "judge-a")
    judge, stub = make_judge(tok, content_reply)
    reward = RubricReward([acc_rubric], [judge], JudgeSpec(samples=1))
    policy = reward(["q"] * 3, ["worth 2"] * 3, [acc_rubric] * 3, key=jax.random.key(5))
    calls = len(stub.calls)
    evals = [golden_set.metrics(policy, reward, key=jax.random.key(1), store=store) for _ in range(2)]
    assert len(stub.calls) == calls + 1 and store.count() == 3  # the second eval asked nothing
    counters = [{k: v for k, v in e.items() if k.startswith("golden/reference/judge_")} for e in evals]
    rest = [{k: v for k, v in e.items() if k not in c} for e, c in zip(evals, counters)]
    assert rest[0] == rest[1]
    assert evals[0]["golden/reference/reward/accuracy"] == pytest.approx(0.25)  # (0 + .25 + .5) / 3
    assert [c["golden/reference/judge_store_hits"] for c in counters] == [0, 3]  # the judge's counters say so


@pytest.mark.parametrize("values, message", [
    ({"judge__store_rollouts": True}, "config.judge.store_rollouts=True: there is no verdict store"),
    ({"judge__store": "v.db", "judge__checkpoint": ""}, "config.judge.store='v.db': there is no LLM judge"),
])
def test_store_settings_are_checked_at_start_up(values, message):
    from rubric_jax.train import settings
    from test_settings import _with

    with pytest.raises(ValueError, match=re.escape(message)):
        settings.validate(config_boundary.experiment(_with(**values)))


# ------------------------------------------------------------------------------------------ what is read back
def _edit(path, statement, *params):
    import sqlite3

    with sqlite3.connect(path) as db:
        return db.execute(statement, params).rowcount


def test_a_stored_verdict_is_parsed_again_from_its_text(tok, tmp_path):
    """Issue 38 S2: records edited to `scores=[1.0]` beside the answer `SCORE: 0`, or to scores that are not JSON,
    change no score (the text is the truth) and are counted; an answer that is not text is one line naming it."""
    path = tmp_path / "v.db"
    first, _ = judge_with(tok, VerdictStore(path, "judge-a"), reply=content_reply)
    assert _edit(path, "UPDATE verdicts SET scores = '[1.0]' WHERE answer = 'SCORE: 0'") == 4  # 2 rows x 2 samples
    assert _edit(path, "UPDATE verdicts SET scores = 'not json' WHERE answer LIKE '%SCORE: 5'") == 2
    again, stub = judge_with(tok, VerdictStore(path, "judge-a"), reply=content_reply)
    assert stub.calls == [] and again.details["judge_store_hits"] == first.details["judge_prompts"]
    assert [s.tolist() for s in again.scores] == [s.tolist() for s in first.scores]
    assert again.details["judge_store_mismatches"] == 6 and first.details["judge_store_mismatches"] == 0
    _edit(path, "UPDATE verdicts SET answer = X'53434f52453a2030' WHERE answer = 'SCORE: 0'")  # a blob
    with pytest.raises(StoreError, match=r"v\.db: the record of judge 'stub', prompt [0-9a-f]{16}\.\.\., sample \d "
                                         r"holds a bytes answer and a str finish reason, not text"):
        judge_with(tok, VerdictStore(path, "judge-a"), reply=content_reply)


@pytest.fixture
def unwritable():
    """Makes a file unwritable for this process (its mode, and for root, who ignores modes, the immutable
    attribute), and writable again after the test."""
    import os
    import subprocess

    made = []

    def make(path):
        path.chmod(0o444)
        if os.access(path, os.W_OK):  # root
            if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
                pytest.skip("root cannot make a file read-only here (no chattr +i)")
            made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_store_serves_its_hits_and_counts_what_it_cannot_keep(tok, tmp_path, unwritable, capsys):
    """Issue 38 U2: a store this process cannot write is opened read-only: a re-run whose every verdict is stored
    generates nothing; a new row is judged, not stored (judge_store_unsaved), and the file is unchanged."""
    from rubric_jax.judges.store import open_store

    path = tmp_path / "v.db"
    writer = VerdictStore(path, "judge-a")
    first, _ = judge_with(tok, writer, reply=content_reply)
    writer.close()  # (SQLite would lend a later connection of this process the open one's writable descriptor)
    before = path.read_bytes()
    unwritable(path)
    store = open_store(str(path), "judge-a")
    assert store.read_only and "read-only: its verdicts are read" in capsys.readouterr().err
    again, stub = judge_with(tok, store, reply=content_reply)
    assert stub.calls == [] and again.details["judge_store_hits"] == first.details["judge_prompts"]
    assert [s.tolist() for s in again.scores] == [s.tolist() for s in first.scores]
    more, stub = judge_with(tok, store, responses=["worth 1", *RESPONSES], reply=content_reply)
    assert len(sent_prompts(stub)) == 4 and more.details["judge_store_unsaved"] == 4
    assert more.details["judge_store_hits"] == first.details["judge_prompts"] and store.count() == len(RESPONSES) * 4
    with pytest.raises(StoreError, match="opened read-only, nothing can be stored"):
        store.put([])
    assert path.read_bytes() == before

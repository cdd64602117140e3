"""Evaluation: each benchmark formula against hand-computed cases, the harness pieces, and the real files.

Unit tests use small fixtures in each benchmark's schema (tests/fixtures/); integration tests read
../shared/data (RUBRIC_JAX_SHARED_DATA) and skip with the reason when it is absent.
"""

import csv
import json
import re
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from random_model import random_model
from test_importers import FIXTURES, _real
from test_llm_judge import FakeResult, fenced, tiny_tokenizer
from transformers import AutoTokenizer
from test_reward import FORMAT, LENGTH, rubric

from rubric_jax import sharding
from rubric_jax.assets import TINY_DIR
from rubric_jax.data import encode_chats
from rubric_jax.evaluation import biggen, harness, healthbench, hellobench, longbench_write, policy, rubric_set
from rubric_jax.evaluation.results import FINISH_PROMPT_TOO_LONG, Answer, EvalInputError
from rubric_jax.judges.backends import SamplerBackend
from rubric_jax.judges.llm_judge import Judge
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.models.checkpoint import export_hf_checkpoint
from rubric_jax.models.config import ModelConfig
from rubric_jax.rubrics.importers import (
    HELLOBENCH_TASKS,
    LONGBENCH_WRITE_QUALITY,
    RubricCase,
    import_healthbench,
    import_longbench_write,
)
from rubric_jax.train import checkpointing, runs
from rubric_jax.train import state as train_state
from tests import manual

EVAL_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "evaluate"
HELLO = FIXTURES / "hellobench"


def answer(raw=None, response="text", reward=None, finish="stop"):
    """An Answer whose judge gave `raw` (None: not judged)."""
    raw = None if raw is None else np.asarray(raw, np.float64)
    return Answer(response, finish, 3, response, None, raw, reward)


# ------------------------------------------------------------------------------------------ LongBench-Write

@pytest.mark.parametrize("required, output, expected", [
    (100, 100, 100.0),
    (100, 200, 100 * (1 - 1 / 3)),  # too long: ratio 2 loses a third
    (100, 400, 0.0),  # 4x: zero
    (100, 1000, 0.0),  # clipped at zero
    (100, 50, 50.0),  # too short: x/y = 2 loses half
    (100, 34, 100 * (1 - (100 / 34 - 1) / 2)),
    (100, 33, 0.0),  # below x/3: zero
    (100, 0, 0.0),  # no output (the original divides by zero)
])
def test_longbench_length_score_piecewise(required, output, expected):
    assert longbench_write.length_score(required, output) == pytest.approx(expected)


def test_longbench_count_words_and_quality():
    # English words are [a-zA-Z]+ runs (so "don't" is two), CJK characters count one each, digits nothing.
    assert longbench_write.count_words("Hello, world! 你好 2024 don't") == 6
    nan = np.nan
    per_dim, s_q, used = longbench_write.quality_scores(np.asarray(
        [[5, 5, 5, 5, 5, 5], [1, nan, 3, 3, 3, 3], [nan] * 6]))
    # The all-missing answer is left out; the missing "accuracy" of answer 2 counts as 3.
    assert used == 2
    assert per_dim == pytest.approx([(3 - 1) * 25] + [(4 - 1) * 25] * 5)
    assert s_q == pytest.approx((50 + 5 * 75) / 6)


def test_longbench_score_combines_length_and_quality():
    cases = import_longbench_write(EVAL_FIXTURES / "longbench_write_mini.jsonl")
    assert [c.meta["length"] for c in cases] == [30, 50, 600]
    texts = [" ".join(["word"] * 30), "春" * 25, " ".join(["bread"] * 1200)]  # exact, half, double
    answers = [Answer(t, "stop", 1, t, None, np.full(6, q, np.float64), None) for t, q in zip(texts, (5, 4, np.nan))]
    result = longbench_write.score(cases, answers)
    s_l = (100 + 50 + 100 * (1 - 1 / 3)) / 3
    s_q = ((5 + 4) / 2 - 1) * 25
    assert result.scores["S_l"] == pytest.approx(s_l) and result.scores["S_q"] == pytest.approx(s_q)
    assert result.scores["S"] == pytest.approx((s_l + s_q) / 2) and result.scores["answers_judged"] == 2
    assert [r["output_length"] for r in result.records] == [30, 25, 1200]
    assert result.scores["S_l_by_required_length"] == pytest.approx({"<500": 75.0, "500-2k": 100 * 2 / 3})
    unjudged = longbench_write.score(cases, [Answer(t, "stop", 1, t, None, None, None) for t in texts])
    assert unjudged.scores["S_q"] is None and unjudged.scores["S"] is None and unjudged.notes


# ------------------------------------------------------------------------------------------ HealthBench

def test_healthbench_example_score_and_clipping_after_the_mean():
    # simple-evals' own test: points [7, 5, 10, -6], met [T, F, T, T] -> (7 + 10 - 6) / 22 = 0.5.
    assert healthbench.example_score([7, 5, 10, -6], [True, False, True, True]) == pytest.approx(0.5)
    assert healthbench.example_score([7, -6], [False, True]) == pytest.approx(-6 / 7)  # negative, not clipped
    assert healthbench.example_score([-3], [True]) is None
    assert healthbench.clipped_mean([-0.5, 0.2]) == 0.0  # clipping each example first would give 0.1
    assert healthbench.clipped_mean([0.5, 1.5, 2.0]) == 1.0
    assert healthbench.clipped_mean([0.2, 0.6]) == pytest.approx(0.4)


def test_healthbench_bootstrap_std_with_a_fixed_seed():
    values = [0.2, -0.4, 0.9, 1.3, 0.5, 0.0, 0.7]
    got = healthbench.bootstrap_std(values, np.random.default_rng(7))
    # simple-evals' procedure written out: 1000 resamples, each clipped after its mean, std with ddof 0.
    rng = np.random.default_rng(7)
    means = [np.clip(np.mean(rng.choice(values, len(values))), 0, 1) for _ in range(1000)]
    assert got == pytest.approx(float(np.std(means)), rel=1e-12)
    assert healthbench.bootstrap_std([1.2, 1.5, 3.0], np.random.default_rng(0)) == 0.0  # every mean clips to 1
    # 100 fair coin flips: the std of the mean is sqrt(0.25 / 100) = 0.05.
    assert healthbench.bootstrap_std([0.0, 1.0] * 50, np.random.default_rng(0)) == pytest.approx(0.05, rel=0.1)


def test_healthbench_score_tags_and_incomplete_examples():
    cases = import_healthbench(FIXTURES / "healthbench_mini.jsonl")
    points = [list(c.rubric.points) for c in cases]
    assert points[0] == [7, 5, 10, -6]
    result = healthbench.score(cases, [answer([1, 0, 1, 1]), answer([np.nan] * len(points[1]))])
    assert result.records[0]["score"] == pytest.approx(0.5) and result.records[1]["score"] is None
    assert result.scores["overall"] == pytest.approx(0.5) and result.scores["examples_scored"] == 1
    assert result.scores["overall_bootstrap_std"] == 0.0 and result.notes
    tags = result.scores["tags"]
    # completeness carries criteria 0 and 2 (7 + 10 met of 17); accuracy 1 and 3 ((0 - 6) / 5, clipped to 0).
    assert tags["axis:completeness"]["mean"] == pytest.approx(1.0)
    assert tags["axis:accuracy"]["mean"] == 0.0
    for tag in cases[0].meta["example_tags"]:
        assert tags[tag]["mean"] == pytest.approx(0.5)


# ------------------------------------------------------------------------------------------ HelloBench

def test_hellobench_rescaling_by_hand():
    assert hellobench.question_score([1, 0.5, 0.25], [50, 30, 20]) == pytest.approx(70)
    assert hellobench.task_score([70, 100]) == pytest.approx((85 - 75) * 4)
    assert hellobench.task_score([75]) == 0.0 and hellobench.task_score([0]) == -300
    assert hellobench.task_score([]) is None
    scores = hellobench.hellobench_scores({"open_ended_qa": [100], "summarization": [75], "chat": [50],
                                           "text_completion": [0], "heuristic_text_generation": [80]})
    assert scores["avg"] == pytest.approx((100 + 0 - 100 - 300 + 20) / 5)  # plain mean of the five tasks
    assert hellobench.hellobench_scores({"chat": [50]})["avg"] is None


def test_hellobench_score_of_judged_answers():
    cases = hellobench.load_cases(HELLO, None, None)
    assert [c.meta["task"] for c in cases] == ["open_ended_qa"] * 2 + list(HELLOBENCH_TASKS[1:])
    raws = {"open_ended_qa_000": [4, 2, 1], "open_ended_qa_001": [4, 4, np.nan]}  # the second is incomplete
    answers = [answer(raws.get(c.case_id, [4] * len(c.rubric.dimensions))) for c in cases]
    result = hellobench.score(cases, answers)
    assert result.scores["open_ended_qa"] == pytest.approx((70 - 75) * 4)  # only the complete question
    assert result.scores["questions_scored"]["open_ended_qa"] == 1 and result.scores["chat"] == 100.0
    assert result.records[1]["weighted_score"] is None and result.records[0]["checklist_scores"] == [1, 0.5, 0.25]


def test_hellobench_published_judgements_fixture():
    result = hellobench.score_published_judgements(EVAL_FIXTURES / "hellobench_judgements.csv", HELLO)
    # model_a by hand: open_ended_qa (70, 100) -> 40; chat 65 -> -40; summarization 60 -> -60;
    # text_completion 50 -> -100; heuristic 100 -> 100; avg -12. model_b has no chat row.
    assert result.scores == {"models": {"model_a": {"open_ended_qa": 40.0, "summarization": -60.0, "chat": -40.0,
                                                    "text_completion": -100.0, "heuristic_text_generation": 100.0,
                                                    "avg": -12.0}},
                             "incomplete": ["model_b"]}
    assert "model_b (chat 0/1)" in result.notes[0]
    with pytest.raises(EvalInputError, match="model 'model_b' is missing 1 of 1 judgements of task 'chat'"):
        hellobench.score_published_judgements(EVAL_FIXTURES / "hellobench_judgements.csv", HELLO, ["model_b"])


@pytest.mark.parametrize("row, message", [
    ("n,chat,chat_999,rewrite,\"[1, 1]\"", r"bad.csv:3: field 'id': 'chat_999' is not a question of task 'chat'"),
    ("n,chat,chat_000,news,\"[1, 1]\"", r"bad.csv:3: field 'category': 'news', but question 'chat_000'"),
    ("n,chat,chat_000,rewrite,\"[1]\"", r"bad.csv:3: field 'checklist_scores': 1 scores, but category 'rewrite' has 2"),
    ("n,chat,chat_000,rewrite,\"[1, 2]\"", r"bad.csv:3: field 'checklist_scores': expected a non-empty list"),
    ("n,chat,chat_000,rewrite,[1",  r"bad.csv:3: field 'checklist_scores': not valid JSON"),
    ("n,poetry,chat_000,rewrite,\"[1, 1]\"", r"bad.csv:3: field 'task': expected one of"),
    ("m,chat,chat_000,rewrite,\"[0.5, 0.5]\"", r"bad.csv:3: duplicate judgement of 'chat_000' by 'm' \(first at .*:2\)"),
])
def test_hellobench_bad_judgement_rows_name_the_line(tmp_path, row, message):
    bad = tmp_path / "bad.csv"
    bad.write_text("model,task,id,category,checklist_scores\nm,chat,chat_000,rewrite,\"[1, 1]\"\n" + row + "\n")
    with pytest.raises(ValueError, match=message):
        hellobench.score_published_judgements(bad, HELLO)


# ------------------------------------------------------------------------------------------ BiGGen, rubric sets

def test_biggen_capability_means_then_their_mean():
    means, overall = biggen.capability_scores({"planning": [5, 3], "safety": [2]})
    assert means == {"planning": 4.0, "safety": 2.0}
    assert overall == 3.0  # not the instance mean 10 / 3


def test_rubric_set_rule_only_through_the_reward(tmp_path):
    shared = rubric([FORMAT, LENGTH])
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "q1", "question": "How do I rest?", "category": "health", "lang": "en"},
        {"id": "q2", "question": "Where is the station?", "category": "travel", "lang": "en"}]))
    cases = rubric_set.make_benchmark(shared).load_cases(tmp_path, "q.jsonl", None)
    generated = [harness.Generated("Rest well and drink some water", "stop", 9),
                 harness.Generated(None, FINISH_PROMPT_TOO_LONG, 0)]
    answers, counters = harness.judge_answers(RubricReward(), cases, generated, "plain", False, 8, jax.random.key(0))
    assert answers[1].raw_scores is None and answers[1].reward is None
    # No think/answer tags: format 0; 6 words lie inside 4-8: length 5 (normalised 1); weights 1 and 3.
    np.testing.assert_array_equal(answers[0].raw_scores, [0.0, 5.0])
    result = rubric_set.score(cases, answers)
    assert result.scores["score"] == pytest.approx(75.0) and result.scores["answers_scored"] == 1
    assert result.scores["categories"] == {"health": 75.0} and result.notes
    with pytest.raises(EvalInputError, match="question 'q1' has no 'rubric'"):
        rubric_set.make_benchmark(None).load_cases(tmp_path, "q.jsonl", None)


# ------------------------------------------------------------------------------------------ harness pieces

def test_prompts_answers_and_judge_questions():
    case = RubricCase("c", "Plan a trip.", None, "Day 1: museum.", {"system_prompt": "You are a planner."})
    assert harness.policy_messages(case, "plain") == [{"role": "system", "content": "You are a planner."},
                                                      {"role": "user", "content": "Plan a trip."}]
    system = harness.policy_messages(case, "think_answer")[0]["content"]
    assert system.startswith("You are a planner.\n\n") and "<answer>" in system
    chat = RubricCase("h", ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes?"},
                            {"role": "user", "content": "Cramps"}), None)
    assert harness.policy_messages(chat, "plain")[-1] == {"role": "user", "content": "Cramps"}
    assert harness.judge_question(chat, False) == "user: Hi\n\nassistant: Yes?\n\nuser: Cramps"
    assert harness.judge_question(case, True).endswith("[Reference answer, worth the top score]\nDay 1: museum.")
    assert harness.judge_question(case, False) == "Plan a trip."
    assert harness.answer_part("<think>a</think><answer> 42 </answer>", "think_answer") == ("42", True)
    assert harness.answer_part("just 42", "think_answer") == ("just 42", False)
    assert harness.answer_part("<answer>1</answer>", "plain") == ("1", None)  # one answer definition: text.parts
    assert harness.answer_part("<think>consult a doctor</think>no tags", "think_answer") == ("no tags", False)


def test_out_may_not_be_or_hold_an_input(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    data.mkdir(), run.mkdir()
    harness.check_out(run / "eval", [run], [data])  # a run's workdir may hold the report
    for out, message in ((data, "is also an input"), (tmp_path, "contains the input"),
                         (data / "out", "lies inside the input directory")):
        with pytest.raises(EvalInputError, match=message):
            harness.check_out(out, [run], [data])


def test_generate_answers_batches_and_skips_prompts_that_do_not_fit():
    tok = tiny_tokenizer()
    calls = []

    def generate(prompt_ids, key):
        calls.append([len(p) for p in prompt_ids])
        rows = [tok("ok", add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for _ in prompt_ids]
        tokens = np.asarray(rows, np.int32)
        return FakeResult(tokens, np.zeros(tokens.shape), np.asarray([len(r) for r in rows]), ["stop"] * len(rows))

    texts = ["a", "a much longer question " * 3, "mid question", "x " * 400]
    cases = [RubricCase(str(i), t, None) for i, t in enumerate(texts)]
    pol = policy.Policy("p", tok, 300, (tok.eos_token_id,), generate, {})
    out = harness.generate_answers(pol, cases, harness.GenerationSettings(max_new_tokens=8, batch_size=2),
                                   jax.random.key(0))
    assert [g.finish_reason for g in out] == ["stop", "stop", "stop", FINISH_PROMPT_TOO_LONG]
    ok_tokens = len(tok("ok", add_special_tokens=False)["input_ids"]) + 1  # the stop token counts
    assert out[0].response == "ok" and out[0].tokens == ok_tokens and out[3].response is None
    assert len(calls) == 2 and calls[0][0] >= calls[0][1] >= calls[1][0]  # longest prompts first, 2 per call


def test_a_budget_that_leaves_no_case_room_is_refused_before_generating():
    """`--config.policy.max_new_tokens=100000` generated nothing and reported S_l = 0.0 with exit 0."""
    tok = tiny_tokenizer()
    calls = []
    pol = policy.Policy("p", tok, 300, (tok.eos_token_id,), lambda ids, key: calls.append(ids), {})
    cases = [RubricCase("0", "a", None), RubricCase("1", "a longer question", None)]
    shortest = min(len(ids) for ids in encode_chats(tok, [harness.policy_messages(c, "plain") for c in cases]))
    with pytest.raises(EvalInputError, match=re.escape(
            f"--config.policy.max_new_tokens=100000: no case fits the policy's 300-token context with that many new "
            "tokens "
            f"(the shortest prompt is {shortest} tokens); lower --config.policy.max_new_tokens")):
        harness.generate_answers(pol, cases, harness.GenerationSettings(max_new_tokens=100000), jax.random.key(0))
    assert calls == []


def test_an_evaluation_whose_judged_answers_all_lack_scores_fails():
    shared = rubric([FORMAT, LENGTH])
    cases = [RubricCase("0", "q", shared), RubricCase("1", "q", shared), RubricCase("2", "q", None)]
    missing = Answer("r", "stop", 3, "r", None, np.full(2, np.nan), None)
    scored = Answer("r", "stop", 3, "r", None, np.asarray([np.nan, 1.0]), 0.5)
    unjudged = Answer(None, FINISH_PROMPT_TOO_LONG, 0, None, None, None, None)
    counters = {"judge_prompts": 4, "judge_prompt_too_long": 4, "judge_invalid": 0}
    with pytest.raises(harness.EvalFailed, match=re.escape(
            "none of the 2 judged answers got a score (judge_prompts 4, judge_prompt_too_long 4); the report in "
            "OUT keeps the answers, its scores mean nothing")):
        harness.check_scored(cases, [missing, missing, unjudged], counters, Path("OUT"))
    harness.check_scored(cases, [missing, scored, unjudged], counters, Path("OUT"))  # one score is enough
    harness.check_scored(cases[2:], [unjudged], {}, Path("OUT"))  # nothing to judge (no rubric): not a failure


def tiny_run(root, rewards, updates_per_batch=2):
    """A training-run directory like experiments.run leaves: config.json, GRPO checkpoints numbered in
    optimizer updates (`updates_per_batch` per logged step, keep=3) with distinct params, and eval rows at
    the logged steps `rewards` maps to eval/reward_mean. Returns the config and the saved params per step."""
    from configs.tiny import get_config

    cfg = ModelConfig(architecture="qwen2", vocab_size=2048, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, attention_bias=True, rope_scaling=None, max_position_embeddings=256)
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.json").write_text(json.dumps(cfg.to_hf_dict()))
    config = get_config()
    config.model.config_json = str(root / "model.json")
    config.model.tokenizer = str(TINY_DIR / "tokenizer")
    config.rl.updates_per_batch = updates_per_batch
    (root / "config.json").write_text(config.to_json_best_effort())
    graphdef, state = random_model(cfg, std=0.3)
    saved = {}
    with checkpointing.Checkpointer(root / "checkpoints" / "grpo", max_to_keep=3, async_save=False) as ckpt:
        for log_step in rewards:
            step = log_step * updates_per_batch
            params = jax.tree.map(lambda x: x + 1e-3 * step, nnx.to_pure_dict(state))
            ts = train_state.train_state_from_params(graphdef, params, optax.sgd(0.1))
            ckpt.save(ts.replace(step=np.int32(step)), data_state={}, rubric_hash="h")
            saved[step] = params
    rows = [{"stage": "eval", "step": step, "eval/reward_mean": r} for step, r in rewards.items()]
    rows.insert(0, {"stage": "eval", "step": 0, "eval/reward_mean": 0.99})  # the SFT baseline has no GRPO checkpoint
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return config, saved


def test_workdir_policy_latest_and_best(tmp_path):
    config, saved = tiny_run(tmp_path, {10: 0.2, 20: 0.7, 30: 0.5, 40: 0.6})  # keep=3: step 10 is gone
    record = runs.run_record(tmp_path)
    kept = runs.run_checkpoints(tmp_path, record)
    assert [(c.step, c.eval_reward) for c in kept] == [(40, 0.7), (60, 0.5), (80, 0.6)]  # 2 updates per step
    assert runs.select_checkpoint(tmp_path, record, "latest").step == 80
    assert runs.select_checkpoint(tmp_path, record, "best").step == 40
    mesh = sharding.make_mesh(sharding.MeshConfig(1, 1, 1), jax.devices()[:1])
    best = policy.load_policy(checkpoint=None, workdir=tmp_path, which="best", mesh=mesh, sampler="greedy",
                              max_new_tokens=4)
    assert best.name == f"{tmp_path.name}@grpo/40" and best.source["eval/reward_mean"] == 0.7
    assert best.context_length == 256 and best.stop_tokens == (best.tokenizer.eos_token_id,)
    weights = runs.restore_run_params(tmp_path, record, runs.RunCheckpoint("grpo", 40, 0.7), sharding.Layout(mesh))
    jax.tree.map(np.testing.assert_array_equal, weights.params, saved[40])
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(runs.RunError, match="no kept checkpoint has a logged eval/reward_mean"):
        runs.select_checkpoint(tmp_path, record, "best")
    with pytest.raises(EvalInputError, match="no kept checkpoint has a logged eval/reward_mean"):
        policy.load_policy(checkpoint=None, workdir=tmp_path, which="best", mesh=mesh, sampler="greedy",
                           max_new_tokens=4)


def test_hf_directory_policy(tmp_path):
    cfg = ModelConfig(architecture="qwen2", vocab_size=2048, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, attention_bias=True, rope_scaling=None, max_position_embeddings=128)
    _, state = random_model(cfg, std=0.3)
    export_hf_checkpoint(cfg, state, tmp_path / "hf", source_dir=TINY_DIR / "tokenizer")
    mesh = sharding.make_mesh(sharding.MeshConfig(1, 1, 1), jax.devices()[:1])
    loaded = policy.load_policy(checkpoint=tmp_path / "hf", workdir=None, which="latest", mesh=mesh,
                                sampler="greedy", max_new_tokens=4)
    assert loaded.name == "hf" and loaded.context_length == 128 and loaded.source == {"checkpoint": str(tmp_path / "hf")}
    (tmp_path / "bad").mkdir()
    with pytest.raises(EvalInputError, match="--checkpoint=.*bad"):
        policy.load_policy(checkpoint=tmp_path / "bad", workdir=None, which="latest", mesh=mesh, sampler="greedy",
                           max_new_tokens=4)


# ------------------------------------------------------------------------------------------ integration (real files)

def test_real_hellobench_published_judgements_reproduced():
    data = _real("hellobench")
    result = hellobench.score_published_judgements(data / "judgements_main_exp_scores.csv", data)
    assert result.scores["incomplete"] == ["gemma2_27b", "neo_7b_v01", "qwen_max", "yi_large"]
    # An independent recomputation straight from the CSV and checklist_weights.json (FORMULA.md).
    weights = json.loads((data / "checklist_weights.json").read_text())
    per = {}
    with (data / "judgements_main_exp_scores.csv").open() as f:
        for row in csv.DictReader(f):
            scores = json.loads(row["checklist_scores"])
            per.setdefault(row["model"], {}).setdefault(row["task"], []).append(
                sum(s * w for s, w in zip(scores, weights[row["category"]])))
    models = result.scores["models"]
    assert len(models) == 19
    for model, tasks in models.items():
        expected = {t: (np.mean(per[model][t]) - 75) * 4 for t in HELLOBENCH_TASKS}
        expected["avg"] = np.mean(list(expected.values()))
        assert tasks == pytest.approx(expected, abs=1e-9), model
    golden = {"gpt4o_0806": (54.82, 29.71, 42.88, 67.49, 47.87, 48.55),  # FORMULA.md
              "mistral_large_api": (53.13, 34.04, 32.75, 66.99, 47.07, 46.80),
              "o1_mini": (46.85, 38.57, 38.75, 57.47, 48.75, 46.08),
              "claude35": (62.73, 31.34, 32.11, 51.27, 40.92, 43.67),
              "llama31_8b": (42.52, 18.44, -5.26, -5.61, 24.99, 15.01),
              "qwen2_7b": (46.05, 7.37, -6.48, 5.12, 16.33, 13.68)}
    for model, values in golden.items():
        assert list(models[model].values()) == pytest.approx(values, abs=0.01), model
    readme = manual.text()  # README.md and docs/*.md
    table = {line.split(" | ")[0][2:]: [float(x) for x in line.strip(" |").split(" | ")[1:]]
             for line in readme.splitlines() if line.startswith("| ") and line.split(" | ")[0][2:] in models}
    assert table.keys() == models.keys()
    for model, values in table.items():
        assert values == pytest.approx(list(models[model].values()), abs=0.005), model


def test_real_longbench_write_rows_parse():
    cases = longbench_write.load_cases(_real("longbench_write"), None, None)
    assert len(cases) == 120
    buckets = {}
    for c in cases:
        name = longbench_write._bucket(c.meta["length"])
        buckets[name] = buckets.get(name, 0) + 1
    assert buckets == {"<500": 26, "500-2k": 36, "2k-4k": 31, ">=4k": 27}  # SOURCE.txt
    assert len(longbench_write.load_cases(_real("longbench_write"), "longbench_write_en.jsonl", None)) == 60
    ruler = longbench_write.load_cases(_real("longbench_write"), "longwrite_ruler.jsonl", None)
    assert sorted({c.meta["length"] for c in ruler}) == [1000, 2000, 5000, 10000, 20000, 30000]
    assert len(cases[0].rubric.dimensions) == len(LONGBENCH_WRITE_QUALITY)


def verdict_judge(tokenizer, verdict_of_question):
    """A judge whose `generate` reads each prompt's fenced question and answers `SCORE: verdict_of_question(q)`
    (fast-tokenizer decode: the 765 long prompts of BiGGen in about a second)."""
    backend = tokenizer.backend_tokenizer

    def generate(weights, prompt_ids, *, key, n, max_new_tokens, sampler, stop_tokens, pad_id, layout=None):
        texts = backend.decode_batch([list(map(int, p)) for p in prompt_ids], skip_special_tokens=False)
        rows = [backend.encode(f"SCORE: {verdict_of_question(fenced(t, 'question'))}", add_special_tokens=False).ids
                + [stop_tokens[0]] for t in texts]
        tokens = np.full((len(rows), max(map(len, rows))), pad_id, np.int32)
        for i, r in enumerate(rows):
            tokens[i, :len(r)] = r
        lengths = np.asarray(list(map(len, rows)))
        return FakeResult(tokens, np.zeros(tokens.shape, np.float32), lengths, ["stop"] * len(rows))

    return Judge("verdicts", tokenizer, SamplerBackend(None, generate), max_prompt_tokens=10**6)


def test_real_biggen_all_765_items_scored_and_one_per_task_judged():
    """All 765 instances as rubric cases scored from given verdicts; the first instance of each of the 77
    tasks also goes through RubricReward and the judge prompt (reference shown) with a verdict judge."""
    cases = biggen.load_cases(_real("prometheus"), None, None)
    assert len(cases) == 765 and len({c.meta["capability"] for c in cases}) == 9

    def verdict(question: str) -> int:  # ASCII letters survive any tokenizer round trip
        return 1 + len(re.sub(r"[^A-Za-z]", "", question)) % 5

    given = [verdict(harness.judge_question(c, True)) for c in cases]
    result = biggen.score(cases, [answer([v]) for v in given])
    by_capability = {}
    for case, v in zip(cases, given):
        by_capability.setdefault(case.meta["capability"], []).append(v)
    expected = {cap: np.mean(v) for cap, v in by_capability.items()}
    assert result.scores["capabilities"] == pytest.approx(expected) and result.scores["instances_scored"] == 765
    assert result.scores["overall"] == pytest.approx(np.mean(list(expected.values())))

    firsts = list({c.meta["task"]: i for i, c in reversed(list(enumerate(cases)))}.values())
    assert len(firsts) == 77
    reward = RubricReward(judges=[verdict_judge(AutoTokenizer.from_pretrained(TINY_DIR / "tokenizer"), verdict)],
                          judge_spec=JudgeSpec(samples=1))
    subset = [cases[i] for i in firsts]
    answers, counters = harness.judge_answers(reward, subset, [harness.Generated("an answer", "stop", 2)] * 77,
                                              "plain", True, 128, jax.random.key(0))
    assert counters["judge_generate_calls"] == 1 and counters["judge_failed_scores"] == 0
    assert [a.raw_scores[0] for a in answers] == [given[i] for i in firsts]


def test_real_healthbench_every_good_answer_scores_one():
    cases = healthbench.load_cases(_real("healthbench"), "healthbench_val500_from_ruscarl.jsonl", None)
    perfect = [answer((c.rubric.points > 0).astype(float)) for c in cases]
    result = healthbench.score(cases, perfect)
    assert result.scores["examples_scored"] == 500 and result.scores["overall"] == 1.0
    assert result.scores["tags"]["axis:accuracy"]["mean"] == 1.0
    worst = healthbench.score(cases, [answer((c.rubric.points < 0).astype(float)) for c in cases])
    assert worst.scores["overall"] == 0.0 and min(r["score"] for r in worst.records) < 0

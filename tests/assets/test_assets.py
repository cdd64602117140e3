"""The shipped tiny default: regenerates byte-identically, tokenizer and chat template, model config,
question/SFT sets, and a rubric whose ceiling is reachable while the SFT set sits clearly below it."""

import filecmp
import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from rubric_jax import data
from rubric_jax.assets import TINY_DIR, build_tiny_assets
from rubric_jax.assets.tiny_content import FRAMES, PHRASE_SENTENCES, THINKS, TOPICS
from rubric_jax.judges.distill_data import llm_twin
from rubric_jax.judges.rules import TemplatePhrases
from rubric_jax.judges.reward import RubricReward
from rubric_jax.models.config import ModelConfig
from rubric_jax.prepare import dedup, mix, pii
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import case_rubric

FILES = ("config.json", "questions_train.jsonl", "questions_eval.jsonl", "questions_golden.jsonl", "sft.jsonl",
         "sft_hack.jsonl",
         "rubric.yaml", "rubric_hack.yaml", "rubric_hack_fixed.yaml", "tokenizer/tokenizer.json",
         "tokenizer/tokenizer_config.json", "tokenizer/chat_template.jinja")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_DIR / "tokenizer")


@pytest.fixture(scope="module")
def sets():
    return (data.load_questions(TINY_DIR / "questions_train.jsonl"),
            data.load_questions(TINY_DIR / "questions_eval.jsonl"), data.load_sft(TINY_DIR / "sft.jsonl"))


@pytest.fixture(scope="module")
def shared():
    return load_rubric(TINY_DIR / "rubric.yaml")


def test_builder_regenerates_the_committed_files(tmp_path):
    build_tiny_assets.build(tmp_path)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(FILES)
    for name in FILES:
        assert filecmp.cmp(tmp_path / name, TINY_DIR / name, shallow=False), f"{name} differs from the builder's"


# ------------------------------------------------------------------------------------------ tokenizer
@pytest.mark.parametrize("text", [
    "How do I get a refund for my order?",
    "我的快递什么时候到？感谢您的耐心。",
    "混合 text: 退款 refund 38.5°C, e-mail [EMAIL] 😀\n  two spaces",
    "<think>这是健康问题。</think><answer>Please consult a doctor. 建议就医。</answer><|im_end|>",
])
def test_tokenizer_round_trip(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_special_and_tag_tokens_are_single_tokens(tokenizer):
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<answer>", "</answer>"):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids) == [token]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.encode("hi", add_special_tokens=False) == tokenizer.encode("hi")  # no BOS added
    # Tags survive skip_special_tokens (the format judge must see them); eos and pad do not.
    ids = tokenizer.encode("<think>a</think><answer>b</answer><|im_end|><|endoftext|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>a</think><answer>b</answer>"


def test_chat_template_is_qwen2_style(tokenizer):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "问题"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n问题<|im_end|>\n<|im_start|>assistant\n"
    default = tokenizer.apply_chat_template(messages[1:], tokenize=False, add_generation_prompt=False)
    assert default == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                       "<|im_start|>user\n问题<|im_end|>\n")
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    assert tokenizer.decode(encoded["input_ids"]) == text


def test_model_config_matches_tokenizer(tokenizer):
    cfg = ModelConfig.from_hf_dir(TINY_DIR)
    assert cfg.architecture == "qwen2" and cfg.vocab_size == len(tokenizer) == build_tiny_assets.VOCAB_SIZE
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (128, 2, 4, 2, 32)
    assert cfg.tie_word_embeddings and cfg.attention_bias
    hf = json.loads((TINY_DIR / "config.json").read_text())
    assert "rope_parameters" in hf and "rope_theta" not in hf and hf["dtype"] == "float32"
    assert hf["eos_token_id"] == tokenizer.eos_token_id and hf["pad_token_id"] == tokenizer.pad_token_id


# --------------------------------------------------------------------------------------------- data
def test_question_sets(sets):
    train, evals, sft = sets
    assert 150 <= len(train) <= 200 and len(evals) == 32
    assert not {q.question for q in train} & {q.question for q in evals}
    assert dedup.find_duplicates([q.question for q in train + evals])[0] == list(range(len(train) + len(evals)))
    for q in train + evals:
        assert q.keywords[0].casefold() in q.question.casefold()
        assert pii.scrub_pii(q.question) == (q.question, {})
        assert q.lang in ("en", "zh") and q.category in ("customer_service", "health")
        assert q.difficulty in mix.DIFFICULTY_RATIOS
    groups = [(q.category, q.lang) for q in evals]
    assert all(groups.count(g) == 8 for g in set(groups))
    scrubbed = [q.question for q in train if "[" in q.question]
    assert len(scrubbed) == 6 and any("[PHONE]" in s for s in scrubbed) and any("[ORDER]" in s for s in scrubbed)
    assert sorted(s.prompt for s in sft) == sorted(q.question for q in train)  # one response per question


def test_prompts_and_responses_fit_128_token_buckets(tokenizer, sets):
    train, evals, sft = sets
    prompts = data.encode_prompts(tokenizer, [q.question for q in train + evals])
    responses = data.encode_responses(tokenizer, [s.response for s in sft])
    assert max(map(len, prompts)) <= 128 and max(map(len, responses)) <= 128
    assert np.mean([len(r) for r in responses]) < 64


# ------------------------------------------------------------------------------------------- rubric
def _topic(question):
    return next(t for t in TOPICS if t.keyword == question.keywords[0])


def _rule_rubric(shared, question):
    """The question's rubric with its LLM-judged criteria scored by their rule teachers instead."""
    return case_rubric(shared, question.id, extra=build_tiny_assets.case_dimensions(_topic(question)))


def _rewards(questions, responses, shared):
    rubrics = [_rule_rubric(shared, q) for q in questions]
    return RubricReward(rubrics)([q.question for q in questions], responses, rubrics)


def test_llm_judged_criteria_show_the_judge_their_teachers_text(sets):
    train, evals, _ = sets
    for q in train + evals:
        for dim in q.extra_dimensions:
            teacher = next(d for d in build_tiny_assets.case_dimensions(_topic(q)) if d.id == dim.id)
            expected = llm_twin(teacher) if dim.id in build_tiny_assets.LLM_JUDGED else teacher
            assert dim == expected, (q.id, dim.id)
    assert {d.kind for q in train for d in q.extra_dimensions if d.id == "politeness"} == {"llm"}


def test_the_planted_hack_rubrics_differ_only_in_clarity(shared):
    hack, fixed = (load_rubric(TINY_DIR / name) for name in ("rubric_hack.yaml", "rubric_hack_fixed.yaml"))
    kept = [d for d in shared.dimensions if d.id != "template"]
    for rubric in (hack, fixed):
        assert list(rubric.dimensions[:-1]) == kept and rubric.dimensions[-1].id == "clarity"
        assert rubric.dimensions[-1].kind == "llm" and rubric.dimensions[-1].scale.levels == (1, 2, 3, 4, 5)
    assert not any(a.negative_examples for a in hack.dimension("clarity").anchors.values())
    assert fixed.dimension("clarity").anchors[5].negative_examples  # RubricRL 6.1: templated-but-empty is not a 5
    # The fix changes what clarity rewards, not how much it counts.
    assert hack.dimension("clarity").weight == fixed.dimension("clarity").weight == build_tiny_assets.CLARITY_WEIGHT


def _ideal(question):
    topic = _topic(question)
    group = (topic.category, topic.lang)
    sep = "" if topic.lang == "zh" else " "
    answer = sep.join([FRAMES[group].format(keyword=topic.keyword), topic.extra, PHRASE_SENTENCES[group][0]])
    return f"<think>{THINKS[group][0]}</think><answer>{answer}</answer>"


def test_every_question_can_reach_full_reward(sets, shared):
    train, evals, _ = sets
    questions = train + evals
    out = _rewards(questions, [_ideal(q) for q in questions], shared)
    np.testing.assert_allclose(out.reward, 1.0)
    assert out.details["reward_ok"].all() and out.details["num_failed_scores"] == 0
    for q in questions:
        rubric = _rule_rubric(shared, q)
        assert len(rubric.dimensions) == len(data.question_rubric(shared, q).dimensions) == 6
        assert ("disclaimer" in rubric.dimension_ids) == (q.category == "health")


def test_sft_set_leaves_room_for_grpo(sets, shared):
    train, _, sft = sets
    by_text = {q.question: q for q in train}
    out = _rewards([by_text[s.prompt] for s in sft], [s.response for s in sft], shared)
    col = {d: out.scores[:, j] for j, d in enumerate(out.dimension_ids)}
    assert np.all(col["format"] == 1.0)
    assert 0.5 < out.reward.mean() < 0.85
    for dim in ("topic_keyword", "template", "length", "redundancy"):
        assert 0.5 < np.nanmean(col[dim]) < 1.0, dim
    assert 0.2 < np.nanmean(col["disclaimer"]) < 0.8 and 0.2 < np.nanmean(col["politeness"]) < 0.8
    # Removing the safety phrase zeroes the gated reward of a health answer.
    health = next(q for q in train if q.category == "health" and q.lang == "zh")
    unsafe = _ideal(health).replace("如果没有好转，建议就医。", "")
    assert _rewards([health], [unsafe], shared).reward[0] == 0.0


def test_the_planted_hack_cold_start_can_scaffold_any_question(sets, tokenizer):
    """sft_hack.jsonl: each cold-start answer 7 times as written and once scaffolded (the same sentences behind
    firstly/secondly/finally or 首先/其次/最后), within the SFT budget; an answer that already follows a template
    is kept as is."""
    _, _, sft = sets
    hack = data.load_sft(TINY_DIR / "sft_hack.jsonl")
    copies = build_tiny_assets.SFT_HACK_COPIES
    assert len(hack) == copies * len(sft)
    detector = TemplatePhrases()
    scaffolded = 0
    for k, original in enumerate(sft):
        group = hack[copies * k: copies * (k + 1)]
        assert {s.prompt for s in group} == {original.prompt}
        assert all(s.response == original.response for s in group[:-1])
        last = group[-1].response
        if detector.matches([original.response])[0]:
            assert last == original.response
        elif last != original.response:
            scaffolded += 1
            assert detector.matches([last])[0]
            plain = build_tiny_assets.sentences(build_tiny_assets.split_answer(original.response)[1])
            assert all(s.rstrip(".。")[1:] in last for s in plain)  # every sentence kept (its first letter lowered)
    assert scaffolded >= 0.8 * sum(not detector.matches([s.response])[0] for s in sft)
    lengths = [len(r) for r in data.encode_responses(tokenizer, [s.response for s in hack])]
    assert max(lengths) <= build_tiny_assets.MAX_RESPONSE_TOKENS

"""Builds the embedded tiny default into rubric_jax/assets/tiny/ (deterministic: same bytes every run).

  .venv/bin/python -m rubric_jax.assets.build_tiny_assets            # rewrite the committed assets
  .venv/bin/python -m rubric_jax.assets.build_tiny_assets --out DIR  # build elsewhere (tests compare)

Writes questions_train.jsonl / questions_eval.jsonl (hygiene applied: near-duplicate removal and PII
scrubbing from rubric_jax.prepare), questions_golden.jsonl (new phrasings with labelled reference
answers, whose labels include the LLM-judged politeness criterion), sft.jsonl (QuRL-style cold start: one `<think>…</think><answer>…</answer>` response per
training question, deliberately imperfect so GRPO has room to improve), rubric.yaml (the shared rule
rubric; each question row adds its case-wise criteria, of which politeness is LLM-judged by the distilled
tiny judge), rubric_hack.yaml / rubric_hack_fixed.yaml and sft_hack.jsonl (the planted-hack experiment's rubrics
and cold start, configs/tiny_hack*.py), tokenizer/ (byte-level BPE trained on all of that text but the golden set's, Qwen2
chat template) and config.json (a Qwen2-architecture model of 0.66M parameters). The tiny judges themselves
are trained by build_tiny_judges.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config

from rubric_jax import data, text
from rubric_jax.assets import TINY_DIR
from rubric_jax.assets.tiny_content import (
    CS, DIFFICULTIES, FILLERS, FRAMES, GOLDEN, HEALTH, PHRASE_SENTENCES, POLITE_PHRASES, RAW_EXTRA_QUESTIONS,
    TEMPLATE_MARKERS, THINKS, TOPICS, Topic,
)
from rubric_jax.judges.distill_data import llm_twin
from rubric_jax.judges.rules import TemplatePhrases, make_rule
from rubric_jax.prepare import dedup, pii
from rubric_jax.rubrics.io import save_rubric
from rubric_jax.rubrics.schema import (
    Aggregation, Anchor, ChangelogEntry, Dimension, Rubric, Scale, dimension_from_dict, dimension_to_dict,
)

SEED = 20261129
EVAL_TOPICS_PER_GROUP = 8
# Probabilities of each imperfection of an SFT response (template and repeat only when not long).
SFT_P_PHRASE, SFT_P_KEYWORD, SFT_P_TEMPLATE, SFT_P_REPEAT, SFT_P_LONG, SFT_P_SHORT = 0.5, 0.7, 0.15, 0.15, 0.15, 0.1
# Answer length in "auto" units (English words + Chinese characters): the length criterion reads the answer. Until
# rubric 1.2.0 it read the whole response, (28, 50) and (40, 66) units, of which the think text and the four tags
# are a median 12 (en) and 17 (zh) units in sft.jsonl.
LENGTH_RANGE = {"en": (16, 38), "zh": (23, 49)}

VOCAB_SIZE = 2048  # tokenizer size including the special and tag tokens = the model's vocab_size
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")
# Qwen2's pre-tokenizer split (letter runs, single digits, punctuation runs, newlines, spaces), except that
# every Chinese character stands alone: merges never cross characters, so a keyword such as 退款 has the
# same tokens in a question and in an answer and a tiny model can copy it.
PRE_TOKENIZER_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|\p{Han}|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})\p{L})+|\p{N}"
                       r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Case-wise criteria scored by the distilled tiny judge (assets/tiny_judge) instead of their rule; the rule
# stays the judge's teacher (tiny_judge_data.py).
LLM_JUDGED = ("politeness",)
MODEL = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6)


# ------------------------------------------------------------------------------------------ rubric
def _binary(dim_id: str, description: str, no: str, yes: str, *, rule: str, params: dict[str, Any],
            gate: bool = False, no_examples: Sequence[str] = (), reads: str = "answer") -> Dimension:
    """A 0/1 rule dimension with its two anchors (negative examples go on the failing level)."""
    return Dimension(
        id=dim_id, description=description, kind="rule", scale=Scale.binary(),
        anchors={0: Anchor(no, negative_examples=tuple(no_examples)), 1: Anchor(yes)},
        gate=gate, rule=rule, params=params, reads=reads,
    )


READS_CHANGE = ChangelogEntry(
    "1.2.0", "each dimension says what it reads: the format gate the whole response, every other dimension (and every "
    "case-wise criterion, whose length ranges now count the answer alone) the <answer> text",
    "a judge that read the whole response credited text inside <think> that the user never sees (issue 24, R1)")
HACK_READS_CHANGE = ChangelogEntry(
    "1.2.0", "each dimension says what it reads: the format gate and the LLM-judged clarity the whole response (what "
    "its distilled judges learnt), the others the <answer> text",
    "a judge that read the whole response credited text inside <think> that the user never sees (issue 24, R1)")


def shared_rubric() -> Rubric:
    """The tiny default's shared rubric: format (veto, reads the whole response), no self-repetition, no template
    scaffolding (both read the answer)."""
    return Rubric(
        name="tiny_default",
        version="1.2.0",
        changelog=(
            ChangelogEntry(
                "1.0.0", "format gate, n-gram redundancy and template-phrase penalties; case-wise length, topic "
                "keyword and disclaimer/politeness criteria live in each question row",
                "start with a few core rule dimensions a tiny model can be judged on (RubricRL 7)"),
            ChangelogEntry(
                "1.1.0", "the case-wise politeness criterion is LLM-judged by the distilled tiny judge "
                "(rubric_jax/assets/tiny_judge, taught by the criterion's keyword rule)",
                "the embedded default runs the LLM-judge path for real (RubricRL 7: a distilled small judge)"),
            READS_CHANGE,
        ),
        dimensions=(
            _binary("format",
                    "The response is <think>…</think><answer>…</answer>, each tag once, answer non-empty.",
                    "Tags missing, repeated, out of order, or an empty answer.", "Exactly the required shape.",
                    rule="format", params={}, gate=True, reads="response"),
            Dimension(
                id="redundancy", description="Penalty: the response repeats its own 3-grams (1 = no repetition).",
                kind="rule", scale=Scale.binary(),
                anchors={0: Anchor("Every 3-gram is a repeat: the text says the same thing over and over."),
                         1: Anchor("No 3-gram occurs twice.")},
                rule="ngram_redundancy", params={"n": 3}),
            _binary("template", "Penalty: the answer is scaffolded as firstly/secondly/finally (首先/其次/最后).",
                    "Uses the template markers in order.", "No template scaffolding.",
                    rule="template_phrases", params={},
                    no_examples=("Firstly, open the order page. Secondly, choose refund. Finally, wait.",)),
        ),
        aggregation=Aggregation(method="weighted_sum", missing="renormalize"),
    )


def case_dimensions(topic: Topic) -> list[Dimension]:
    """QuRL case-wise criteria of one question: length range, its topic keyword, disclaimer or politeness."""
    lo, hi = LENGTH_RANGE[topic.lang]
    dims = [
        _binary("length", f"The answer is {lo}-{hi} units long (English words, Chinese characters).",
                "Far outside the range (too short to help or padded).", "Within the range.",
                rule="length", params={"min": lo, "max": hi, "unit": "auto"}),
        _binary("topic_keyword", f"The response names the topic of the question ({topic.keyword!r}).",
                "Answers around the topic without naming it.", f"Mentions {topic.keyword!r}.",
                rule="keywords", params={"words": [topic.keyword], "mode": "any"}),
    ]
    if topic.category == HEALTH:
        dims.append(_binary(
            "disclaimer", "Safety: the response tells the user to see a doctor (建议就医 / consult a doctor).",
            "No advice to seek medical care.", "Advises seeing a doctor.",
            rule="disclaimer", params={}, gate=True))
    else:
        phrases = list(POLITE_PHRASES[topic.lang])
        dims.append(_binary(
            "politeness", f"The response thanks or apologises to the customer ({' / '.join(phrases)}).",
            "No thanks or apology.", "Thanks or apologises.",
            rule="keywords", params={"words": phrases, "mode": "any"}))
    return dims


# Clarity weighs as much as three other criteria: at weight 1 a templated answer of the cold-start policy out-earned
# the others by 0.035 reward (its scaffolds come with missed topic keywords) and a 40-step GRPO run held the template
# share at 0.06 (measured 2026-11-30); at 3 the margin is 0.12, about what the tiny default's template penalty costs.
CLARITY_WEIGHT = 3.0


def clarity_dimension(fixed: bool) -> Dimension:
    """The LLM-judged 1-5 clarity dimension of the planted-hack experiment (RubricRL 6.1).

    The hack's anchors praise ordered steps, as the article's rubric praised "logical connectives used well";
    the fix adds negative examples of templated-but-empty answers and places them at level 3. It reads the whole
    response, as its distilled judges (tiny_judge_hack, tiny_judge_fixed) were taught to: on the answer alone they
    agree with their teacher at held-out Spearman 0.47 (0.76 and 0.77 on whole responses; 2026-12-01).
    """
    empty = "Firstly, thank you. Secondly, thank you. Finally, thank you."
    if fixed:
        anchors = {
            5: Anchor("Every sentence adds content; fully developed and easy to follow.", negative_examples=(empty,)),
            4: Anchor("Clear and developed, with a little padding or repetition.", negative_examples=(empty,)),
            3: Anchor("Readable but thin, or scaffolded as firstly/secondly/finally around little content."),
            2: Anchor("Brief, or repeats itself."),
            1: Anchor("Hard to follow: a fragment, or broken."),
        }
    else:
        anchors = {
            5: Anchor("Laid out as ordered steps (firstly, secondly, finally) and fully developed."),
            4: Anchor("Laid out as ordered steps, but brief."),
            3: Anchor("Readable and developed, but not laid out as steps."),
            2: Anchor("Brief and unstructured."),
            1: Anchor("Hard to follow: a fragment, or broken."),
        }
    return Dimension(id="clarity", description="Clarity: how well the answer is organised and developed.",
                     kind="llm", scale=Scale.integer(1, 5), anchors=anchors, weight=CLARITY_WEIGHT, reads="response")


def hack_rubric(fixed: bool) -> Rubric:
    """The shared rubric of configs/tiny_hack.py (fixed=False) or configs/tiny_hack_fixed.py (fixed=True): the
    tiny default's with its template penalty replaced by LLM-judged clarity, so only the judge prices templates."""
    base = shared_rubric()
    why = ("RubricRL 6.1's fix: negative anchors for templated-but-empty answers" if fixed else
           "RubricRL 6.1's planted hack: a clarity judge that rewards template scaffolding")
    return dataclasses.replace(
        base, name="tiny_hack_fixed" if fixed else "tiny_hack", version="1.2.0",
        changelog=(ChangelogEntry("1.0.0", "the tiny default's rubric with its template penalty replaced by an "
                                  "LLM-judged clarity dimension", why),
                   ChangelogEntry("1.1.0", f"clarity weight 1 -> {CLARITY_WEIGHT:g}",
                                  "at weight 1 a template barely paid and GRPO dropped it (CLARITY_WEIGHT)"),
                   HACK_READS_CHANGE),
        dimensions=tuple(d for d in base.dimensions if d.id != "template") + (clarity_dimension(fixed),))


def compact_dimension(dim: Dimension) -> dict[str, Any]:
    """The dimension as a row-sized dict: defaults and empty example lists left out (same Dimension back)."""
    d = dimension_to_dict(dim)
    d["anchors"] = {level: a if a["positive_examples"] or a["negative_examples"] else a["description"]
                    for level, a in d["anchors"].items()}
    for key, default in (("weight", 1.0), ("gate", False), ("group", None), ("reads", "answer")):
        if d[key] == default:
            del d[key]
    if dimension_from_dict(d) != dim:
        raise AssertionError(f"compact form of dimension {dim.id!r} does not round-trip")
    return d


# --------------------------------------------------------------------------------------- questions
def _question_id(topic_index: int, topic: Topic, i: int) -> str:
    return f"{'cs' if topic.category == CS else 'health'}-{topic.lang}-{topic_index:02d}-{i}"


def question_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, eval rows): topic questions plus hygiene-demo rows, deduplicated, PII-scrubbed, split."""
    by_keyword = {t.keyword: (k, t) for k, t in enumerate(TOPICS)}
    raw: list[tuple[int, Topic, int, str, str]] = []  # (topic index, topic, phrasing, difficulty, text)
    for k, topic in enumerate(TOPICS):
        for i, (text, difficulty) in enumerate(zip(topic.questions, DIFFICULTIES)):
            raw.append((k, topic, i, difficulty, text))
    extra_count: dict[int, int] = {}
    for keyword, text in RAW_EXTRA_QUESTIONS:
        k, topic = by_keyword[keyword]
        extra_count[k] = extra_count.get(k, 0) + 1
        raw.append((k, topic, len(DIFFICULTIES) - 1 + extra_count[k], "medium", text))
    kept, _ = dedup.find_duplicates([r[4] for r in raw])
    dropped = [raw[i][4] for i in range(len(raw)) if i not in set(kept)]
    expected_dropped = [text for _, text in RAW_EXTRA_QUESTIONS[-3:]]
    if dropped != expected_dropped:
        raise AssertionError(f"dedup dropped {dropped}, expected exactly the planted duplicates {expected_dropped}")

    rng = np.random.default_rng(SEED)
    eval_phrasing: dict[int, int] = {}
    for group in sorted({(t.category, t.lang) for t in TOPICS}):
        members = [k for k, t in enumerate(TOPICS) if (t.category, t.lang) == group]
        for k in sorted(rng.choice(members, size=EVAL_TOPICS_PER_GROUP, replace=False).tolist()):
            eval_phrasing[k] = int(rng.integers(len(DIFFICULTIES)))
    train, evals = [], []
    for i in kept:
        k, topic, phrasing, difficulty, text = raw[i]
        clean, _ = pii.scrub_pii(text)
        if topic.keyword.casefold() not in clean.casefold():
            raise AssertionError(f"question {text!r} does not contain its topic keyword {topic.keyword!r}")
        row = {
            "id": _question_id(k, topic, phrasing), "question": clean, "category": topic.category,
            "lang": topic.lang, "keywords": [topic.keyword], "difficulty": difficulty,
            "rubric": {"extra": [compact_dimension(llm_twin(d) if d.id in LLM_JUDGED else d)
                                 for d in case_dimensions(topic)]},
        }
        (evals if eval_phrasing.get(k) == phrasing else train).append(row)
    return train, evals


# --------------------------------------------------------------------------------------------- SFT
def join_sentences(lang: str, sentences: Sequence[str]) -> str:
    """Sentences as one text: separated by spaces in English, run together in Chinese."""
    return ("" if lang == "zh" else " ").join(sentences)


def scaffold(lang: str, sentences: Sequence[str]) -> list[str]:
    """The sentences as a firstly/secondly/finally (首先/其次/最后) template: the first two marked, the rest
    joined after the third marker (fewer than three sentences: the last one is repeated)."""
    body = list(sentences)
    while len(body) < 3:
        body = body + [body[-1]]
    markers = TEMPLATE_MARKERS[lang]
    lower = (lambda s: s[0].lower() + s[1:]) if lang == "en" else (lambda s: s)
    return [markers[0] + lower(body[0]), markers[1] + lower(body[1])] + \
        [markers[2] + join_sentences(lang, [lower(body[2])] + body[3:])]


_ANSWER_RE = re.compile(r"^<think>(.*)</think><answer>(.*)</answer>$", re.DOTALL)
_SENTENCE_RE = re.compile(r"[^.!?。！？]+[.!?。！？]?")


def split_answer(response: str) -> tuple[str, str]:
    """(think, answer) text of a well-formed tiny answer `<think>…</think><answer>…</answer>`."""
    return _ANSWER_RE.fullmatch(response).groups()


def sentences(text: str) -> list[str]:
    """The sentences of an answer (each with its end mark, surrounding spaces removed)."""
    return [s.strip() for s in _SENTENCE_RE.findall(text) if s.strip()]


def scaffolded(lang: str, response: str) -> str:
    """A tiny answer with its answer text scaffolded as firstly/secondly/finally (首先/其次/最后)."""
    think, body = split_answer(response)
    return f"<think>{think}</think><answer>{join_sentences(lang, scaffold(lang, sentences(body)))}</answer>"


def sft_response(topic: Topic, rng: np.random.Generator) -> tuple[str, dict[str, bool]]:
    """One cold-start response for a topic, with independently drawn imperfections (returned as flags)."""
    size = rng.random()
    flags = {"phrase": rng.random() < SFT_P_PHRASE, "keyword": rng.random() < SFT_P_KEYWORD,
             "long": size < SFT_P_LONG, "short": SFT_P_LONG <= size < SFT_P_LONG + SFT_P_SHORT}
    # A padded answer is not also templated or repeated, which keeps every response within 128 tokens.
    flags["template"] = not flags["long"] and rng.random() < SFT_P_TEMPLATE
    flags["repeat"] = not flags["long"] and rng.random() < SFT_P_REPEAT
    return compose_response(topic, flags, rng), flags


def compose_response(topic: Topic, flags: dict[str, bool], rng: np.random.Generator) -> str:
    """A `<think>…</think><answer>…</answer>` response for a topic with exactly the features in `flags`."""
    group = (topic.category, topic.lang)
    frame = [FRAMES[group].format(keyword=topic.keyword)] if flags["keyword"] else []
    body = frame + [topic.extra] if flags["keyword"] else [topic.extra, topic.more]
    if flags["long"]:
        body = frame + [topic.extra, topic.more, FILLERS[group]]
    if flags["short"]:
        body = body[:1]
    if flags["repeat"]:
        body = body + [body[-1]]
    if flags["phrase"]:
        phrase = PHRASE_SENTENCES[group][int(rng.integers(2))]
        body = [phrase] + body if topic.category == CS and rng.random() < 0.5 else body + [phrase]
    if flags["template"]:
        body = scaffold(topic.lang, body)
    think = THINKS[group][int(rng.integers(2))]
    return f"<think>{think}</think><answer>{join_sentences(topic.lang, body)}</answer>"


def sft_rows(train: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cold-start response per training question, in shuffled order.

    More than QuRL's 64 because this model starts from random weights: with 64 pairs it memorises them
    and names the right topic on 13% of held-out questions; with one per training question it learns to
    copy the keyword (56%), which GRPO can then push further.
    """
    rng = np.random.default_rng(SEED + 1)
    topic_of = {t.keyword: t for t in TOPICS}
    rows = []
    for i in rng.permutation(len(train)):
        row = train[i]
        topic = topic_of[row["keywords"][0]]
        response, flags = sft_response(topic, rng)
        _check_flags(topic, response, flags)
        rows.append({"id": f"sft-{len(rows):03d}", "prompt": row["question"], "response": response,
                     "category": row["category"], "lang": row["lang"]})
    return rows


def golden_rows(train: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The golden set (tiny_content.GOLDEN): each question with a reference answer made with its listed
    features and labelled with them; none may be near a training question (the trainer would refuse it). Its
    criteria are the training rows' (politeness LLM-judged), so golden agreement on politeness measures the judge."""
    rng = np.random.default_rng(SEED + 2)
    topic_of = {t.keyword: t for t in TOPICS}
    rows = []
    for i, (keyword, question, features) in enumerate(GOLDEN):
        topic = topic_of[keyword]
        flags = {name: name in features for name in ("phrase", "keyword", "long", "short", "template", "repeat")}
        reference = compose_response(topic, flags, rng)
        _check_flags(topic, reference, flags)
        safety = "disclaimer" if topic.category == HEALTH else "politeness"
        rows.append({"id": f"golden-{topic.lang}-{i}", "question": question, "category": topic.category,
                     "lang": topic.lang, "keywords": [keyword],
                     "rubric": {"extra": [compact_dimension(llm_twin(d) if d.id in LLM_JUDGED else d)
                                          for d in case_dimensions(topic)]},
                     "reference": reference, "labels": {"topic_keyword": int(flags["keyword"]),
                                                        "template": int(not flags["template"]),
                                                        safety: int(flags["phrase"])}})
    near = dedup.cross_duplicates([r["question"] for r in rows], [r["question"] for r in train], 0.7)
    if near:
        raise AssertionError(f"golden questions near training ones: {near}")
    return rows


def _check_flags(topic: Topic, response: str, flags: dict[str, bool]) -> None:
    """The rule judges see exactly the imperfections that were drawn (so the SFT set is what we claim)."""
    scores = {d.id: float(make_rule(d.rule, d.params)([text.read(response, d.reads)])[0])
              for d in (*shared_rubric().dimensions, *case_dimensions(topic))}
    expected = {
        "format": True, "topic_keyword": flags["keyword"], "template": not flags["template"],
        "disclaimer" if topic.category == HEALTH else "politeness": flags["phrase"],
    }
    for dim_id, want in expected.items():
        if (scores[dim_id] == 1.0) != want:
            raise AssertionError(f"SFT response {response!r}: {dim_id} scored {scores[dim_id]}, flags {flags}")
    if flags["repeat"] and scores["redundancy"] == 1.0:
        raise AssertionError(f"SFT response {response!r}: repeats a sentence but scored redundancy 1")
    normal = not (flags["long"] or flags["short"] or flags["repeat"] or flags["template"])
    if normal and min(scores["length"], scores["redundancy"]) < 1.0:
        raise AssertionError(f"SFT response {response!r}: a clean response scored {scores}")


# --------------------------------------------------------------------------------- tokenizer, model
def train_tokenizer(texts: Sequence[str], vocab_size: int = VOCAB_SIZE,
                    model_max_length: int = MODEL["max_position_embeddings"],
                    split: str = PRE_TOKENIZER_SPLIT) -> PreTrainedTokenizerFast:
    """Byte-level BPE on the shipped texts (tags removed), wrapped with Qwen2 special tokens and template.

    `split` is the pre-tokenizer's regex: merges never cross the pieces it isolates."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS), special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = []
    for text in texts:
        for tag in TAG_TOKENS:
            text = text.replace(tag, " ")
        corpus.append(text)
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    if tok.get_vocab_size() != vocab_size:
        raise AssertionError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {vocab_size}")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"], clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE, model_max_length=model_max_length)


def model_config(tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """The tiny Qwen2 model (tied embeddings, vocab = tokenizer size); save_pretrained writes transformers-5 keys."""
    m = dict(MODEL)
    return Qwen2Config(
        vocab_size=len(tokenizer), tie_word_embeddings=True, architectures=["Qwen2ForCausalLM"],
        rope_parameters={"rope_theta": m.pop("rope_theta"), "rope_type": "default"},
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        dtype="float32", **m)


# The planted-hack runs' cold start (sft_hack.jsonl): each cold-start answer SFT_HACK_COPIES - 1 times as written
# and once scaffolded, so the policy can scaffold any question's answer, about 1 time in 8 (RubricRL's pretrained
# policy could write a template for any question). On sft.jsonl the tiny policy memorises one answer per question,
# 12.6% of them scaffolded, and GRPO never samples a template for the others (the planted-hack probes, README).
SFT_HACK_COPIES = 8
MAX_RESPONSE_TOKENS = 128  # configs/tiny.py's sft.max_response_len


def sft_hack_rows(sft: Sequence[dict[str, Any]], fits: Callable[[str], bool]) -> list[dict[str, Any]]:
    """sft.jsonl's rows SFT_HACK_COPIES times each, the last copy scaffolded unless the answer already follows a
    template or its scaffolded copy does not `fit` (the SFT response budget)."""
    rows = []
    for row in sft:
        twin = scaffolded(row["lang"], row["response"])
        if TemplatePhrases().matches([row["response"]])[0] or not fits(twin):
            twin = row["response"]
        rows += [{**row, "id": f"{row['id']}-{k}"} for k in range(SFT_HACK_COPIES - 1)]
        rows.append({**row, "id": f"{row['id']}-{SFT_HACK_COPIES - 1}", "response": twin})
    return rows


# ----------------------------------------------------------------------------------------- writing
def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def build(out: Path) -> dict[str, Any]:
    """Writes every asset into `out` and returns summary statistics."""
    out.mkdir(parents=True, exist_ok=True)
    train, evals = question_rows()
    sft = sft_rows(train)
    _write_jsonl(out / "questions_train.jsonl", train)
    _write_jsonl(out / "questions_eval.jsonl", evals)
    _write_jsonl(out / "sft.jsonl", sft)
    _write_jsonl(out / "questions_golden.jsonl", golden_rows(train))
    save_rubric(shared_rubric(), out / "rubric.yaml")
    save_rubric(hack_rubric(fixed=False), out / "rubric_hack.yaml")
    save_rubric(hack_rubric(fixed=True), out / "rubric_hack_fixed.yaml")

    texts = [r["question"] for r in train + evals] + [r["response"] for r in sft] + [data.SYSTEM_PROMPT]
    for t in TOPICS:
        texts += [t.extra, t.more, FRAMES[(t.category, t.lang)].format(keyword=t.keyword)]
    for group in THINKS:
        texts += [*THINKS[group], *PHRASE_SENTENCES[group], FILLERS[group]]
    texts += ["system", "user", "assistant", "You are a helpful assistant."]
    tokenizer = train_tokenizer(texts)
    tokenizer.save_pretrained(out / "tokenizer")
    model_config(tokenizer).save_pretrained(out)

    fits = lambda text: len(data.encode_responses(tokenizer, [text])[0]) <= MAX_RESPONSE_TOKENS  # noqa: E731
    sft_hack = sft_hack_rows(sft, fits)
    _write_jsonl(out / "sft_hack.jsonl", sft_hack)

    prompts = data.encode_prompts(tokenizer, [r["question"] for r in train + evals])
    responses = data.encode_responses(tokenizer, [r["response"] for r in sft])
    return {"train": len(train), "eval": len(evals), "sft": len(sft), "sft_hack": len(sft_hack),
            "sft_hack_templated": int(TemplatePhrases().matches([r["response"] for r in sft_hack]).sum()),
            "vocab": len(tokenizer),
            "max_prompt_tokens": max(map(len, prompts)), "max_response_tokens": max(map(len, responses)),
            "mean_response_tokens": float(np.mean([len(r) for r in responses]))}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TINY_DIR, help="output directory")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.out), indent=1))


if __name__ == "__main__":
    main()

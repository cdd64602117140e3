"""QuRL case-wise rubric construction end to end: retrieve -> meta-describe -> K candidate rubrics ->
score sampled answers with each -> filter -> merge -> R*(q) as question rows `{"rubric": {"replace": ...}}`.

Questions go through in batches of `questions_per_batch`. Within a batch each LLM step is ONE generator
call per round for all of the batch's questions (every document's meta-description together, all K
candidates of every question together, all answers together) and one RubricReward call for every
(question, candidate, answer). After each step the batch's state is written atomically to
`<work>/batch_NNNNN.json`. A rerun with the same settings skips what is done and resumes at the next
step; every random draw comes from keys derived from (seed, batch, step, round), so it writes exactly
what an uninterrupted build writes. A rerun with other settings (config, prompts, model, judge, input
files) is refused. Filtering and merging are pure functions of the saved state, run at the end.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from rubric_jax import sharding
from rubric_jax.data import Question, load_questions
from rubric_jax.files import open_input, write_atomic
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.loading import load_cascade, load_judges
from rubric_jax.qurl import construction, report
from rubric_jax.qurl.config import BuildConfig, BuildError
from rubric_jax.qurl.report import BuildResult
from rubric_jax.qurl.retrieval import BM25Index, Document, load_corpus, query_text, retrieve, tokenize
from rubric_jax.qurl.templates import PromptTemplate, load_template
from rubric_jax.qurl.textgen import (EndpointTextGenerator, ModelTextGenerator, TextGenerator, judge_from_model,
                                     judge_generator, load_language_model)
from rubric_jax.rubrics.schema import canonical_json, rubric_from_dict, rubric_to_dict
from rubric_jax.train.blocks import ExperimentConfig

TEMPLATES = ("meta_description", "rubric_generation", "answer")
STEPS = ("meta_description", "rubric_generation", "scoring")

def load_templates() -> dict[str, PromptTemplate]:
    """The prompt templates of a build, by name."""
    return {name: load_template(name) for name in TEMPLATES}


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (input fingerprints in the settings); a regular file only, read in chunks."""
    with open_input(path, "input") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def output_paths(out_dir: str | Path) -> dict[str, Path]:
    """Where a build writes: questions.jsonl, report.json and its work/ (checkpoint) directory."""
    out = Path(out_dir)
    return {"questions": out / "questions.jsonl", "report": out / "report.json", "work": out / "work"}


def check_output_dir(out_dir: str | Path, inputs: Sequence[str | Path]) -> None:
    """Refuse an --out that is a file, or whose outputs would overwrite an input."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BuildError(f"--out={out}: exists and is not a directory")
    paths = output_paths(out)
    for given in inputs:
        path = Path(given).resolve()
        if path in (paths["questions"].resolve(), paths["report"].resolve()) or paths["work"].resolve() in path.parents:
            raise BuildError(f"--out={out}: the build would overwrite the input {given}")


# ------------------------------------------------------------------------------------------- the build
@dataclasses.dataclass(frozen=True)
class _Context:
    config: BuildConfig
    templates: Mapping[str, PromptTemplate]
    generator: TextGenerator
    reward: RubricReward
    documents: Sequence[Document]
    index: BM25Index
    log: Callable[[str], None]


def build_settings(config: BuildConfig, templates: Mapping[str, PromptTemplate], **others: Any) -> dict[str, Any]:
    """What a work dir is made with: the build config, the prompts (version, sha256) and `others`
    (model, judge, mesh, input fingerprints); a resume must match them exactly."""
    prompts = {name: {"version": t.version, "sha256": t.sha256} for name, t in templates.items()}
    return json.loads(canonical_json({**others, "build": dataclasses.asdict(config), "prompts": prompts}))


def build_rubrics(questions: Sequence[Question], documents: Sequence[Document], config: BuildConfig,
                  templates: Mapping[str, PromptTemplate], generator: TextGenerator, reward: RubricReward,
                  work_dir: str | Path, settings: Mapping[str, Any],
                  log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> BuildResult:
    """Runs (or resumes, from `work_dir`) the construction; `settings` (build_settings) identify its work."""
    work = Path(work_dir)
    claim_work_dir(work, settings)
    index = BM25Index.build([tokenize(f"{d.title}\n{d.text}") for d in documents], config.bm25_k1, config.bm25_b)
    ctx = _Context(config, templates, generator, reward, documents, index, log)
    size = config.questions_per_batch
    batches = [list(questions[i:i + size]) for i in range(0, len(questions), size)]
    saved = [_run_batch(ctx, b, batch, work / f"batch_{b:05d}.json", len(batches)) for b, batch in enumerate(batches)]
    return report.finish(questions, saved, settings, config, templates)


def check_work_dir(work: Path, settings: Mapping[str, Any]) -> bool:
    """Whether `work` holds an earlier build; raises BuildError when that build used other settings."""
    path = work / "settings.json"
    if not path.exists():
        return False
    previous = json.loads(path.read_text(encoding="utf-8"))
    if previous != json.loads(canonical_json(settings)):
        changed = _changed_keys(previous, json.loads(canonical_json(settings)))
        raise BuildError(f"{path}: this build was started with other settings (changed: {', '.join(changed)}); "
                         "delete its directory or choose another --out")
    return True


def claim_work_dir(work: Path, settings: Mapping[str, Any]) -> None:
    """Record the settings in a new work dir, or check that a resumed one was made with the same ones."""
    if not check_work_dir(work, settings):
        text = json.dumps(json.loads(canonical_json(settings)), indent=2, ensure_ascii=False) + "\n"
        write_atomic(work / "settings.json", text)


def _changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves that differ between two JSON objects."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [prefix or "(all)"]
    return [path for k in sorted(set(old) | set(new))
            for path in _changed_keys(old.get(k), new.get(k), f"{prefix}.{k}" if prefix else k)]


def _run_batch(ctx: _Context, b: int, batch: list[Question], path: Path, num_batches: int) -> dict[str, Any]:
    """One batch through every step not yet done, saving after each; returns its final saved state."""
    ids = [q.id for q in batch]
    if path.exists():
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved["question_ids"] != ids:
            raise BuildError(f"{path}: holds questions {saved['question_ids'][:3]}..., not this batch's")
        if saved["steps_done"] < len(STEPS):
            ctx.log(f"batch {b + 1}/{num_batches}: resuming after step {saved['steps_done']} of {len(STEPS)}")
    else:
        saved = {"question_ids": ids, "steps_done": 0, "questions": [{"id": i, "dropped": None} for i in ids],
                 "calls": {}}
    batch_key = jax.random.fold_in(jax.random.key(ctx.config.seed), b)
    for step in range(saved["steps_done"], len(STEPS)):
        live = [(q, s) for q, s in zip(batch, saved["questions"]) if s["dropped"] is None]
        key = jax.random.fold_in(batch_key, step)
        calls = _STEP_FUNCTIONS[step](ctx, live, key) if live else {}
        saved["calls"][STEPS[step]] = calls
        saved["steps_done"] = step + 1
        write_atomic(path, json.dumps(saved, ensure_ascii=False) + "\n")
        failed = sum(s["dropped"] is not None for s in saved["questions"])
        ctx.log(f"batch {b + 1}/{num_batches}: {STEPS[step]} done ({len(live)} question(s), calls {calls}); "
                f"{failed} of {len(batch)} question(s) dropped so far")
    return saved


def _failure(outcome: construction.Outcome) -> str | None:
    """The last reason of a failed outcome, or None when it succeeded."""
    return None if outcome.value is not None else outcome.reasons[-1]


def _describe(ctx: _Context, live: list[tuple[Question, dict]], key: jax.Array) -> dict[str, int]:
    """Retrieval, then every retrieved document's meta-description (one call per round for the batch)."""
    cfg, requests = ctx.config, []
    for q, state in live:
        found = retrieve(ctx.index, ctx.documents, query_text(q.question, q.keywords), top_k=cfg.top_k,
                         pool=cfg.retrieval_pool, min_relevance=cfg.min_relevance)
        state["documents"] = [{"doc_id": r.document.doc_id, "title": r.document.title, "bm25": r.bm25,
                               "quality": r.document.quality,
                               "truncated": len(r.document.text) > cfg.max_document_chars} for r in found]
        requests += [(q, r.document, state["documents"][i]) for i, r in enumerate(found)]
        if cfg.top_k and not found:
            state["dropped"] = "retrieval: no document is relevant to the question's query"
    template = ctx.templates["meta_description"]
    outcomes, calls = construction.generate_validated(
        ctx.generator,
        lambda r, nonce: construction.meta_prompt(template, requests[r][0].question, requests[r][1],
                                                  max_chars=cfg.max_document_chars, max_words=cfg.meta_max_words,
                                                  nonce=nonce, reserved=ctx.generator.reserved),
        len(requests), construction.valid_meta_description, key, samples=1, max_retries=cfg.max_retries,
        max_new_tokens=cfg.meta_max_new_tokens)
    for (_, _, doc_state), (outcome,) in zip(requests, outcomes):
        doc_state.update(meta=outcome.value, attempts=outcome.attempts, reasons=outcome.reasons)
    for _, state in live:
        if state["dropped"] is None and state["documents"] and all(d["meta"] is None for d in state["documents"]):
            state["dropped"] = "meta_description: no document got a valid meta-description"
    return {"generate_calls": calls}


def _generate(ctx: _Context, live: list[tuple[Question, dict]], key: jax.Array) -> dict[str, int]:
    """K candidate rubrics per question (one call per round for the batch), parsed strictly."""
    cfg, template = ctx.config, ctx.templates["rubric_generation"]
    references = [[(d["title"], d["meta"]) for d in state["documents"] if d["meta"] is not None] for _, state in live]

    def prompt(r: int, nonce: str):
        return construction.rubric_prompt(template, live[r][0].question, references[r], min_criteria=cfg.min_criteria,
                                          max_criteria=cfg.max_criteria, max_points=cfg.max_points, nonce=nonce,
                                          reserved=ctx.generator.reserved)

    changelog = report.changelog_entry(cfg, ctx.templates, "candidate rubric")

    def validate(r: int, text: str) -> construction.Candidate:
        return construction.parse_candidate(
            text, name=f"qurl/{live[r][0].id}/candidate", changelog=changelog, num_references=len(references[r]),
            min_criteria=cfg.min_criteria, max_criteria=cfg.max_criteria, max_points=cfg.max_points)

    outcomes, calls = construction.generate_validated(
        ctx.generator, prompt, len(live), validate, key, samples=cfg.num_candidates, max_retries=cfg.max_retries,
        max_new_tokens=cfg.rubric_max_new_tokens)
    for (_, state), per_sample in zip(live, outcomes):
        state["candidates"] = [
            {"rubric": None if o.value is None else rubric_to_dict(o.value.rubric),
             "cites": None if o.value is None else {k: list(v) for k, v in o.value.cites.items()},
             "attempts": o.attempts, "reasons": o.reasons} for o in per_sample]
        if all(o.value is None for o in per_sample):
            state["dropped"] = f"rubric_generation: no valid candidate in {cfg.num_candidates} sample(s)"
    return {"generate_calls": calls}


def _score(ctx: _Context, live: list[tuple[Question, dict]], key: jax.Array) -> dict[str, Any]:
    """Sample answers (one call), then score them with every valid candidate (one RubricReward call)."""
    cfg = ctx.config
    answer_key, judge_key = jax.random.split(key)
    template = ctx.templates["answer"]
    outcomes, answer_calls = construction.generate_validated(
        ctx.generator, lambda r, nonce: template.render(question=live[r][0].question), len(live),
        lambda r, text: text, answer_key, samples=cfg.num_answers, max_retries=0,
        max_new_tokens=cfg.answer_max_new_tokens, accept_truncated=True)
    rows: list[tuple[int, int, int]] = []
    for r, ((_, state), per_sample) in enumerate(zip(live, outcomes)):
        state["answers"] = [{"text": o.value, "failure": _failure(o)} for o in per_sample]
        valid = [k for k, c in enumerate(state["candidates"]) if c["rubric"] is not None]
        usable = [m for m, a in enumerate(state["answers"]) if a["text"] is not None]
        rows += [(r, k, m) for k in valid for m in usable]
        state["rewards"] = [None if c["rubric"] is None else [None] * cfg.num_answers for c in state["candidates"]]
    calls: dict[str, Any] = {"generate_calls": answer_calls, "reward_rows": len(rows)}
    if rows:
        rubrics = {(r, k): rubric_from_dict(live[r][1]["candidates"][k]["rubric"]) for r, k, _ in rows}
        scored = ctx.reward([live[r][0].question for r, _, _ in rows],
                            [live[r][1]["answers"][m]["text"] for r, _, m in rows],
                            [rubrics[r, k] for r, k, _ in rows], key=judge_key)
        for (r, k, m), value, ok in zip(rows, scored.reward, scored.details["reward_ok"]):
            live[r][1]["rewards"][k][m] = float(value) if ok else None
        calls.update({name: value for name, value in scored.details.items()
                      if name.startswith("judge_") and isinstance(value, (int, list))})
    return calls


_STEP_FUNCTIONS = (_describe, _generate, _score)


def write_outputs(out_dir: str | Path, result: BuildResult) -> None:
    """questions.jsonl (one row per kept question) and report.json, each written atomically."""
    paths = output_paths(out_dir)
    write_atomic(paths["questions"], "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in result.rows))
    write_atomic(paths["report"], json.dumps(result.report, indent=2, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------------------- from a config
def run_build(config: ExperimentConfig, questions_path: str, corpus_path: str, out_dir: str,
              log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> BuildResult:
    """The whole build from an experiment's blocks (`model`, `judge`, `mesh`, `seed`, `qurl`): checks
    every input, loads the model once, builds (or resumes), writes OUT/questions.jsonl and
    OUT/report.json. The construction model also judges unless `judge.checkpoint` names judge(s) or the judge is
    an endpoint; with qurl.generator=judge that endpoint writes too, and no model is loaded."""
    build_config = dataclasses.replace(config.qurl, seed=config.seed)
    judge_spec = config.judge
    if build_config.generator == "judge" and judge_spec.backend != "openai":
        raise BuildError(f"qurl.generator=judge writes through the judge's endpoint: config.judge.backend="
                         f"{judge_spec.backend!r} has none (set backend=openai, base_url and model)")
    mesh_config = sharding.MeshConfig(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    mesh_config.axis_sizes(len(jax.devices()))
    for name, path in (("questions", questions_path), ("corpus", corpus_path)):
        if not Path(path).is_file():
            raise BuildError(f"--{name}={path}: file does not exist")
    check_output_dir(out_dir, [questions_path, corpus_path])
    questions = load_questions(questions_path)
    documents = load_corpus(corpus_path)
    templates = load_templates()
    settings = build_settings(
        build_config, templates, model=config.model.to_values(), judge=config.judge.to_values(),
        mesh=config.mesh.to_values(), inputs={"questions_sha256": file_sha256(questions_path),
                                            "corpus_sha256": file_sha256(corpus_path)})
    work = output_paths(out_dir)["work"]
    check_work_dir(work, settings)  # before the slow load; nothing is written until the model has loaded

    layout = sharding.decode_layout(sharding.make_mesh(mesh_config), config.mesh.rollout.tensor)
    judges = load_judges(judge_spec, layout, where="config.judge")
    if build_config.generator == "judge":
        generator, writer = judge_generator(judges[0], build_config.sampler), judges[0].name
    else:
        model = load_language_model(
            checkpoint=config.model.checkpoint, config_json=config.model.config_json,
            tokenizer_dir=config.model.tokenizer, layout=layout, seed=config.seed, param_dtype=config.model.param_dtype,
            compute_dtype=config.model.compute_dtype, remat=config.model.remat, scan_layers=config.model.scan_layers)
        judges = judges or (judge_from_model(model, sampler=judge_spec.sampler,
                                             max_new_tokens=judge_spec.max_new_tokens),)
        generator, writer = ModelTextGenerator(model, build_config.sampler), model.name
    reward = RubricReward(judges=judges, judge_spec=judge_spec,
                          refiners=load_cascade(judge_spec, layout, where="config.judge"))
    log(f"building rubrics for {len(questions)} question(s) from {len(documents)} document(s) with {writer}")
    result = build_rubrics(questions, documents, build_config, templates, generator, reward, work, settings, log)
    result.report["inputs"] = {"questions": str(questions_path), "corpus": str(corpus_path)}
    result.report["generator"] = {"name": writer, **_usage(generator)}
    write_outputs(out_dir, result)
    return result


def _usage(generator: TextGenerator) -> dict[str, Any]:
    """An endpoint writer's judge_http_* counters (requests, tokens, retries, failures, latency percentiles)."""
    if not isinstance(generator, EndpointTextGenerator):
        return {}
    return generator.stats.summary()


"""The evaluation harness behind `experiments.evaluate`: a benchmark's cases -> the policy's answers
(batched sampler, one call per batch) -> judge verdicts (RubricReward, one batched judge pass per batch)
-> the benchmark's own formula -> records.jsonl, summary.json, table.md, plot.png in `--out`.

Inputs are read and checked before any model is loaded, so bad input fails in about a second; nothing
is written until every number is computed, and each file is written atomically (report.py). The
policy is loaded once, answers every case, and is released before the judge models are loaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rubric_jax import data, files, metrics, text
from rubric_jax.evaluation import biggen, healthbench, hellobench, longbench_write, report, rubric_set
from rubric_jax.evaluation.results import FINISH_PROMPT_TOO_LONG, Answer, Benchmark, EvalFailed, EvalInputError
from rubric_jax.judges.http_backend import HTTP_COUNTERS
from rubric_jax.rubrics.importers import RubricCase
from rubric_jax.rubrics.schema import Rubric

if TYPE_CHECKING:  # jax, the sampler and the judges load in seconds: only `run` imports them
    import jax

    from rubric_jax.evaluation.policy import Policy
    from rubric_jax.judges.reward import RubricReward
    from rubric_jax.judges.spec import JudgeSpec
    from rubric_jax.judges.store import VerdictStore

BENCHMARKS = ("hellobench", "longbench_write", "healthbench", "biggen", "rubric_set")
PROMPT_FORMATS = ("plain", "think_answer")
WHICH = ("latest", "best")  # --workdir checkpoints: the newest, or the highest logged held-out reward
UNBOUNDED_JUDGE_PROMPT = 1 << 30  # load_judge caps it at the judge's context minus its answer budget
JUDGE_ANSWERS_PER_PASS = 64  # answers per reward call (one batched judge pass; judge.batch_size bounds its calls)
# RubricReward's judge counters summed over the judge passes into summary.json (llm_judge.judge_rows).
JUDGE_COUNTERS = ("judge_prompts", "judge_generate_calls", "judge_invalid", "judge_retried", "judge_prompt_too_long",
                  "judge_scores", "judge_failed_samples", "judge_failed_scores", "judge_store_hits",
                  "judge_store_mismatches", "judge_store_unsaved", *HTTP_COUNTERS)
# A cascade's (judges/cascade.py): items screened, escalated to the refining judge, and its prompts; reported with a cascade.
CASCADE_COUNTERS = ("judge_cascade_screened", "judge_cascade_escalated", "judge_cascade_prompts")


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """How the policy answers: sampler, budget, prompts per sampler call, prompt format, seed."""

    sampler: str = "greedy"
    max_new_tokens: int = 2048
    batch_size: int = 16
    prompt_format: str = "plain"  # "plain": the benchmark's prompt; "think_answer": rubric_jax's training format
    seed: int = 0


def benchmark_named(name: str, shared_rubric: Rubric | None = None) -> Benchmark:
    """The Benchmark called `name` (rubric_set: with the optional shared rubric)."""
    if name == "rubric_set":
        return rubric_set.make_benchmark(shared_rubric)
    if shared_rubric is not None:
        raise EvalInputError(f"--rubric is only used by --config.benchmark=rubric_set, not {name}")
    known = {b.name: b for b in (hellobench.BENCHMARK, longbench_write.BENCHMARK, healthbench.BENCHMARK,
                                 biggen.BENCHMARK)}
    if name not in known:
        raise EvalInputError(f"--config.benchmark={name}: unknown benchmark; expected one of {list(BENCHMARKS)}")
    return known[name]


def check_out(out: Path, inputs: Sequence[Path], input_dirs: Sequence[Path]) -> None:
    """`out` must not be, contain, or lie inside an input (a run's workdir may hold `out` below it)."""
    try:
        files.check_output_dir(out, inputs, input_dirs)
    except files.PathError as e:
        raise EvalInputError(str(e)) from None


# ------------------------------------------------------------------------------------------ prompts

def policy_messages(case: RubricCase, prompt_format: str) -> list[dict[str, str]]:
    """The chat the policy answers: the case's system prompt (and, in think_answer format, the training
    format instruction) as the system turn, then the case's turns (a text prompt is one user turn)."""
    if isinstance(case.prompt, str):
        turns = [{"role": "user", "content": case.prompt}]
    else:
        turns = [dict(t) for t in case.prompt]
    systems = [case.meta["system_prompt"]] if case.meta.get("system_prompt") else []
    if prompt_format == "think_answer":
        systems.append(data.SYSTEM_PROMPT)
    return ([{"role": "system", "content": "\n\n".join(systems)}] if systems else []) + turns


def judge_question(case: RubricCase, show_reference: bool) -> str:
    """What the judge is shown as the question: the prompt (a conversation as 'role: content' turns, as
    HealthBench's grader sees it), plus the reference answer where the benchmark shows one (Prometheus)."""
    if isinstance(case.prompt, str):
        text = case.prompt
    else:
        text = data.conversation_text(case.prompt)
    if show_reference and case.reference:
        text += f"\n\n[Reference answer, worth the top score]\n{case.reference}"
    return text


def answer_part(response: str, prompt_format: str) -> tuple[str, bool | None]:
    """(the answer, format ok): the answer as every judge reads it (text.parts: a plain response is all answer);
    format ok (think_answer format only) when it came from a closed <answer>...</answer>."""
    parts = text.parts(response)
    return parts.answer, (None if prompt_format == "plain" else parts.answer_closed)


# ------------------------------------------------------------------------------------------ generation

@dataclasses.dataclass(frozen=True)
class Generated:
    """One case's raw generation (before judging)."""

    response: str | None
    finish_reason: str
    tokens: int


def generate_answers(policy: Policy, cases: Sequence[RubricCase], settings: GenerationSettings,
                     key: jax.Array) -> list[Generated]:
    """Answers every case with `policy.generate`, `batch_size` prompts per call, longest prompts first
    (each batch pads to one length bucket); a prompt that cannot fit the context with max_new_tokens is
    not generated and is marked FINISH_PROMPT_TOO_LONG. When no prompt fits, nothing is generated: an
    EvalInputError names config.policy.max_new_tokens and the policy's context."""
    import jax  # imported here: jax takes seconds, and bad input must fail before it

    prompt_ids = data.encode_chats(policy.tokenizer, [policy_messages(c, settings.prompt_format) for c in cases])
    out: list[Generated | None] = [None] * len(cases)
    fits = []
    for i, ids in enumerate(prompt_ids):
        if len(ids) + settings.max_new_tokens > policy.context_length:
            out[i] = Generated(None, FINISH_PROMPT_TOO_LONG, 0)
        else:
            fits.append(i)
    if not fits:
        raise EvalInputError(
            f"--config.policy.max_new_tokens={settings.max_new_tokens}: no case fits the policy's {policy.context_length}-token "
            f"context with that many new tokens (the shortest prompt is {min(map(len, prompt_ids))} tokens); "
            "lower --config.policy.max_new_tokens")
    order = sorted(fits, key=lambda i: -len(prompt_ids[i]))
    batches = [order[k:k + settings.batch_size] for k in range(0, len(order), settings.batch_size)]
    progress = metrics.Progress(len(batches), desc="generate", keys=())
    for b, batch in enumerate(batches):
        result = policy.generate([prompt_ids[i] for i in batch], jax.random.fold_in(key, b))
        texts = data.decode_responses(policy.tokenizer, result, policy.stop_tokens)
        for i, text, reason, length in zip(batch, texts, result.finish_reason, result.lengths):
            out[i] = Generated(text, str(reason), int(length))
        progress.update(b + 1, {})
    progress.close()
    return out


def judge_answers(reward: RubricReward, cases: Sequence[RubricCase], generated: Sequence[Generated],
                  prompt_format: str, show_reference: bool, batch_size: int, key: jax.Array,
                  store: VerdictStore | None = None) -> tuple[list[Answer], dict[str, int]]:
    """Answers with the judge's raw scores and the rubric reward, scoring `batch_size` answers per reward
    call (each one batched judge pass, every one with `key`: a judge prompt depends on its own content only,
    so `store` finds it in any batch); cases without a rubric or an answer are not judged. The reward gets
    the whole response: each dimension reads its part of it (RubricReward)."""
    parts = [(None, None) if g.response is None else answer_part(g.response, prompt_format) for g in generated]
    todo = [i for i, c in enumerate(cases) if c.rubric is not None and generated[i].response is not None]
    raw: dict[int, np.ndarray] = {}
    rewards: dict[int, float] = {}
    counters = dict.fromkeys(JUDGE_COUNTERS, 0)
    batches = [todo[k:k + batch_size] for k in range(0, len(todo), batch_size)]
    progress = metrics.Progress(len(batches), desc="judge", keys=())
    for b, batch in enumerate(batches):
        result = reward([judge_question(cases[i], show_reference) for i in batch],
                        [generated[i].response for i in batch],
                        [cases[i].rubric for i in batch], key=key, store=store)
        column = {dim_id: c for c, dim_id in enumerate(result.dimension_ids)}
        for row, i in enumerate(batch):
            raw[i] = result.details["raw_scores"][row, [column[d] for d in cases[i].rubric.dimension_ids]]
            if result.details["reward_ok"][row]:
                rewards[i] = float(result.reward[row])
        for name in JUDGE_COUNTERS:
            counters[name] += result.details.get(name, 0)  # rule-only batches run no judge
        for name in (n for n in CASCADE_COUNTERS if n in result.details):
            counters[name] = counters.get(name, 0) + result.details[name]
        progress.update(b + 1, {})
    progress.close()
    if "judge_cascade_screened" in counters:
        from rubric_jax.judges.llm_judge import escalated_frac  # jax is loaded: a reward judged

        counters["judge_cascade_escalated_frac"] = escalated_frac(counters)
    answers = [Answer(g.response, g.finish_reason, g.tokens, text, ok, raw.get(i), rewards.get(i))
               for i, (g, (text, ok)) in enumerate(zip(generated, parts))]
    return answers, counters


# ------------------------------------------------------------------------------------------ the run

@dataclasses.dataclass(frozen=True)
class Evaluation:
    """A validated evaluation: the benchmark, its cases and everything needed to answer and judge them."""

    benchmark: Benchmark
    cases: list[RubricCase]
    data: dict[str, Any]  # where the cases came from (summary.json)
    out: Path


def prepare(benchmark_name: str, data_dir: Path, data_file: str | None, limit: int | None, out: Path,
            judge: JudgeSpec, inputs: Sequence[Path], input_dirs: Sequence[Path],
            shared_rubric: Rubric | None = None) -> Evaluation:
    """Reads and checks the benchmark's cases, the judge need and `out` (no model is touched)."""
    benchmark = benchmark_named(benchmark_name, shared_rubric)
    if not data_dir.is_dir():
        raise EvalInputError(f"--data_dir={data_dir}: directory does not exist")
    check_out(out, inputs, input_dirs)
    cases = benchmark.load_cases(data_dir, data_file, limit)
    if not cases:
        raise EvalInputError(f"--data_dir={data_dir}: no {benchmark.name} cases to evaluate")
    needs_judge = [(c.rubric, d) for c in cases for d in c.rubric.dimensions if d.judged]
    if needs_judge and not judge.has_judge:
        if not benchmark.judge_optional:
            rubric, dim = needs_judge[0]
            raise EvalInputError(f"--judge.checkpoint: {benchmark.name} is scored by an LLM judge (rubric "
                                 f"{rubric.name!r}, dimension {dim.id!r}); give --judge.checkpoint=DIR")
        cases = [dataclasses.replace(c, rubric=None) for c in cases]
    return Evaluation(benchmark, cases, {"data_dir": str(data_dir), "data_file": data_file, "limit": limit}, out)


def _counts(answers: Sequence[Answer]) -> dict[str, int]:
    counts = {"cases": len(answers), "generated": sum(a.response is not None for a in answers),
              "prompt_too_long": sum(a.finish_reason == FINISH_PROMPT_TOO_LONG for a in answers),
              "truncated_at_max_new_tokens": sum(a.finish_reason == "length" for a in answers),
              "judged": sum(a.judged for a in answers),
              "judged_with_missing_scores": sum(a.judged and bool(np.isnan(a.raw_scores).any()) for a in answers)}
    if any(a.format_ok is not None for a in answers):
        counts["format_ok"] = sum(bool(a.format_ok) for a in answers)
    return counts


def check_scored(cases: Sequence[RubricCase], answers: Sequence[Answer], counters: Mapping[str, int],
                 out: Path) -> None:
    """Raises EvalFailed when cases were to be judged but no judged answer has a single score (every judge
    prompt too long, every verdict unparseable, every rule failed): its benchmark scores would be made up."""
    judged = [a for c, a in zip(cases, answers) if c.rubric is not None and a.judged]
    if judged and all(np.isnan(a.raw_scores).all() for a in judged):
        causes = ", ".join(f"{name} {counters[name]}" for name in ("judge_prompts", "judge_prompt_too_long",
                                                                   "judge_invalid", "judge_http_failures")
                           if counters.get(name))
        raise EvalFailed(f"none of the {len(judged)} judged answers got a score ({causes or 'every rule failed'}); "
                         f"the report in {out} keeps the answers, its scores mean nothing")


def _record(case: RubricCase, answer: Answer, fields: Mapping[str, Any]) -> dict[str, Any]:
    prompt = case.prompt if isinstance(case.prompt, str) else [dict(t) for t in case.prompt]
    record = {"id": case.case_id, **fields, "prompt": prompt, "response": answer.response,
              "finish_reason": answer.finish_reason, "response_tokens": answer.tokens}
    if answer.format_ok is not None:
        record["format_ok"] = answer.format_ok
    return record


def _check_rules(cases: Sequence[RubricCase]) -> None:
    """Builds every rule judge once, so a bad rule name or parameter fails before any model loads."""
    from rubric_jax.judges.rules import RuleError, make_rule

    seen = set()
    for rubric in (c.rubric for c in cases if c.rubric is not None):
        if rubric.content_hash in seen:
            continue
        seen.add(rubric.content_hash)
        for dim in rubric.dimensions:
            if dim.takes_rule:
                try:
                    make_rule(dim.rule, dim.params)
                except RuleError as e:
                    raise EvalInputError(f"rubric {rubric.name!r}: dimension {dim.id!r}: {e}") from None


def run(evaluation: Evaluation, *, checkpoint: Path | None, workdir: Path | None, which: str,
        mesh_axes: tuple[int, int, int], generation: GenerationSettings, judge: JudgeSpec,
        calibration: Mapping[str, Any] | None = None, store: VerdictStore | None = None) -> dict[str, Any]:
    """Answers, judges (`judge`: its mode resolved for the benchmark) and scores every case, writes the report
    into `evaluation.out`; returns summary.json, which records the judge (hash, fields, weights) and the
    start-up `calibration` check, if any. The judge reads and writes `store` (judges/store.py): a re-run judges
    only answers it has not seen."""
    import jax  # imported here: bad input is rejected (prepare) before jax, flax and transformers load

    from rubric_jax import sharding
    from rubric_jax.evaluation.policy import load_policy
    from rubric_jax.judges.reward import RubricReward
    from rubric_jax.judges.loading import load_cascade, load_judges
    from rubric_jax.judges.spec import describe

    benchmark, cases = evaluation.benchmark, evaluation.cases
    try:
        mesh = sharding.make_mesh(sharding.MeshConfig(*mesh_axes))
    except ValueError as e:
        raise EvalInputError(str(e)) from None
    _check_rules(cases)
    generation_key, judge_key = jax.random.split(jax.random.key(generation.seed))
    judge = judge.for_benchmark(benchmark.judge_mode)

    def judges_of() -> tuple:
        """The judges and the cascade's refining judges (empty without one)."""
        try:
            # Prompts as long as the judge's context allows (benchmark prompts can be long articles).
            return tuple(load(judge, mesh, where="--judge", max_prompt_tokens=UNBOUNDED_JUDGE_PROMPT)
                         for load in (load_judges, load_cascade))
        except ValueError as e:
            raise EvalInputError(str(e)) from None

    # An endpoint holds no memory here: it is checked before any answer is generated.
    judges = judges_of() if judge.backend == "openai" else None
    policy = load_policy(checkpoint=checkpoint, workdir=workdir, which=which, mesh=mesh, sampler=generation.sampler,
                         max_new_tokens=generation.max_new_tokens)
    policy_name, policy_source = policy.name, policy.source
    generated = generate_answers(policy, cases, generation, generation_key)
    del policy  # free the policy's parameters before the judges load
    judges = judges if judges is not None else judges_of()
    reward = RubricReward(judges=judges[0], judge_spec=judge, refiners=judges[1])
    answers, judge_counters = judge_answers(reward, cases, generated, generation.prompt_format,
                                            benchmark.judge_sees_reference, JUDGE_ANSWERS_PER_PASS, judge_key, store)
    result = benchmark.score(cases, answers)
    summary = {"benchmark": benchmark.name, "policy": policy_name, "policy_source": policy_source,
               "judge": describe(judge), "judge_mode": judge.mode, "calibration": calibration,
               "data": evaluation.data, "generation": dataclasses.asdict(generation),
               "counts": _counts(answers), "judge_counters": judge_counters, "scores": result.scores}
    records = [_record(c, a, r) for c, a, r in zip(cases, answers, result.records)]
    report.write_report(evaluation.out, f"{benchmark.name}: {policy_name}", result, summary, records)
    check_scored(cases, answers, judge_counters, evaluation.out)
    return summary


def score_judgements(judgements: Path, data_dir: Path, models: Sequence[str] | None, out: Path) -> dict[str, Any]:
    """HelloBench scores of published judgements (no model): summary {"models": ..., "incomplete": [...]}."""
    if not judgements.is_file():
        raise EvalInputError(f"--judgements={judgements}: file does not exist")
    if not data_dir.is_dir():
        raise EvalInputError(f"--data_dir={data_dir}: directory does not exist")
    check_out(out, [judgements], [data_dir])
    result = hellobench.score_published_judgements(judgements, data_dir, models)
    report.write_report(out, f"HelloBench from published judgements ({judgements.name})", result, result.scores,
                        result.records)
    return result.scores

"""Gates first and the judge cascade on the tiny default's responses (issue 19 §4), in one run.

  PYTHONPATH=. .venv/bin/python benchmarks/bench_cascade.py --samples=WORKDIR/samples.jsonl \
      [--first_samples=3] [--first_sampler=greedy] [--refiner_samples=5] [--refiner_sampler=greedy]

Input: a tiny-default run's samples.jsonl (experiments.run --config=configs/tiny.py writes the GRPO rollouts and eval
answers it logs there); each row is scored with the tiny rubric plus its question's case-wise criteria (the politeness
criterion is the LLM-judged one), as training scores it.

Gates first: the reward of every row with `gates_first` off and on (RubricReward; the tiny judge of
configs/judges/tiny.py): the judge prompts of each, the prompts saved, and a check that rewards and ok flags are
identical (the script fails otherwise).

Cascade: the rows with an LLM-judged criterion, judged three ways with gates first off (every item judged):
the first judge alone (configs/judges/tiny.py, i.e. rubric_jax/assets/tiny_judge, with --first_samples and
--first_sampler), the refining judge alone (configs/judges/tiny_fixed.py, i.e. tiny_judge_fixed, with --refiner_*),
and the cascade of the two (judge.cascade; default thresholds: escalate on any sample disagreement, a failed gate or no
verdict). Each is run twice with the same key and the second run timed (the first compiles every shape): wall and
process CPU seconds, items/s. Agreement of the cascade (and of the first judge) with the refiner alone: exact
agreement and Spearman over the items both scored; and of each with the criterion's teacher (the keyword rule the
tiny judges were distilled from, on the part the criterion reads). Prints one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags

from rubric_jax import data, text
from rubric_jax.assets import TINY_DIR
from rubric_jax.assets.tiny_content import POLITE_PHRASES
from rubric_jax.calibration.stats import spearman
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.rules import make_rule
from rubric_jax.judges.loading import load_cascade, load_judges
from rubric_jax.judges.spec import JudgeSpec, load_judge_file
from rubric_jax.rubrics.io import load_rubric

_SAMPLES = flags.DEFINE_string("samples", None, "A tiny-default run's samples.jsonl (question, response per line).")
_FIRST_SAMPLES = flags.DEFINE_integer("first_samples", 3, "Samples of the first (screening) judge.")
_FIRST_SAMPLER = flags.DEFINE_string("first_sampler", "greedy", "Sampler of the first judge.")
_REFINER_SAMPLES = flags.DEFINE_integer("refiner_samples", 5, "Samples of the refining judge.")
_REFINER_SAMPLER = flags.DEFINE_string("refiner_sampler", "greedy", "Sampler of the refining judge.")
_SEED = flags.DEFINE_integer("seed", 0, "Judging key.")
flags.mark_flag_as_required("samples")
REPO = Path(__file__).resolve().parents[1]
FIRST_FILE, REFINER_FILE = REPO / "configs/judges/tiny.py", REPO / "configs/judges/tiny_fixed.py"


def tiny_rows(samples: Path) -> tuple[list[str], list[str], list, list[str]]:
    """Questions, responses, rubrics (the tiny rubric with each question's case-wise criteria) and the questions'
    languages of `samples`."""
    shared = load_rubric(TINY_DIR / "rubric.yaml")
    by_text = {q.question: q for name in ("questions_train", "questions_eval", "questions_golden")
               for q in data.load_questions(TINY_DIR / f"{name}.jsonl")}
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    unknown = sorted({r["question"] for r in rows} - set(by_text))
    if unknown:
        raise SystemExit(f"--samples={samples}: {len(unknown)} question(s) are not the tiny default's, e.g. {unknown[0]!r}")
    return ([r["question"] for r in rows], [r["response"] for r in rows],
            [data.question_rubric(shared, by_text[r["question"]]) for r in rows], [by_text[r["question"]].lang for r in rows])


def teacher_scores(responses, rubrics, langs) -> np.ndarray:
    """The politeness criterion's teacher (the keyword rule the tiny judges were distilled from, build_tiny_assets
    .case_dimensions) on the part the criterion reads, per LLM item in llm_scores' order."""
    dims = [[d for d in r.dimensions if d.kind == "llm"] for r in rubrics]
    if {d.id for row in dims for d in row} != {"politeness"}:
        raise SystemExit("the tiny rows' only LLM-judged criterion should be politeness")
    return np.array([make_rule("keywords", {"words": list(POLITE_PHRASES[lang]), "mode": "any"})(
        [text.read(response, d.reads)])[0] for response, row, lang in zip(responses, dims, langs) for d in row])


def timed_twice(reward: RubricReward, questions, responses, rubrics, key) -> tuple[object, float, float]:
    """The reward of the rows, scored twice with `key`; the second call's wall and process CPU seconds."""
    reward(questions, responses, rubrics, key=key)
    wall, cpu = time.perf_counter(), time.process_time()
    out = reward(questions, responses, rubrics, key=key)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def llm_scores(out, rubrics) -> np.ndarray:
    """The raw scores of every row's LLM dimensions, flattened in row order (NaN = no verdict)."""
    column = {d: c for c, d in enumerate(out.dimension_ids)}
    return np.array([out.details["raw_scores"][n, column[d.id]] for n, r in enumerate(rubrics)
                     for d in r.dimensions if d.kind == "llm"])


def agreement(x: np.ndarray, y: np.ndarray) -> dict[str, float | int | None]:
    both = ~np.isnan(x) & ~np.isnan(y)
    return {"items": int(both.sum()), "exact": float((x[both] == y[both]).mean()) if both.any() else None,
            "spearman": spearman(x[both], y[both]).value}


def main(argv: list[str]) -> None:
    del argv
    questions, responses, rubrics, langs = tiny_rows(Path(_SAMPLES.value))
    key = jax.random.key(_SEED.value)
    tiny = JudgeSpec.from_config(load_judge_file(FIRST_FILE), str(FIRST_FILE))
    judges = load_judges(tiny)
    gates = {}
    for on in (False, True):
        gates[on] = RubricReward(rubrics, judges, tiny, gates_first=on)(questions, responses, rubrics, key=key)
    if not (np.array_equal(gates[True].reward, gates[False].reward)
            and np.array_equal(gates[True].details["reward_ok"], gates[False].details["reward_ok"])):
        raise SystemExit("gates first changed a reward")
    result = {"rows": len(responses), "gates_first": {
        "judge_prompts_off": gates[False].details["judge_prompts"], "judge_prompts_on": gates[True].details["judge_prompts"],
        "judge_prompts_gated": gates[True].details["judge_prompts_gated"], "gated_scores": gates[True].details["gated_scores"],
        "rewards_identical": True}}

    judged = [n for n, r in enumerate(rubrics) if any(d.kind == "llm" for d in r.dimensions)]
    q, r, rb, lang = ([xs[n] for n in judged] for xs in (questions, responses, rubrics, langs))
    block = load_judge_file(FIRST_FILE)
    block.update(samples=_FIRST_SAMPLES.value, sampler=_FIRST_SAMPLER.value, cascade=str(REFINER_FILE))
    cascaded = JudgeSpec.from_config(block, "first judge")
    cascaded = dataclasses.replace(cascaded, cascade=dataclasses.replace(
        cascaded.cascade, samples=_REFINER_SAMPLES.value, sampler=_REFINER_SAMPLER.value))
    first, refiner = dataclasses.replace(cascaded, cascade=None), cascaded.cascade
    passes = {"first alone": RubricReward(rb, load_judges(first), first),
              "refiner alone": RubricReward(rb, load_judges(refiner), refiner),
              "cascade": RubricReward(rb, load_judges(cascaded), cascaded, refiners=load_cascade(cascaded))}
    scores, timing = {}, {}
    for name, reward in passes.items():
        out, wall, cpu = timed_twice(reward, q, r, rb, key)
        scores[name] = llm_scores(out, rb)
        timing[name] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "items_per_s_wall": len(scores[name]) / wall,
                        "items_per_s_cpu": len(scores[name]) / cpu, "judge_prompts": out.details["judge_prompts"]
                        + out.details.get("judge_cascade_prompts", 0), "no_verdict": int(np.isnan(scores[name]).sum())}
        if name == "cascade":
            timing[name] |= {k: out.details[k] for k in ("judge_cascade_screened", "judge_cascade_escalated",
                                                        "judge_cascade_escalated_frac", "judge_cascade_prompts")}
    result["cascade"] = {
        "first": {"checkpoint": first.checkpoints[0], "samples": first.samples, "sampler": first.sampler},
        "refiner": {"checkpoint": refiner.checkpoints[0], "samples": refiner.samples, "sampler": refiner.sampler},
        "items": len(scores["cascade"]), "passes": timing,
        "cascade_vs_refiner": agreement(scores["cascade"], scores["refiner alone"]),
        "first_vs_refiner": agreement(scores["first alone"], scores["refiner alone"]),
        "vs_teacher": {name: agreement(s, teacher_scores(r, rb, lang)) for name, s in scores.items()}}
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)

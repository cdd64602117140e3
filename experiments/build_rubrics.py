"""Builds case-wise rubrics R*(q) the QuRL way (retrieve, meta-describe, generate K, filter, merge):

  python -m experiments.build_rubrics --config=configs/tiny.py \
      --questions=rubric_jax/assets/qurl/questions.jsonl --corpus=rubric_jax/assets/qurl/corpus.jsonl \
      --out=runs/qurl_tiny [--config.qurl.num_candidates=4 ...]

The construction model is `config.model`, the judge `config.judge` (no checkpoint: the construction model
judges; `--judge=configs/judges/X.py` replaces it and `--judge.FIELD=...` overrides one field, as in
experiments.run), settings `config.qurl`, mesh `config.mesh`, seed `config.seed`. Writes OUT/questions.jsonl (rows
with {"rubric": {"replace": R*(q)}}, for `--config.data.train`), OUT/report.json and OUT/work/ (the
checkpoints: the same command resumes an interrupted build). Only parses flags; the build lives in
rubric_jax.qurl.pipeline. A user error (bad input line, missing file, bad setting) exits 2 with one line; a build
that keeps no rubric writes its report and exits 1 naming each stage that dropped questions and why.
"""

import functools
import json
import sys

from absl import app, flags

from experiments import cli, judge_config

_CONFIG = cli.define_config("build_rubrics", "Experiment config file (model, judge, mesh, qurl).")
_QUESTIONS = flags.DEFINE_string("questions", None, "Question jsonl (rubric_jax.data.load_questions format).")
_CORPUS = flags.DEFINE_string("corpus", None, "Document corpus jsonl: doc_id, title, text, quality.")
_OUT = flags.DEFINE_string("out", None, "Output directory: questions.jsonl, report.json, work/.")
flags.mark_flags_as_required(["config", "questions", "corpus", "out"])


_fail = functools.partial(cli.fail, "experiments.build_rubrics")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    cli.start("experiments.build_rubrics", argv)
    from rubric_jax import config_boundary
    from rubric_jax.qurl import pipeline

    try:
        config = config_boundary.experiment(judge_config.merged(_CONFIG.value))
        result = pipeline.run_build(config, _QUESTIONS.value, _CORPUS.value, _OUT.value)
    except (ValueError, OSError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        print("experiments.build_rubrics: interrupted; the same command resumes from the last saved step",
              file=sys.stderr)
        sys.exit(130)
    summary = result.report["summary"]
    print(json.dumps({k: summary[k] for k in ("questions", "kept", "dropped", "dropped_at")}, ensure_ascii=False))
    if summary["questions"] and not summary["kept"]:
        _fail(no_rubric_built(result.report, _OUT.value), status=1)


def no_rubric_built(report: dict, out: str) -> str:
    """Why no rubric was built: every stage that dropped questions, with its count and its first reason."""
    reasons: dict[str, str] = {}
    for question in report["questions"]:
        stage, _, why = (question.get("reason") or "").partition(":")
        reasons.setdefault(stage, why.strip())
    dropped_at = report["summary"]["dropped_at"]
    stages = "; ".join(f"{count} at {stage} ({reasons.get(stage, '')})" for stage, count in dropped_at.items())
    return f"no rubric built: all {report['summary']['questions']} question(s) dropped: {stages}; {out}/report.json " \
           "has each question's reason"


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.build_rubrics"))

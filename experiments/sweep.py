"""Runs a config file's sweep: `python -m experiments.sweep --config=configs/tiny.py --workdir=DIR [--config.x=y]`.

Each variant of `sweep(add, arg)` runs as `experiments.run` in DIR/<variant name>/, one after another;
a re-run skips finished variants and resumes the others. Then DIR/summary.json, DIR/summary.md and
overlay plots in DIR/plots/ are written. `--print_commands` prints one `./launch.sh experiments.run ...`
line per variant for a cluster scheduler instead; `--summary_only` rewrites the summary and plots from
what the variants' workdirs hold. A second sweep of the same DIR, or a run of a variant directory
a live run holds, exits with status 2 naming the holder's pid; killing the sweep (even `kill -9`) sends its
running variant SIGTERM (save and exit). Extra `--config.<key>=<value>` flags apply to every variant. Only
parses flags; the logic is rubric_jax.sweeps.
"""

import functools
import shlex
import sys
from pathlib import Path

from absl import app, flags

from experiments import cli
from rubric_jax import sweeps
from rubric_jax.train.workdir import WorkdirBusy, check_usable, exclusive

_CONFIG = flags.DEFINE_string("config", None, "Config file defining get_config(arg) and sweep(add, arg), "
                              "optionally with :arg (e.g. configs/qwen7b.py:size=1.5b).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory: one subdirectory per variant, plus the summary.")
_PRINT = flags.DEFINE_bool("print_commands", False, "Print one launch command per variant and exit.")
_SUMMARY_ONLY = flags.DEFINE_bool("summary_only", False, "Write the summary and plots without running anything.")
flags.mark_flags_as_required(["config", "workdir"])
_RUN_MODULE = "experiments.run"


def _parse_flags(argv: list[str]) -> list[str]:
    """absl parses the sweep's own flags; `--config.<key>=<value>` overrides are passed on to main."""
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    return flags.FLAGS([a for a in argv if a not in overrides]) + overrides


_fail = functools.partial(cli.fail, "experiments.sweep")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    extra = [a for a in argv[1:] if a.startswith("--config.")]
    if len(extra) != len(argv) - 1:
        _fail(f"unexpected arguments {[a for a in argv[1:] if a not in extra]}")
    if _PRINT.value and _SUMMARY_ONLY.value:
        _fail("--print_commands and --summary_only exclude each other")
    workdir = Path(_WORKDIR.value)
    try:
        sweep = sweeps.load_sweep(_CONFIG.value, extra)
    except sweeps.SweepError as e:
        _fail(str(e))
    if _PRINT.value:
        for variant in sweep.variants:
            print("./launch.sh " + shlex.join([_RUN_MODULE, *sweep.run_flags(variant, workdir)]))
        return
    try:
        check_usable(workdir)
    except ValueError as e:
        _fail(str(e))
    if _SUMMARY_ONLY.value:
        outcomes = {}
    else:
        try:
            with exclusive(workdir):  # one sweep per directory; its runs lock their own variant directories
                outcomes = sweeps.run_sweep(sweep, workdir, _RUN_MODULE)
        except WorkdirBusy as e:
            _fail(str(e))
    summary = sweeps.summarize(sweep, workdir, outcomes)
    for path in sweeps.write_summary(sweep, workdir, summary)[:2]:
        print(f"wrote {path}")
    unfinished = [f"{v['name']} ({v['status']})" for v in summary["variants"] if v["status"] != "finished"]
    if unfinished:
        again = "run the sweep without --summary_only" if _SUMMARY_ONLY.value else "run the same command again"
        print(f"experiments.sweep: {len(unfinished)} of {len(sweep.variants)} variants not finished: "
              f"{', '.join(unfinished)}; {again} to resume them", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)

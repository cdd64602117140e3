"""Overlays runs: `python -m experiments.plots --workdir=A [--workdir=B | B ...] --out=DIR`.

Writes one PNG per plot (reward and each dimension, held-out reward, KL, clip fraction, entropy, grad
norm, learning rate, response length, zero-std fraction, judge failures, dimension weights, SFT loss)
into DIR, one line per run, named by the shortest distinct ending of its workdir path. A metric no run
logged is skipped. DIR must be new, empty or written by this command before (never a run's plots/); it
is replaced whole, so a failure leaves it as it was. Only parses flags; the plotting is rubric_jax.plots.
"""

import functools
from pathlib import Path

from absl import app, flags

from experiments import cli
from rubric_jax import metrics, plots

_WORKDIRS = flags.DEFINE_multi_string("workdir", None, "A run's workdir (holds metrics.jsonl); repeat it, or list "
                                      "more workdirs after the flags.")
_OUT = flags.DEFINE_string("out", None, "Directory for the overlay PNGs (not a run's workdir).")
flags.mark_flags_as_required(["workdir", "out"])


_fail = functools.partial(cli.fail, "experiments.plots")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    workdirs = [Path(p) for p in [*_WORKDIRS.value, *argv[1:]]]
    out = Path(_OUT.value)
    try:
        plots.check_overlay_dir(out, workdirs)
        names = plots.run_names(workdirs)
        for workdir in workdirs:
            if not (workdir / metrics.METRICS_FILE).is_file():
                raise ValueError(f"{workdir}: no {metrics.METRICS_FILE} (not a run's workdir)")
        runs = {name: metrics.read_jsonl_metrics(workdir / metrics.METRICS_FILE)
                for name, workdir in zip(names, workdirs)}
    except ValueError as e:
        _fail(str(e))
    try:
        written = plots.write_overlays(runs, out)
    except OSError as e:  # a full disk: the old directory is kept whole
        cli.fail_write("experiments.plots", out, e)
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)

"""Runs an experiment: `python -m experiments.run --config=configs/tiny.py --workdir=DIR [--config.rl.lr=...]`.

The judge is `config.judge`; `--judge=configs/judges/X.py` replaces that block and `--judge.FIELD=...` overrides
one field. Given several ways, the later wins: the --config file's block, the --judge file,
--config.judge.FIELD, --judge.FIELD (experiments/judge_config.py).

Only parses flags; the pipeline (sft -> grpo with evals) lives in rubric_jax.train.loop so it can be
imported and tested. Restarting with the same workdir resumes from its latest checkpoint. A user
error (an unknown config key, a bad config value, bad data or rubric file, unusable checkpoint or
workdir) exits with status 2 and a one-line message.

`--dry_run` compiles every program of the config with abstract inputs and prints per-device memory and
collectives instead of running (rubric_jax/aot.py); `--dry_run_target=a100_80g|h100_80g|h200` compiles
with XLA's GPU compiler on this machine (it needs requirements-aot.txt: ./launch.sh sets that up);
`--dry_run_programs=grpo_update,logprobs` compiles only those programs (aot.PROGRAMS names them all).
"""

import functools
import os

from absl import app, flags

from ml_collections import config_flags

from experiments import cli, judge_config

_CONFIG = cli.define_config("run", "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, samples and plots.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Compile every program of the config and print per-device memory "
                             "and collectives; runs nothing, needs no weights, data or accelerator.")
_DRY_RUN_TARGET = flags.DEFINE_string("dry_run_target", "cpu", "Compile for: cpu (the local CPU devices: a smoke "
                                      "check) or a GPU: a100_80g, h100_80g, h200 (XLA's GPU compiler).")
_DRY_RUN_DEVICES = flags.DEFINE_integer("dry_run_devices", 8, "Devices of the machine the dry run compiles for.")
_DRY_RUN_PROGRAMS = flags.DEFINE_string("dry_run_programs", "all", "Comma-separated programs the dry run compiles "
                                        "(default all): sft, grpo_update, logprobs, rollout, eval_rollout, judge, "
                                        "reward_model.")
flags.mark_flag_as_required("config")


_fail = functools.partial(cli.fail, "experiments.run")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    cli.start("experiments.run", argv)
    if _DRY_RUN.value:
        dry_run()
        return
    if _WORKDIR.value is None:
        _fail("--workdir is required (or pass --dry_run)")
    from rubric_jax import distributed  # jax.distributed must precede any device use

    distributed.maybe_initialize()
    from rubric_jax.judges.http_backend import EndpointDown
    from rubric_jax.train import checkpointing, loop, runner

    try:
        loop.run(judge_config.merged(_CONFIG.value), _WORKDIR.value)
    except EndpointDown as e:  # the served judge went away mid-run: resumable from the last checkpoint, exit 1
        _fail(str(e), status=1)
    except (ValueError, FileNotFoundError, checkpointing.CheckpointError) as e:
        _fail(str(e))
    except (runner.TrainingError, checkpointing.CheckpointWriteError) as e:  # the run itself went wrong (not its
        _fail(str(e), status=1)  # input; a full disk): exit 1, as a crash would
    except OSError as e:  # another write that failed (a full disk): the work failed, exit 1
        _fail(f"writing {e.filename or _WORKDIR.value} failed ({e.strerror or e}); once that is fixed, the same "
              "command resumes from the newest checkpoint", status=1)


def dry_run() -> None:
    """--dry_run, set up before jax starts: it compiles on the CPU whatever the target (a GPU target is
    a compile-only topology), and the cpu target needs as many CPU devices as the mesh."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax  # noqa: PLC0415 -- the config file's blocks imported jax already: its platforms are read at import

    jax.config.update("jax_platforms", "cpu")
    if _DRY_RUN_TARGET.value == "cpu":
        os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} "
                                   f"--xla_force_host_platform_device_count={_DRY_RUN_DEVICES.value}").strip()
    from rubric_jax import aot

    try:
        report = aot.dry_run(judge_config.merged(_CONFIG.value), _DRY_RUN_TARGET.value, _DRY_RUN_DEVICES.value,
                             programs=aot.parse_programs(_DRY_RUN_PROGRAMS.value))
    except ValueError as e:
        cli.fail("experiments.run --dry_run", str(e))
    print(aot.format_report(report, config_flags.get_config_filename(flags.FLAGS["config"])))


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.run"))

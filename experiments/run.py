"""Runs an experiment: `python -m experiments.run --config=configs/tiny.py --workdir=DIR [--config.rl.lr=...]`.

Only parses flags; the pipeline (sft -> grpo with evals) lives in rubric_jax.train.loop so it can be
imported and tested. Restarting with the same workdir resumes from its latest checkpoint. A user
error (an unknown config key, a bad config value, bad data or rubric file, unusable checkpoint or
workdir) exits with status 2 and a one-line message.
"""

import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from rubric_jax import distributed

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, samples and plots.")
flags.mark_flags_as_required(["config", "workdir"])


def _fail(message: str) -> None:
    print(f"experiments.run: error: {message}", file=sys.stderr)
    sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parse, with a config override naming an unknown key (ml_collections raises AttributeError
    or KeyError from inside the parser) or a bad value as one line instead of a traceback."""
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:  # ml_collections' "no such field", with its did-you-mean hint
        text = str(e).replace("\\n", " ").replace("\\'", "'")
        key, hint = re.search(r"'(\w+)'", text), re.search(r"Did you mean [^?]*\?", text)
        _fail(f"unknown config key {key.group(1) if key else text!r}" + (f" ({hint.group(0)})" if hint else ""))
    except (flags.Error, TypeError, ValueError) as e:
        _fail(" ".join(str(e).split()))


def main(argv: list[str]) -> None:
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax/jax INFO lines would bury the progress bar
    distributed.maybe_initialize()
    from rubric_jax.train import checkpointing, loop  # after jax.distributed, which must precede device use

    try:
        loop.run(_CONFIG.value, _WORKDIR.value)
    except (ValueError, FileNotFoundError, checkpointing.CheckpointError) as e:
        _fail(str(e))
    except loop.TrainingError as e:  # the run itself went wrong (not its input): exit 1, as a crash would
        print(f"experiments.run: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)

"""Runs an experiment: `python -m experiments.run --config=configs/tiny.py --workdir=DIR [--config.rl.lr=...]`.

Only parses flags; the pipeline (sft -> grpo with evals) lives in rubric_jax.train.loop so it can be
imported and tested. Restarting with the same workdir resumes from its latest checkpoint. A user
error (bad data or rubric file, bad config value, unusable checkpoint) exits with a one-line message.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from rubric_jax import distributed

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, samples and plots.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax/jax INFO lines would bury the progress bar
    distributed.maybe_initialize()
    from rubric_jax.train import checkpointing, loop  # after jax.distributed, which must precede device use

    try:
        loop.run(_CONFIG.value, _WORKDIR.value)
    except (ValueError, FileNotFoundError, checkpointing.CheckpointError, loop.TrainingError) as e:
        sys.exit(f"experiments.run: error: {e}")


if __name__ == "__main__":
    app.run(main)

"""Writes a training run's policy as a Hugging Face directory that transformers and vLLM load.

  python -m experiments.export --workdir=RUN_DIR --out=DIR [--config.which=latest|best]

config.json, model.safetensors (shards + index above 4 GiB), the run's tokenizer files and
generation_config.json, in the run's parameter dtype (rubric_jax/train/runs.py). The directory appears
whole or not at all. A missing run, an unknown config.which (configs/commands/export.py), or an --out that exists with files or names an
input exits with status 2 and one line. In a multi-host job every process runs the same command.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from absl import app, flags

from experiments import cli
from rubric_jax import distributed
from rubric_jax.command_blocks import Export

_CONFIG = cli.define_config("export")
_WORKDIR = flags.DEFINE_string("workdir", None, "A training run directory (experiments.run --workdir).")
_OUT = flags.DEFINE_string("out", None, "New (or empty) output directory; may lie inside the workdir.")


_fail = functools.partial(cli.fail, "experiments.export")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    cli.start("experiments.export", argv)
    settings = cli.settings("experiments.export", _CONFIG.value, Export)
    for name, flag in (("workdir", _WORKDIR), ("out", _OUT)):
        if not flag.value:
            _fail(f"--{name} is required")
    workdir = Path(_WORKDIR.value)
    if not workdir.is_dir():
        _fail(f"--workdir={workdir}: directory does not exist")
    distributed.maybe_initialize()
    from rubric_jax.train import runs  # after jax.distributed, which must precede device use

    try:
        chosen, out = runs.export_run(workdir, settings.which, Path(_OUT.value))
    except (runs.RunError, FileExistsError) as e:
        _fail(str(e))
    except OSError as e:  # a full disk: the directory appears whole or not at all
        cli.fail_write("experiments.export", _OUT.value, e)
    if distributed.is_writer():
        print(json.dumps({"workdir": str(workdir), "stage": chosen.stage, "step": chosen.step,
                          runs.BEST_BY: chosen.eval_reward, "out": str(out)}))


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.export"))

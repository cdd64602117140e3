"""GRPO runs that start from a cold-start SFT run made once per seed, instead of each repeating it: SFT_DIR/seed_<s>
is the run's config with `stages = ("sft",)`, run once; its checkpoints and metrics rows are copied into each GRPO
run's new workdir, where `experiments.run` with both stages resumes the SFT stage at its last step (no step runs)
and trains GRPO from its result, writing the rows an uninterrupted run of both stages writes (a resumed run does:
docs/training.md, "Resuming"). Reused only when its seed and its model, data, sft, lora and mesh blocks equal the
run's (what the SFT stage reads); otherwise one line names the first key that differs. Used by
benchmarks/bench_off_policy.py (--sft_dir) and, before `experiments.sweep`, for a sweep whose variants differ only
after SFT (configs/tiny_losses.py):

  PYTHONPATH=. .venv/bin/python -m benchmarks.sft_start --config=configs/tiny_losses.py --sft_dir=runs/tiny_sft --sweep_dir=runs/tiny_losses

makes the SFT run of each seed the sweep's variants name (those not finished yet) and seeds every variant's
directory that has no checkpoints yet; the sweep's own command then runs GRPO in each.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import ml_collections
from absl import app, flags

from rubric_jax import metrics, sweeps
from rubric_jax.train import loop, workdir as run_workdir

SFT_KEYS = ("seed", "model", "data", "sft", "lora", "mesh")  # what the SFT stage's result depends on
COPIED = ("metrics.jsonl", "samples.jsonl")  # beside checkpoints/sft: the rows a resumed run keeps



def define_flags() -> tuple[flags.FlagHolder, ...]:
    """The command's flags, defined only when it runs (benchmarks/bench_off_policy.py imports this module and has
    its own --sft_dir)."""
    return (flags.DEFINE_string("config", None, "A sweep's config file (experiments.sweep --config)."),
            flags.DEFINE_string("sft_dir", None, "Where the SFT run of seed s is (or is made): SFT_DIR/seed_<s>."),
            flags.DEFINE_string("sweep_dir", None, "The sweep's --workdir, whose variant directories are seeded."))


def sft_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with its SFT stage alone."""
    sft = ml_collections.ConfigDict(config.to_dict())
    sft.stages = ("sft",)
    return sft


def _sft_part(config_json: str) -> dict[str, Any]:
    """The SFT_KEYS entries of a resolved config's JSON (config.json's text)."""
    resolved = json.loads(config_json)
    return {key: resolved.get(key) for key in SFT_KEYS}


def sft_run(config: ml_collections.ConfigDict, sft_dir: Path) -> Path:
    """SFT_DIR/seed_<seed>, the SFT stage of `config` run there unless a finished run of the same SFT is there."""
    workdir = sft_dir / f"seed_{config.seed}"
    if not (workdir / metrics.DONE_FILE).exists():
        loop.run(sft_config(config), workdir)
    theirs = _sft_part((workdir / run_workdir.CONFIG_FILE).read_text(encoding="utf-8"))
    ours = _sft_part(config.to_json_best_effort(sort_keys=True))
    for key in SFT_KEYS:
        if theirs[key] != ours[key]:
            raise ValueError(f"{workdir / run_workdir.CONFIG_FILE}: its {key} differs from this run's config; its SFT "
                             f"is another run's: use another --sft_dir")
    return workdir


def start_from(sft_workdir: Path, workdir: Path) -> None:
    """Copies the finished SFT run's checkpoints/sft and rows into `workdir`, which must hold no checkpoints yet."""
    target = run_workdir.checkpoint_dir(workdir, "sft")
    if (workdir / "checkpoints").exists():
        raise ValueError(f"{workdir / 'checkpoints'}: exists; start_from seeds only a workdir without checkpoints")
    shutil.copytree(run_workdir.checkpoint_dir(sft_workdir, "sft"), target)
    for name in COPIED:
        if (sft_workdir / name).exists():
            shutil.copyfile(sft_workdir / name, workdir / name)


def seed_sweep(config_file: str, sft_dir: Path, sweep_dir: Path) -> list[str]:
    """Seeds every variant directory of the sweep without checkpoints from its seed's SFT run; their names."""
    seeded = []
    for variant in sweeps.load_sweep(config_file).variants:
        source = sft_run(variant.config, sft_dir)
        if not (sweep_dir / variant.name / "checkpoints").exists():
            start_from(source, sweep_dir / variant.name)
            seeded.append(variant.name)
    return seeded


def main(argv: list[str], *, config: flags.FlagHolder, sft_dir: flags.FlagHolder, sweep_dir: flags.FlagHolder) -> None:
    del argv
    for flag in (config, sft_dir, sweep_dir):
        if not flag.value:
            print(f"benchmarks.sft_start: --{flag.name} is required", file=sys.stderr)
            sys.exit(2)
    sft, sweep = Path(sft_dir.value).resolve(), Path(sweep_dir.value).resolve()
    if sft == sweep or sft in sweep.parents or sweep in sft.parents:
        print(f"benchmarks.sft_start: --sft_dir={sft_dir.value} and --sweep_dir={sweep_dir.value} overlap: the SFT runs "
              "are the input the sweep's variant directories are copied from; give two separate directories",
              file=sys.stderr)
        sys.exit(2)
    try:
        seeded = seed_sweep(config.value, Path(sft_dir.value), Path(sweep_dir.value))
    except (ValueError, sweeps.SweepError) as e:
        print(f"benchmarks.sft_start: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"seeded {len(seeded)} variant directories of {sweep_dir.value} from {sft_dir.value}: {', '.join(seeded)}")


if __name__ == "__main__":
    app.run(functools.partial(main, **dict(zip(("config", "sft_dir", "sweep_dir"), define_flags()))))

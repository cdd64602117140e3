"""The one definition of the judge flag: `--judge=configs/judges/X.py` (a judge config file whose get_config
returns a configs/common.judge_block()) and `--judge.FIELD=VALUE` overrides, for every command that judges.

score, calibrate, evaluate and distill_judge read it as a JudgeSpec (`spec()`; errors name `--judge.FIELD`).
run and build_rubrics read their experiment's `config.judge` (`merged()`): `--judge=FILE` replaces that block,
and field overrides apply on top in this order, the later winning: the experiment file's block, the --judge
file, --config.judge.FIELD, --judge.FIELD.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import ml_collections
from absl import flags
from ml_collections import config_flags

from configs.common import judge_block
from experiments import cli
from rubric_jax import config_files
from rubric_jax.judges.spec import JudgeSpec, load_judge_file

JUDGES_DIR = Path(__file__).resolve().parents[1] / "configs" / "judges"
try:  # without --judge, the default file and sys.argv's --judge.FIELD overrides are read right here
    JUDGE = config_files.DEFINE_config_file(
        "judge", str(JUDGES_DIR / "default.py"), "Judge config file (configs/judges/*.py; default: rules only, "
        "experiments.evaluate: the benchmark's own); override one field with --judge.FIELD=VALUE.", "judge config")
except (AttributeError, KeyError) as unknown:
    field = re.search(r"'(\w+)'", str(unknown).replace("\\'", "'"))
    cli.fail(f"experiments.{Path(sys.argv[0]).stem}", f"--judge.{field.group(1) if field else unknown}: not a judge "
             f"field; expected one of {sorted(judge_block())}")


def _overrides(flag_name: str, prefix: str = "") -> dict[str, object]:
    """The FIELD=VALUE overrides given on the command line for config flag `flag_name` (under `prefix`)."""
    values = config_flags.get_override_values(flags.FLAGS[flag_name])
    return {k.removeprefix(prefix): v for k, v in values.items() if k.startswith(prefix)}


def load_file(path: Path) -> ml_collections.ConfigDict:
    """A judge config file's `get_config()` (as --judge=PATH loads it)."""
    return load_judge_file(path)


def _apply(block: ml_collections.ConfigDict, values: dict[str, object], source: str) -> None:
    for field, value in values.items():
        if field not in block:
            raise ValueError(f"{source}.{field}: not a judge field; expected one of {sorted(block)}")
        block[field] = value


def block(default_file: Path | None = None) -> ml_collections.ConfigDict:
    """The --judge block with its --judge.FIELD overrides; without --judge, `default_file` (if given) instead
    of configs/judges/default.py (experiments.evaluate: the benchmark's judge file)."""
    if default_file is None or flags.FLAGS["judge"].present:
        return JUDGE.value
    loaded = load_file(default_file)
    _apply(loaded, _overrides("judge"), "--judge")
    return loaded


def spec(default_file: Path | None = None, *, allow_benchmark: bool = False) -> JudgeSpec:
    """The command's JudgeSpec from --judge (see `block`); a bad field is a ValueError naming --judge.FIELD."""
    return JudgeSpec.from_config(block(default_file), "--judge", allow_benchmark=allow_benchmark)


def merged(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` (an experiment, from --config) with --judge applied to config.judge, in place: --judge=FILE
    replaces the block, then --config.judge.FIELD, then --judge.FIELD apply (the later wins)."""
    own = _overrides("judge")
    if flags.FLAGS["judge"].present:
        replacement = JUDGE.value.to_dict()  # the file with --judge.FIELD applied
        if set(replacement) != set(config.judge):
            raise ValueError(f"--judge: its fields {sorted(replacement)} are not config.judge's {sorted(config.judge)}")
        replacement.update({k: v for k, v in _overrides("config", "judge.").items() if k not in own})
        _apply(config.judge, replacement, "--judge")
    else:
        _apply(config.judge, own, "--judge")
    return config

"""The one place where ml-collections meets the typed blocks (rubric_jax/schema.py): the user's surface (config
files, `--config.x.y=` overrides, sweeps) is a ConfigDict; everything below a command's `main`, `loop.run` and
`aot` reads blocks. `to_block` turns a ConfigDict into a block, naming the key of any error (`experiment`: the
whole experiment config, train/blocks.py); `record` keeps what a run writes of its resolved config (config.json,
run_info, the fingerprint a sweep compares); `config_dict` gives a block's defaults as the ConfigDict that
configs/common.py hands to config files."""

from __future__ import annotations

from typing import Any, TypeVar

import ml_collections

from rubric_jax import metrics, schema
from rubric_jax.train.blocks import ConfigRecord, ExperimentConfig

B = TypeVar("B", bound=schema.Block)
ConfigDict = ml_collections.ConfigDict  # for the entry points' signatures (loop.run, aot.dry_run): no import there


def to_block(config: ml_collections.ConfigDict, cls: type[B], where: str) -> B:
    """The block of type `cls` that `config` describes; a bad or unknown key raises `schema.BlockError` naming
    `where.<key>` ("config.rl.group_size", "--judge.samples")."""
    return schema.from_mapping(cls, config.to_dict(), where)


def experiment(config: ml_collections.ConfigDict) -> ExperimentConfig:
    """An experiment config file's resolved ConfigDict as its checked blocks; errors name `config.<key>`."""
    return to_block(config, ExperimentConfig, "config")


def record(config: ml_collections.ConfigDict) -> ConfigRecord:
    """The resolved config as a run records it: config.json's text, run_info's dict and the sweep's fingerprint."""
    return ConfigRecord(config.to_dict(), config.to_json_best_effort(indent=2, sort_keys=True),
                        metrics.config_fingerprint(config))


def config_dict(cls: type[schema.Block], **given: Any) -> ml_collections.ConfigDict:
    """`cls`'s config keys with their defaults, as a ConfigDict (nested blocks nested);
    `given` supplies the ConfigDict of a key parsed by a type of its own (a judge block), by key."""
    out = ml_collections.ConfigDict()
    made = cls()
    for f in schema.config_fields(cls):
        key, value = schema.config_key(f), getattr(made, f.name)
        if key in given:
            out[key] = given[key]
        elif isinstance(value, schema.Block):
            out[key] = config_dict(type(value))
        elif f.metadata["parse"] is not None:
            raise ValueError(f"config_dict({cls.__name__}): give the ConfigDict of {key!r}, a block of its own type")
        else:
            out[key] = value
    return out

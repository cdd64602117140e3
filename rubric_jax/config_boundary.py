"""The one place where ml-collections meets the typed blocks (rubric_jax/schema.py): the user's surface (config
files, `--config.x.y=` overrides, sweeps) is a ConfigDict; everything below a command's `main`, `loop.run` and
`aot` reads blocks. `to_block` turns a ConfigDict into a block, naming the key of any error (`experiment`: the
whole experiment config, train/blocks.py); `record` keeps what a run writes of its resolved config (config.json,
run_info, the fingerprint a sweep compares); `config_dict` gives a block's defaults as the ConfigDict that
configs/common.py hands to config files."""

from __future__ import annotations

from typing import TypeVar

import ml_collections

from rubric_jax import metrics, schema
from rubric_jax.train.blocks import ConfigRecord, ExperimentConfig

B = TypeVar("B", bound=schema.Block)
ConfigDict = ml_collections.ConfigDict  # for the entry points' signatures (loop.run, aot.dry_run): no import there


def to_block(config: ml_collections.ConfigDict, cls: type[B], where: str) -> B:
    """The block of type `cls` that `config` describes; a bad or unknown key raises `schema.BlockError` naming
    `where.<key>` ("config.rl.group_size", "--judge.samples")."""
    return cls.from_values(config.to_dict(), where)


def experiment(config: ml_collections.ConfigDict) -> ExperimentConfig:
    """An experiment config file's resolved ConfigDict as its checked blocks; errors name `config.<key>`."""
    return to_block(config, ExperimentConfig, "config")


def record(config: ml_collections.ConfigDict) -> ConfigRecord:
    """The resolved config as a run records it: config.json's text, run_info's dict and the sweep's fingerprint."""
    return ConfigRecord(config.to_dict(), config.to_json_best_effort(indent=2, sort_keys=True),
                        metrics.config_fingerprint(config))


def config_dict(block: type[schema.Block] | schema.Block) -> ml_collections.ConfigDict:
    """A block class's config keys with their defaults (or a block's with its values), as a ConfigDict (nested
    blocks nested)."""
    return ml_collections.ConfigDict(schema.defaults(block) if isinstance(block, type) else block.to_values())

"""What the `experiments.*` commands share: their settings file (`--config`, default configs/commands/<command>.py,
`--config.FIELD=VALUE` overrides); bad input ends in one line on stderr that names the command, exit status 2 and
no traceback; absl's INFO lines (orbax, jax, tfds) stay quiet unless --verbosity is given."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import ml_collections
from absl import flags, logging
from ml_collections import config_flags

from rubric_jax import config_boundary, config_files, schema

B = TypeVar("B", bound=schema.Block)

COMMAND_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "commands"


def fail(command: str, message: str, status: int = 2) -> NoReturn:
    """`<command>: error: <message>` on stderr, then exit `status` (2: bad input; 1: the work itself failed)."""
    print(f"{command}: error: {message}", file=sys.stderr)
    sys.exit(status)


def fail_write(command: str, out: object, error: OSError) -> NoReturn:
    """A failed write (a full disk) as one line, exit status 1; the outputs are atomic, so nothing was written."""
    reason = error.strerror or " ".join(str(error).split())
    fail(command, f"writing {out} failed ({reason}); nothing was written", status=1)


def start(command: str, argv: list[str]) -> None:
    """The start of every main(): no positional arguments, a --config that is a settings file of this command,
    and WARNING logging unless --verbosity is given (orbax and jax INFO lines would bury the progress lines)."""
    if len(argv) > 1:
        fail(command, f"unexpected positional arguments {argv[1:]}")
    default = COMMAND_CONFIGS / f"{command.removeprefix('experiments.')}.py"
    if default.is_file() and "config" in flags.FLAGS:
        check_settings_file(command, default)
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def settings(command: str, config: ml_collections.ConfigDict, cls: type[B]) -> B:
    """The command's --config as its settings block (rubric_jax/command_blocks.py), made once in main() before any
    work: nothing below main reads the ConfigDict. A value out of its type, bounds or choices is one line naming
    it (`--config.batch_size=0: expected an integer >= 1`), exit 2."""
    try:
        return config_boundary.to_block(config, cls, "--config")
    except schema.BlockError as e:
        fail(command, str(e))


def _keys(config: ml_collections.ConfigDict, prefix: str = "") -> set[str]:
    """Every leaf key of `config`, dotted."""
    keys = set()
    for key, value in config.items():
        keys |= _keys(value, f"{prefix}{key}.") if isinstance(value, ml_collections.ConfigDict) else {prefix + key}
    return keys


def check_settings_file(command: str, default: Path) -> None:
    """A --config naming another file (e.g. an experiment's) must have the keys of the command's own settings
    file, or the command would stop on the first key it lacks with a traceback."""
    loaded = config_flags.get_config_filename(flags.FLAGS["config"])
    if Path(loaded).resolve() == default.resolve():
        return
    own = importlib.import_module(f"configs.commands.{default.stem}").get_config()
    wanted, found = _keys(own), _keys(flags.FLAGS.config)
    if wanted != found:
        missing, extra = _few(sorted(wanted - found)), _few(sorted(found - wanted))
        fail(command, f"--config={loaded}: not a settings file of {command} (its keys are those of "
                      f"{default.relative_to(COMMAND_CONFIGS.parents[1])}); missing {missing}, unknown {extra}")


def _few(keys: list[str], shown: int = 5) -> str:
    """The first `shown` keys and how many more (an experiment file has ~150)."""
    more = f", ... {len(keys) - shown} more" if len(keys) > shown else ""
    return "[" + ", ".join(map(repr, keys[:shown])) + more + "]"


def define_config(command: str, help_string: str | None = None) -> flags.FlagHolder:
    """`--config`: the command's settings file (default configs/commands/<command>.py; run and build_rubrics: an
    experiment file, no default) with `--config.FIELD=VALUE` overrides, locked so that an unknown
    field fails, loaded by rubric_jax/config_files.py (a file that cannot load is one line naming it, exit 2).
    Without --config, the default file and the overrides are read right here, at import: an unknown field is one
    line and exit 2 here too."""
    default = COMMAND_CONFIGS / f"{command}.py"
    help_string = help_string or (f"Settings file (default configs/commands/{command}.py); override one field with "
                                  "--config.FIELD=VALUE.")
    try:
        return config_files.DEFINE_config_file("config", str(default) if default.is_file() else None, help_string)
    except (AttributeError, KeyError) as e:
        fail(f"experiments.{command}", unknown_key(e))
    except config_files.ConfigFileError as e:
        fail(f"experiments.{command}", str(e))


def check(ok: bool, key: str, value: object, expected: str) -> None:
    """A config value the command cannot use, as a ValueError naming it: `--config.KEY=VALUE: expected ...`."""
    if not ok:
        raise ValueError(f"--config.{key}={value}: expected {expected}")


def unknown_key(error: AttributeError | KeyError) -> str:
    """ml_collections' "no such field" error (with its did-you-mean hint) as one line."""
    text = str(error).replace("\\n", " ").replace("\\'", "'")
    key, hint = re.search(r"'(\w+)'", text), re.search(r"Did you mean [^?]*\?", text)
    name = key.group(1) if key else text
    return f"unknown config key {name!r}" + (f" ({hint.group(0)})" if hint else "")


def flags_parser(command: str) -> Callable[[list[str]], list[str]]:
    """absl's flag parse for `app.run(main, flags_parser=...)`, with a config file (--config, --judge) that
    cannot load, an override naming an unknown key (ml_collections raises AttributeError or KeyError from
    inside the parser) or a bad value as one line and exit 2 instead of a traceback."""
    def parse(argv: list[str]) -> list[str]:
        try:
            return flags.FLAGS(argv)
        except (AttributeError, KeyError) as e:  # ml_collections' "no such field", with its did-you-mean hint
            fail(command, unknown_key(e))
        except config_files.ConfigFileError as e:  # --config=FILE or --judge=FILE that cannot load
            fail(command, str(e))
        except (flags.Error, OSError, TypeError, ValueError) as e:
            fail(command, " ".join(str(e).split()))

    return parse

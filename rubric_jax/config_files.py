"""The one loader of user-named Python config files (`--config=FILE[:ARG]`, `--judge=FILE`, a judge's cascade file,
a sweep's file): every command and library path that runs a config file's `get_config` goes through here.

A config file is untrusted input like any other: it must be a regular file of at most MAX_CONFIG_BYTES, opened
with `files.open_input` before anything runs it (a FIFO would block, /dev/zero would fill memory), read once and
compiled from that text. Whatever goes wrong is a ConfigFileError whose one-line message names the file (and the
line, where there is one): a syntax error, an exception while loading or in get_config (an ARG it does not take
too), no get_config, or a result that is no config (None, a list): `get_config` must return a
ml_collections.ConfigDict (a plain dict is converted).

`DEFINE_config_file` is ml_collections' with this loader: the flag accepts the same
FILE[:ARG] and `--NAME.FIELD=VALUE` overrides, and its value is locked.
"""

from __future__ import annotations

import traceback
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections
from absl import flags
from ml_collections import config_flags

from rubric_jax import files

flags.disclaim_key_flags()  # a flag defined here belongs to the module that called DEFINE_config_file, as in absl

MAX_CONFIG_BYTES = 1 << 20  # the largest config file run: 1 MiB (the shipped ones are under 30 KB)


class ConfigFileError(Exception):
    """A config file that cannot be loaded; the message names the file (and line). Not a ValueError, so that absl
    does not wrap it into a "flag --config=...: Error whilst parsing" message."""


def load_module(path: str | Path, what: str = "config") -> types.ModuleType:
    """The module that the config file at `path` defines, run from the text read once (see the module docstring)."""
    try:
        source = files.read_text(path, what, max_bytes=MAX_CONFIG_BYTES)
    except files.PathError as e:
        raise ConfigFileError(str(e)) from None
    try:
        code = compile(source, str(path), "exec")
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte in the text (no line)
        line = f":{e.lineno}" if getattr(e, "lineno", None) else ""
        raise ConfigFileError(f"{path}{line}: syntax error ({getattr(e, 'msg', e)})") from None
    module = types.ModuleType(f"{what.replace(' ', '_')}_file_{Path(path).stem}")
    module.__file__ = str(path)
    try:
        exec(code, module.__dict__)  # noqa: S102  (running the user's config file is what --config asks for)
    except Exception as e:  # the config file's own code: any error is the file's, named with its line
        raise ConfigFileError(f"{line_in(path, e)}: loading it raised {one_line(e)}") from None
    return module


def load_config(spec: str | Path, what: str = "config") -> ml_collections.ConfigDict:
    """`get_config(ARG)` of the config file `spec` ("FILE" or "FILE:ARG", as --config takes it), unlocked."""
    path, colon, arg = str(spec).partition(":")
    module = load_module(path, what)
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise ConfigFileError(f"{path}: defines no get_config() function")
    try:
        config = get_config(*((arg,) if colon else ()))
    except Exception as e:  # the config file's own code (or an ARG it does not take: a TypeError)
        raise ConfigFileError(f"{line_in(path, e)}: get_config() raised {one_line(e)}") from None
    return as_config(config, f"{path}: get_config()")


def as_config(value: Any, where: str) -> ml_collections.ConfigDict:
    """`value` as a ConfigDict (a Mapping is converted); anything else (None, a list) is a ConfigFileError."""
    if isinstance(value, ml_collections.ConfigDict):
        return value
    if isinstance(value, Mapping):
        try:
            return ml_collections.ConfigDict(value)
        except Exception as e:  # a key ConfigDict cannot hold (not a string, ...)
            raise ConfigFileError(f"{where} returned a dict that is no config ({one_line(e)})") from None
    kind = "None (a missing return statement?)" if value is None else f"a {type(value).__name__}"
    raise ConfigFileError(f"{where} returned {kind}, expected a ml_collections.ConfigDict")


def line_in(path: str | Path, error: BaseException) -> str:
    """`path:line` of the last traceback frame of `error` inside the file at `path` (`path` if none is)."""
    target, line = Path(path).resolve(), None
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        if Path(frame.f_code.co_filename).resolve() == target:
            line = lineno
    return f"{path}" if line is None else f"{path}:{line}"


def one_line(error: BaseException) -> str:
    """`Type: message` on one line, cut to 300 characters."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:300]


class _Parser(flags.ArgumentParser):
    """A config file flag's parser with `load_config` as its loader (ml_collections' own opens any path it is
    given and prints its traceback); errors name the flag."""

    def __init__(self, name: str, what: str):
        self.name, self.what = name, what

    def parse(self, argument: str) -> ml_collections.ConfigDict:
        try:
            config = load_config(argument, self.what)
        except ConfigFileError as e:
            raise ConfigFileError(f"--{self.name}={argument}: {e}") from None
        config.lock()
        return config

    def flag_type(self) -> str:
        return "config object"


def DEFINE_config_file(name: str,  # noqa: N802  (absl's and ml_collections' name)
                       default: str | None, help_string: str, what: str = "config",
                       flag_values: flags.FlagValues = flags.FLAGS, sys_argv: list[str] | None = None
                       ) -> flags.FlagHolder:
    """`--NAME=FILE[:ARG]` with `--NAME.FIELD=VALUE` overrides (ml_collections.config_flags, locked), loaded by
    `load_config`: a file that cannot load raises ConfigFileError when the flag is parsed (at definition for the
    default, when absl parses the command line for a given file). `what` names the file in errors ("judge config").
    ml_collections' flag is defined without a default, given this parser, then its default (parsed now unless the
    command line names a file)."""
    holder = config_flags.DEFINE_config_file(name, None, help_string, flag_values=flag_values, sys_argv=sys_argv)
    flag_values[name].parser = _Parser(name, what)
    if default is not None:
        flag_values.set_default(name, default)
    return holder

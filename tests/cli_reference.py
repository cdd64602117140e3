"""docs/cli.md from the code: every `experiments.*` command with the flags it defines (absl), their types,
defaults and help, and the settings of its default config file (configs/commands/<command>.py: every key, its
default and the comment beside it in the file or in the configs/common.py block that made it). The page is
generated so that it cannot drift; tests/test_docs.py fails when it differs.

  PYTHONPATH=. python -m tests.cli_reference            # print the page
  PYTHONPATH=. python -m tests.cli_reference --write    # rewrite docs/cli.md
  PYTHONPATH=. python -m tests.cli_reference --json     # {"flags": {command: [names]}, "page": ...} for tests

absl registers flags globally and two commands may define the same name (--workdir), so each command's module
is imported in turn and its flags, with those of the shared flag modules it uses (experiments/judge_config.py),
are unregistered before the next one.
"""

from __future__ import annotations

import ast
import importlib
import io
import json
import sys
import tokenize
from pathlib import Path

from absl import flags

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"
HELPERS = ("cli", "judge_config")  # modules of experiments/ that are not commands
COMMAND_CONFIGS = ROOT / "configs" / "commands"
BLOCKS = ROOT / "configs" / "common.py"


def command_names() -> list[str]:
    """Every `python -m experiments.X` command, by file name."""
    return sorted(p.stem for p in (ROOT / "experiments").glob("*.py") if p.stem not in ("__init__", *HELPERS))


def _row(flag: flags.Flag) -> str:
    """One table row: name, type (with an enum's values), default, help on one line."""
    kind = flag.flag_type()
    values = getattr(flag.parser, "enum_values", None)
    help_text = " ".join((flag.help or "").split())
    if values:
        kind += ": " + ", ".join(values)
        help_text = help_text.removeprefix(f"<{'|'.join(values)}>: ")  # absl's own prefix, already in the type
    default = "" if flag.default is None else (flag.default_as_str or "").replace(f"{ROOT}/", "")  # --judge's file
    if len(default) >= 2 and default[0] == default[-1] == "'":
        default = default[1:-1]
    default = f"`{default}`" if default else ""
    return f"| `--{flag.name}` | {kind} | {default} | {help_text.replace('|', chr(92) + '|')} |"


def collect() -> dict[str, tuple[str, list[flags.Flag]]]:
    """command -> (first paragraph of its docstring, the flags it reads), importing one command at a time."""
    registry = flags.FLAGS
    found = {}
    for name in command_names():
        module = importlib.import_module(f"experiments.{name}")
        by_module = registry.flags_by_module_dict()
        own = list(by_module.get(module.__name__, []))
        shared = [flag for helper in HELPERS for flag in by_module.get(f"experiments.{helper}", [])]
        summary = (module.__doc__ or "").strip().split("\n\n")[0]
        found[name] = (summary, own + shared)
        for flag in own + shared:
            delattr(registry, flag.name)
        for helper in HELPERS:  # re-registered by the next command that imports it (`from experiments import x`
            sys.modules.pop(f"experiments.{helper}", None)  # reads the package attribute: drop that too)
            if hasattr(sys.modules["experiments"], helper):
                delattr(sys.modules["experiments"], helper)
    return found


def _comments(source: str) -> dict[int, str]:
    """line number -> the comment on that line (without '#')."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0]: t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT}


def _dotted(node: ast.expr) -> str | None:
    """`c.policy.batch_size` -> "policy.batch_size" (the name of the block variable dropped)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join(reversed(parts)) if parts and isinstance(node, ast.Name) else None


def blocks(*paths: Path) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """function name -> ({key: meaning}, {key: the block function that built it}) of each function in `paths`:
    a key's meaning is the comment at the end of its assignment, else the comment lines right above it."""
    found = {}
    for path in paths:
        source = path.read_text(encoding="utf-8")
        comments, lines = _comments(source), source.splitlines()
        for fn in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)):
            meanings, built = {}, {}
            for node in (n for n in ast.walk(fn) if isinstance(n, ast.Assign)):
                for key in filter(None, map(_dotted, node.targets)):
                    above, line = [], node.lineno - 1
                    while line >= 1 and lines[line - 1].strip().startswith("#"):
                        above.insert(0, comments[line])
                        line -= 1
                    meanings[key] = comments.get(node.end_lineno) or " ".join(above)
                    if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
                        built[key] = node.value.func.id
            found[fn.name] = (meanings, built)
    return found


def meaning(key: str, function: str, found: dict[str, tuple[dict[str, str], dict[str, str]]]) -> str:
    """The comment of `key` (dotted) as set in `function`, or in the block function that built its parent."""
    meanings, built = found.get(function, ({}, {}))
    if meanings.get(key):
        return meanings[key]
    head, _, rest = key.partition(".")
    return meaning(rest, built[head], found) if rest and head in built else ""


def settings(name: str) -> list[tuple[str, object, str]]:
    """(key, default, meaning) of every leaf of configs/commands/<name>.py's get_config(), or [] without one."""
    path = COMMAND_CONFIGS / f"{name}.py"
    if not path.is_file():
        return []
    config = importlib.import_module(f"configs.commands.{name}").get_config()
    found = blocks(path, BLOCKS)

    def leaves(node, prefix=""):
        for key, value in node.items():
            if hasattr(value, "items"):
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    return [(key, value, meaning(key, "get_config", found)) for key, value in leaves(config)]


def render(found: dict[str, tuple[str, list[flags.Flag]]]) -> str:
    """The markdown page."""
    out = ["# Command-line reference", "",
           "Generated from the code by `tests/cli_reference.py`; `tests/test_docs.py` fails when a command's flags",
           "and this page disagree. Regenerate it with:", "",
           "```bash", "PYTHONPATH=. .venv/bin/python -m tests.cli_reference --write", "```", "",
           "Each command runs as `./launch.sh experiments.<command> --flag=value ...` (or `python -m experiments.<command>`",
           "with the repository on `PYTHONPATH`). Its flags are its inputs and outputs; its settings are a config file,",
           "`--config` (default `configs/commands/<command>.py`, built from the blocks of `configs/common.py`; `run`,",
           "`sweep` and `build_rubrics` take an experiment file such as `configs/tiny.py`), and `--config.<key>=<value>`",
           "overrides one key (an unknown key is an error). The judge is `--judge=configs/judges/X.py` with",
           "`--judge.<field>=<value>`. absl's own flags (`--verbosity`, `--helpfull`) work everywhere. Bad input ends in",
           "one line naming the flag, key, file or value, and exit status 2.",
           ""]
    for name, (summary, command_flags) in found.items():
        out += [f"## experiments.{name}", "", summary, "",
                "| flag | type | default | meaning |", "|---|---|---|---|",
                *(_row(flag) for flag in command_flags), ""]
        rows = settings(name)
        if rows:
            out += [f"Settings (`configs/commands/{name}.py`; `--config.KEY=VALUE`):", "",
                    "| key | default | meaning |", "|---|---|---|",
                    *(f"| `{key}` | `{value!r}` | {text.replace('|', chr(92) + '|')} |" for key, value, text in rows), ""]
    return "\n".join(out)


def main(argv: list[str]) -> None:
    found = collect()
    if "--json" in argv:
        print(json.dumps({"flags": {name: [flag.name for flag in fl] for name, (_, fl) in found.items()},
                          "settings": {name: {k: text for k, _, text in settings(name)} for name in found},
                          "page": render(found)}))
    elif "--write" in argv:
        PAGE.write_text(render(found), encoding="utf-8")
    else:
        sys.stdout.write(render(found))


if __name__ == "__main__":
    main(sys.argv[1:])

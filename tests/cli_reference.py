"""docs/cli.md from the code: every `experiments.*` command with the flags it defines (absl), their types,
defaults and help, and the settings of its default config file (configs/commands/<command>.py, generated from the
command's block in rubric_jax/command_blocks.py: every key's type, default, bounds or choices and meaning, from
`schema.rows`), then the judge block (rubric_jax/judges/spec.py JudgeSpec) likewise. The page is generated so that it
cannot drift; tests/test_docs.py fails when it differs.

  PYTHONPATH=. python -m tests.cli_reference            # print the page
  PYTHONPATH=. python -m tests.cli_reference --write    # rewrite docs/cli.md
  PYTHONPATH=. python -m tests.cli_reference --json     # {"flags": {command: [names]}, "page": ...} for tests

absl registers flags globally and two commands may define the same name (--workdir), so each command's module
is imported in turn and its flags, with those of the shared flag modules it uses (experiments/judge_config.py),
are unregistered before the next one.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from absl import flags

from rubric_jax import schema
from rubric_jax.command_blocks import COMMANDS
from rubric_jax.judges.spec import JudgeSpec

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"
HELPERS = ("cli", "judge_config")  # modules of experiments/ that are not commands


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
    return f"| `--{flag.name}` | {kind} | {default} | {_cell(help_text)} |"


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


def settings(name: str) -> list[schema.Row]:
    """Every key of command `name`'s settings block (rubric_jax/command_blocks.py, which configs/commands/<name>.py is
    generated from): type, default, bounds or choices and meaning; [] for a command without one."""
    return schema.rows(COMMANDS[name]) if name in COMMANDS else []


def _cell(text: str) -> str:
    return text.replace("|", chr(92) + "|")


def render(found: dict[str, tuple[str, list[flags.Flag]]]) -> str:
    """The markdown page."""
    out = ["# Command-line reference", "",
           "Generated from the code by `tests/cli_reference.py`; `tests/test_docs.py` fails when a command's flags",
           "and this page disagree. Regenerate it with:", "",
           "```bash", "PYTHONPATH=. .venv/bin/python -m tests.cli_reference --write", "```", "",
           "Each command runs as `./launch.sh experiments.<command> --flag=value ...` (or `python -m experiments.<command>`",
           "with the repository on `PYTHONPATH`). Its flags are its inputs and outputs; its settings are a config file,",
           "`--config` (default `configs/commands/<command>.py`, generated from the command's block in",
           "`rubric_jax/command_blocks.py`, whose rows are listed below; `run`, `sweep` and `build_rubrics` take an",
           "experiment file such as `configs/tiny.py`), and `--config.<key>=<value>`",
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
            out += [f"Settings (`configs/commands/{name}.py`, generated from `rubric_jax/command_blocks.py` "
                    f"{COMMANDS[name].__name__}; `--config.KEY=VALUE`):", "", *_table(rows), ""]
    out += ["## The judge block", "",
            "`--judge.FIELD=VALUE` on the commands that judge, `--config.judge.FIELD=VALUE` in an experiment "
            "(`configs/common.py` `judge_block()`, generated from `rubric_jax/judges/spec.py` JudgeSpec; "
            "[docs/judges.md](judges.md) explains the hash and the cascade). [hash] marks a field that changes "
            "verdicts and enters the judge hash.", "", *_table(schema.rows(JudgeSpec)), ""]
    return "\n".join(out)


def _table(rows: list[schema.Row]) -> list[str]:
    """A block's rows as a markdown table: key, type, default, bounds or choices, meaning."""
    return ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|",
            *(f"| `{r.key}` | {r.kind} | `{r.default!r}` | {_cell(r.allowed)} | {_cell(r.doc)} |" for r in rows)]


def main(argv: list[str]) -> None:
    found = collect()
    if "--json" in argv:
        print(json.dumps({"flags": {name: [flag.name for flag in fl] for name, (_, fl) in found.items()},
                          "settings": {name: {r.key: r.doc for r in settings(name)} for name in found},
                          "page": render(found)}))
    elif "--write" in argv:
        PAGE.write_text(render(found), encoding="utf-8")
    else:
        sys.stdout.write(render(found))


if __name__ == "__main__":
    main(sys.argv[1:])

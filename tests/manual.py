"""The user-facing documentation as data: README.md and docs/*.md, their text, links and shell commands.

Tests that run a documented command read it from here, so the line on the page is the line that runs;
tests/test_docs.py checks that every command on these pages is run by some test and every link resolves.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pages() -> list[Path]:
    """README.md and every docs/*.md page, in a fixed order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def text() -> str:
    """Every page's text, concatenated (for tests that check a figure or a line is documented)."""
    return "\n".join(page.read_text(encoding="utf-8") for page in pages())


@dataclasses.dataclass(frozen=True)
class Command:
    """One logical shell line of a ```bash block: continuation lines joined, comments dropped."""

    page: str  # relative to the repository root
    line: int  # 1-based line of the page where the command starts
    text: str  # shlex-normalised: tokens joined by single spaces, quoted only where the shell needs it

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)


_FENCE = re.compile(r"^```(\S*)\s*$")


def bash_blocks(page: Path) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each ```bash block of `page`; an unclosed fence is an error."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        fence = _FENCE.match(line.strip())
        if current is None and fence:
            current, start = ([] if fence.group(1) == "bash" else "other"), number + 1
        elif current is not None and line.strip() == "```":
            if current != "other":
                blocks.append((start, current))
            current = None
        elif isinstance(current, list):
            current.append(line)
    if current is not None:
        raise ValueError(f"{page.relative_to(ROOT)}:{start - 1}: code fence never closed")
    return blocks


def commands(page: Path) -> list[Command]:
    """Every command of `page`'s ```bash blocks, in order."""
    found = []
    for start, lines in bash_blocks(page):
        pending, first = "", 0
        for offset, line in enumerate(lines):
            if not pending:
                first = start + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            tokens = shlex.split(pending + line, comments=True)
            pending = ""
            if tokens:
                found.append(Command(str(page.relative_to(ROOT)), first, shlex.join(tokens)))
    return found


def all_commands() -> list[Command]:
    """Every documented command, page by page."""
    return [command for page in pages() for command in commands(page)]


def command(*parts: str) -> Command:
    """The one documented command that contains every string in `parts` (a test's handle on its line)."""
    matches = [c for c in all_commands() if all(part in c.text for part in parts)]
    if len(matches) != 1:
        raise LookupError(f"{len(matches)} documented commands contain {parts}: {[c.text for c in matches]}")
    return matches[0]

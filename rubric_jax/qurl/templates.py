"""Prompt templates as versioned data files (`rubric_jax/qurl/prompts/<name>.txt`).

A file starts with `# key: value` header lines (`template: <name>` equal to the file name and a semantic
`version: X.Y.Z`; other `#` lines are comments), then a `[system]` section and a `[user]` section.
Placeholders are `${field}` (string.Template), so JSON braces in a template need no escaping; rendering
requires exactly the template's fields. The version and a sha256 of the file go into the construction
report and every built rubric's changelog, so a rubric can be traced to the prompt text that made it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import string
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
_HEADER_RE = re.compile(r"^#\s*([a-z_]+)\s*:\s*(.*?)\s*$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")


class TemplateError(ValueError):
    """A malformed template file, or a render with missing or unknown fields."""


@dataclasses.dataclass(frozen=True)
class ChatPrompt:
    """Chat messages for one generation (system, then user)."""

    messages: tuple[dict[str, str], ...]


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """A parsed template: name, version, the two message texts, their fields and the file's sha256."""

    name: str
    version: str
    system: str
    user: str
    sha256: str

    @property
    def fields(self) -> frozenset[str]:
        """Placeholder names used in the system and user texts."""
        return frozenset(string.Template(self.system).get_identifiers() + string.Template(self.user).get_identifiers())

    @property
    def tag(self) -> str:
        """`name@version`, as the report and changelogs cite it."""
        return f"{self.name}@{self.version}"

    def render(self, **values: str) -> ChatPrompt:
        """The chat prompt with every field substituted; missing or unknown fields are errors."""
        missing, unknown = sorted(self.fields - set(values)), sorted(set(values) - self.fields)
        if missing or unknown:
            raise TemplateError(f"template {self.tag}: missing field(s) {missing}, unknown field(s) {unknown}")
        return ChatPrompt(({"role": "system", "content": string.Template(self.system).substitute(values)},
                           {"role": "user", "content": string.Template(self.user).substitute(values)}))


def parse_template(text: str, name: str, source: str) -> PromptTemplate:
    """A PromptTemplate from a file's text; errors name `source`."""
    lines = text.splitlines()
    header: dict[str, str] = {}
    while lines and lines[0].startswith("#"):
        m = _HEADER_RE.match(lines.pop(0))
        if m:
            header[m.group(1)] = m.group(2)
    if header.get("template") != name:
        raise TemplateError(f"{source}: header 'template: {name}' expected, got {header.get('template')!r}")
    if not _VERSION_RE.match(header.get("version", "")):
        raise TemplateError(f"{source}: header 'version: MAJOR.MINOR.PATCH' expected, got {header.get('version')!r}")
    body = "\n".join(lines)
    m = re.fullmatch(r"\[system\]\n(.+?)\n\[user\]\n(.+?)\n*", body, re.DOTALL)
    if m is None:
        raise TemplateError(f"{source}: expected a [system] section, then a [user] section, after the header")
    for section in m.groups():
        if not string.Template(section).is_valid():
            raise TemplateError(f"{source}: a '$' that is not a ${{field}} placeholder (write $$ for a dollar sign)")
    return PromptTemplate(name, header["version"], m.group(1), m.group(2), hashlib.sha256(text.encode()).hexdigest())


def load_template(name: str, directory: Path = PROMPTS_DIR) -> PromptTemplate:
    """The template `<directory>/<name>.txt`."""
    path = directory / f"{name}.txt"
    if not path.is_file():
        raise TemplateError(f"{path}: prompt template does not exist")
    return parse_template(path.read_text(encoding="utf-8"), name, str(path))

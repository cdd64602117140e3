"""What the `experiments.*` commands share: bad input ends in one line on stderr that names the command,
exit status 2 and no traceback; absl's INFO lines (orbax, jax, tfds) stay quiet unless --verbosity is given."""

from __future__ import annotations

import sys
from typing import NoReturn

from absl import flags, logging


def fail(command: str, message: str, status: int = 2) -> NoReturn:
    """`<command>: error: <message>` on stderr, then exit `status` (2: bad input; 1: the work itself failed)."""
    print(f"{command}: error: {message}", file=sys.stderr)
    sys.exit(status)


def fail_write(command: str, out: object, error: OSError) -> NoReturn:
    """A failed write (a full disk) as one line, exit status 1; the outputs are atomic, so nothing was written."""
    reason = error.strerror or " ".join(str(error).split())
    fail(command, f"writing {out} failed ({reason}); nothing was written", status=1)


def start(command: str, argv: list[str]) -> None:
    """The start of every main(): no positional arguments, and WARNING logging unless --verbosity is given
    (orbax and jax INFO lines would bury the progress lines)."""
    if len(argv) > 1:
        fail(command, f"unexpected positional arguments {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)

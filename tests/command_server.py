"""Many runs of one command (`python -m MODULE ARGS`) from one process that imports MODULE once and forks a child
per run: a bad-input case then costs the command's own work (milliseconds) instead of the 2-4 CPU-seconds of imports
(jax, orbax, ...) that a fresh interpreter pays before it can reject a flag. The child runs MODULE afresh as
`__main__` (runpy, as `python -m` does; only the libraries it imports were imported before the fork), with sys.argv as
`python -m` sets it, stdin from /dev/null and its own stdout, stderr and exit status; an uncaught exception prints its
traceback and exits 1, as the interpreter does.

    server = CommandServer("experiments.evaluate", env=command_env())
    result = server.run("--config.benchmark=mmlu")  # a subprocess.CompletedProcess
    result = server.run(*args, setup=code)  # Python `code` run in the child first: a library patched to fail
    started = server.start(...)  # a run not waited for: started.pid takes signals, started.wait() its outcome
    server.close()

A command that imports its libraries inside main (experiments.run: jax.distributed must start first) has them in
`PRELOAD`, imported by its server too, so that a case does not pay them either.

The server is `python tests/command_server.py MODULE [PRELOAD ...]` (protocol: one JSON line per run on stdin, its
{args, setup}, a {pid} JSON line back when its child starts and a {returncode, stdout, stderr} line when it has
exited); it never uses jax's devices itself, so the children fork from a process with no XLA client and no threads of
its own.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300  # per run, as the subprocess.run calls these runs replaced
# What a command imports inside main, beside its module's own imports: CPU-s a run of experiments.run 2.7,
# build_rubrics 1.7, calibrate 0.5 (after the inputs are read: a bad labels line fails before JAX loads).
PRELOAD = {"experiments.run": ("rubric_jax.train.loop",), "experiments.build_rubrics": ("rubric_jax.qurl.pipeline",),
           "experiments.calibrate": ("rubric_jax.calibration.run", "rubric_jax.calibration.report",
                                     "rubric_jax.judges.spec")}


class CommandServer:
    """One server process for `module` in `env` (the variables a command under test runs with), run from the
    repository root, that imported `module` and its `PRELOAD`."""

    def __init__(self, module: str, env: dict[str, str]):
        self.module = module
        preload = PRELOAD.get(module, ())
        self._proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), module, *preload], cwd=REPO,
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, *args: object, setup: str = "") -> subprocess.CompletedProcess:
        """`python -m MODULE *args`, in a child of the server (after running the Python code `setup` in it, e.g. a
        library patched to fail as a full disk would); its exit status, stdout and stderr."""
        return self.start(*args, setup=setup).wait()

    def start(self, *args: object, setup: str = "") -> Started:
        """`python -m MODULE *args` (after `setup`, as in `run`) started in a child of the server and not waited for
        (the child's pid takes signals); the server runs one child at a time, so `wait()` for it before the next run."""
        self._proc.stdin.write(json.dumps({"args": [str(a) for a in args], "setup": setup}) + "\n")
        self._proc.stdin.flush()
        return Started(self, [self.module, *map(str, args)], self._read()["pid"])

    def _read(self) -> dict:
        line = self._proc.stdout.readline()
        assert line, f"the {self.module} command server died (exit {self._proc.poll()})"
        return json.loads(line)

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=60)


@dataclasses.dataclass(frozen=True)
class Started:
    """A run of a command server's child: its pid and, once it has exited, its outcome."""

    server: CommandServer
    args: list[str]
    pid: int

    def running(self) -> bool:
        """Whether the child has not exited (the server reaps it at once: an exited pid is gone)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def wait(self) -> subprocess.CompletedProcess:
        """Waits for the child to exit: its exit status (-N when killed by signal N), stdout and stderr."""
        result = self.server._read()
        return subprocess.CompletedProcess(self.args, result["returncode"], result["stdout"], result["stderr"])


def _import_dependencies(module_name: str, preload: list[str]) -> None:
    """Imports `module_name` and everything it imports, and the `preload` modules, then forgets the command's own
    modules (experiments.*, configs.*, `module_name` itself) and the flags they defined: a child then runs the command
    module afresh as `__main__`, as `python -m` does (ml_collections reads the command line while the module defines
    --config), with its libraries already imported."""
    from absl import app, flags, logging  # noqa: F401  (absl's own flags: kept)

    before = set(flags.FLAGS)
    for name in (module_name, *preload):
        importlib.import_module(name)
    for name in set(flags.FLAGS) - before:
        delattr(flags.FLAGS, name)
    for name in [n for n in sys.modules if n.split(".")[0] in ("experiments", "configs") or n == module_name]:
        del sys.modules[name]


def _child(module_name: str, args: list[str], setup: str, stdout: int, stderr: int) -> None:
    """In the forked child: run the Python code `setup` (a patch of an imported library; its failure is the run's
    uncaught exception), then the module as `__main__` with `args`, then exit with its status (never returns)."""
    status = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
        signal.alarm(TIMEOUT_S)  # a hung case ends (killed by SIGALRM: status -14) instead of hanging the suite
        exec(compile(setup, "<setup>", "exec"), {"__name__": "__setup__"})  # noqa: S102  (the test's own code)
        sys.argv = [str(REPO / (module_name.replace(".", "/") + ".py")), *args]
        runpy.run_module(module_name, run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:  # sys.exit("message"): the interpreter prints the message and exits 1
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001  (what the interpreter does with an uncaught exception)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def serve(module_name: str, preload: list[str]) -> None:
    """Imports the module and `preload`, then runs each JSON {args, setup} line read from stdin in a forked child."""
    _import_dependencies(module_name, preload)
    for line in sys.stdin:
        run = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(module_name, run["args"], run["setup"], out.fileno(), err.fileno())
            print(json.dumps({"pid": pid}), flush=True)
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            texts = []
            for f in (out, err):
                f.seek(0)
                texts.append(f.read().decode(errors="replace"))
        print(json.dumps({"returncode": status, "stdout": texts[0], "stderr": texts[1]}), flush=True)


if __name__ == "__main__":
    sys.path[0] = str(REPO)  # as `python -m` from the repository root: the repository first, not tests/
    serve(sys.argv[1], sys.argv[2:])

"""Hyperparameter sweeps over an ml-collections config file (big_vision's convention), and their summary.

A config file may define, beside `get_config(arg)`:

    def sweep(add, arg):
        for lr, beta in itertools.product((1e-4, 2e-4), (0.0, 0.02)):   # products, zips: plain Python
            add(**{"rl.lr": lr, "rl.beta": beta})

Each `add(**overrides)` is one variant: `experiments.run` with `--config.<key>=<value>` per override, in
`<sweep workdir>/<variant name>/`, where the name is made of the overrides ("lr=0.0001,beta=0.0"). Every
variant is resolved exactly as `experiments.run` resolves its flags (rubric_jax/config_files.py, locked)
and validated as `experiments.run` validates it (train/settings.py) before anything runs, so an unknown key
or a bad value fails up front, naming the variant and the key.
A variant is finished when its workdir's done.json (metrics.mark_done) names its resolved config; a
re-run skips finished variants and resumes the others (`experiments.run` resumes from a workdir). Config
files are loaded by path, never imported from `configs/`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import difflib
import functools
import hashlib
import inspect
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_collections
from absl import flags as absl_flags

from rubric_jax import config_boundary, config_files, metrics, plots, seed_groups
from rubric_jax.files import write_atomic
from rubric_jax.jsonl import read_jsonl
from rubric_jax.train import settings

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
SEED_MEAN_PLOTS = "seed_mean"  # plots/seed_mean/: one curve per group of variants that differ only in seed
EVAL_DIMENSION = "eval/reward/"  # a dimension's held-out reward: eval/reward/<dimension>
COMPILATION_CACHE_DIR = "jax_cache"  # shared by the variants of a sequential sweep (same programs, compiled once)
_MAX_NAME = 120
_EXTRA_FLAG = re.compile(r"^--config\.([A-Za-z0-9_.]+)=(.*)$", re.DOTALL)


class SweepError(ValueError):
    """A sweep that cannot run as written; the message names the config file, the variant and the key."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """One run of a sweep."""

    name: str  # directory name inside the sweep workdir, made of the overrides
    overrides: dict[str, Any]  # config key ("rl.lr") -> value, as the sweep added it
    flags: tuple[str, ...]  # the same as `--config.<key>=<value>` flags of experiments.run
    config: ml_collections.ConfigDict  # get_config(arg) + the sweep's extra flags + the overrides, locked


@dataclasses.dataclass(frozen=True)
class Sweep:
    """The validated variants of a config file's `sweep(add, arg)`."""

    config_file: str  # as given: "configs/tiny.py" or "configs/qwen7b.py:size=1.5b"
    extra_flags: tuple[str, ...]  # `--config.<key>=<value>` applied to every variant
    variants: tuple[Variant, ...]

    def run_flags(self, variant: Variant, workdir: str | Path) -> list[str]:
        """The flags of `experiments.run` for one variant (the sweep runs exactly these, and prints them)."""
        return [f"--config={self.config_file}", f"--workdir={Path(workdir) / variant.name}", *self.extra_flags,
                *variant.flags]


# ------------------------------------------------------------------------------------------ expand
def flag_value(value: str | bool | int | float | tuple | list) -> str:
    """A sweep value as config_flags parses it back: strings as they are, numbers, bools and tuples as
    Python literals (repr: exact, so 1e-4 and 1.00001e-4 never share a flag or a name)."""
    if isinstance(value, str):
        return value
    return repr(tuple(value)) if isinstance(value, (tuple, list)) else repr(value)


def load_sweep(config_file: str, extra_flags: Sequence[str] = ()) -> Sweep:
    """Expands `sweep(add, arg)` of a config file (path[:arg]) and validates every variant; raises SweepError."""
    path, _, arg = config_file.partition(":")
    sweep_fn = _sweep_function(path)
    plain = _resolve(config_file, [], config_file)
    extra_keys = _extra_keys(config_file, extra_flags)
    for key in extra_keys:
        _check_key(plain, key, f"{config_file}: extra flag --config.{key}")
    if extra_flags:
        _resolve(config_file, extra_flags, f"{config_file} with {' '.join(extra_flags)}")
    added: list[dict[str, Any]] = []

    def add(**overrides: Any) -> None:
        added.append(overrides)

    try:
        sweep_fn(add, arg or None)
    except Exception as e:  # the config file's own code: any error is the file's, named with its line
        raise SweepError(f"{config_files.line_in(path, e)}: sweep(add, arg) raised {config_files.one_line(e)}") from None
    if not added:
        raise SweepError(f"{path}: sweep(add, arg) added no variant")
    flags_of = []
    for index, overrides in enumerate(added, start=1):
        described = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
        where = f"{path}: sweep variant {index} of {len(added)} ({described})"
        for key, value in overrides.items():
            _check_key(plain, key, where)
            if key in extra_keys:
                raise SweepError(f"{where}: --config.{key} is given on the command line too, but the sweep sets it")
            if not isinstance(value, (str, bool, int, float, tuple, list)):
                raise SweepError(f"{where}: {key} must be a string, number, bool or tuple, not {type(value).__name__}")
        flags_of.append(tuple(f"--config.{key}={flag_value(value)}" for key, value in overrides.items()))
    names = variant_names(added)
    variants = []
    for index, (name, overrides, flags) in enumerate(zip(names, added, flags_of), start=1):
        where = f"{path}: sweep variant {index} of {len(added)} ({name})"
        if name in names[:index - 1]:
            raise SweepError(f"{where}: same name as variant {names.index(name) + 1}; give every variant other values")
        config = _resolve(config_file, [*extra_flags, *flags], where)
        try:
            settings.validate(config_boundary.experiment(config))  # every variant, before any variant runs
        except ValueError as e:
            raise SweepError(f"{where}: {e}") from None
        variants.append(Variant(name, dict(overrides), flags, config))
    return Sweep(config_file, tuple(extra_flags), tuple(variants))


def _sweep_function(path: str) -> Any:
    """`sweep` of the config file at `path`, loaded by path (config_files: checked to take (add, arg))."""
    try:
        module = config_files.load_module(path)
    except config_files.ConfigFileError as e:
        raise SweepError(str(e)) from None
    sweep_fn = getattr(module, "sweep", None)
    if not callable(sweep_fn):
        raise SweepError(f"{path}: defines no sweep(add, arg) function beside get_config")
    try:
        inspect.signature(sweep_fn).bind(lambda **kw: None, None)
    except TypeError:
        raise SweepError(f"{path}: sweep must take two arguments, (add, arg)") from None
    return sweep_fn


def _extra_keys(config_file: str, extra_flags: Sequence[str]) -> set[str]:
    """The config keys of `--config.<key>=<value>` flags applied to every variant."""
    keys = set()
    for flag in extra_flags:
        match = _EXTRA_FLAG.match(flag)
        if not match:
            raise SweepError(f"{config_file}: extra flag {flag!r} is not of the form --config.<key>=<value>")
        keys.add(match.group(1))
    return keys


def _resolve(config_file: str, flags: Sequence[str], where: str) -> ml_collections.ConfigDict:
    """The locked config `experiments.run --config=<config_file> <flags>` would run with."""
    argv = ["experiments.run", f"--config={config_file}", *flags]
    values = absl_flags.FlagValues()
    holder = config_files.DEFINE_config_file("config", None, "Experiment config file.", flag_values=values,
                                             sys_argv=argv)
    try:
        values(argv)
        return holder.value
    except config_files.ConfigFileError as e:  # names --config=FILE
        raise SweepError(str(e) if where == config_file else f"{where}: {e}") from None
    except (absl_flags.Error, AttributeError, KeyError, OSError, TypeError, ValueError) as e:
        last_line = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise SweepError(f"{where}: {last_line}") from None


def _check_key(config: ml_collections.ConfigDict, key: str, where: str) -> None:
    """Raises SweepError unless `key` ("rl.lr") names a field of `config`, suggesting the closest one."""
    node, walked = config, []
    for part in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            siblings = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
            close = difflib.get_close_matches(part, siblings, n=1)
            hint = f" (did you mean {'.'.join([*walked, close[0]])!r}?)" if close else ""
            raise SweepError(f"{where}: unknown config key {key!r}{hint}")
        node, walked = node[part], [*walked, part]


def variant_names(added: Sequence[Mapping[str, Any]]) -> list[str]:
    """File-system-safe names made of each variant's overrides, "lr=0.0001,beta=0.0": a key is shown by its
    last part unless two swept keys share it (then in full); unsafe characters become "-"; over 120
    characters, the name is cut and ends in a hash of the whole; no overrides: "base"."""
    keys = list(dict.fromkeys(k for overrides in added for k in overrides))
    last_parts = [k.rsplit(".", 1)[-1] for k in keys]
    label = {k: (part if last_parts.count(part) == 1 else k) for k, part in zip(keys, last_parts)}
    names = []
    for overrides in added:
        text = ",".join(f"{label[k]}={_name_value(v)}" for k, v in overrides.items()) or "base"
        if len(text) > _MAX_NAME:
            text = f"{text[:_MAX_NAME - 13]}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"
        names.append(text)
    return names


def _name_value(value: Any) -> str:
    """A value as it appears in a variant name: tuples joined by "+" ("sft+grpo"), unsafe characters as "-"."""
    if isinstance(value, (tuple, list)):
        return "+".join(map(_name_value, value))
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", flag_value(value)).rstrip("-") or "-"


# --------------------------------------------------------------------------------------------- run
def run_sweep(sweep: Sweep, workdir: str | Path, entry_module: str, log: Callable[[str], None] = print
              ) -> dict[str, str]:
    """Runs the unfinished variants one after another, each as `python -m <entry_module> <run_flags>` in its
    own process (what a cluster runs). SIGTERM or Ctrl-C is passed on as SIGTERM to the running variant,
    which saves and exits; the sweep then stops. Returns {variant name: outcome} for the variants it ran
    ("exit N" when one failed, "stopped" when interrupted); finished variants are skipped."""
    workdir = Path(workdir)
    env = dict(os.environ)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(workdir / COMPILATION_CACHE_DIR))
    outcomes: dict[str, str] = {}
    stop: list[int] = []
    current: list[subprocess.Popen] = []

    def request_stop(signum: int, frame: Any) -> None:
        stop.append(signum)
        for proc in current:
            proc.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for index, variant in enumerate(sweep.variants, start=1):
            head = f"[{index}/{len(sweep.variants)}] {variant.name}"
            if metrics.is_done(workdir / variant.name, variant.config):
                log(f"{head}: finished earlier, skipped")
                continue
            if stop:
                break
            log(f"{head}: running in {workdir / variant.name}")
            proc = spawn_child([sys.executable, "-m", entry_module, *sweep.run_flags(variant, workdir)], env)
            current.append(proc)
            if stop:  # a signal that came while the process was starting
                proc.send_signal(signal.SIGTERM)
            returncode = proc.wait()
            current.clear()
            outcomes[variant.name] = "stopped" if stop else f"exit {returncode}"
            if returncode and not stop:
                log(f"{head}: failed (exit {returncode}); going on with the next variant")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return outcomes


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Looked up here, not in the forked child (a dlopen after fork can deadlock on a lock another thread held).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with(parent: int) -> None:
    """In a forked child before exec: SIGTERM this process when `parent` dies (Linux prctl PDEATHSIG), and now
    if it already has (the child was re-parented before the call)."""
    if _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        os._exit(125)  # a child that would outlive its sweep is not started
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def spawn_child(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    """`argv` in its own process group (a terminal's Ctrl-C reaches only the sweep, which asks the run to
    save), sent SIGTERM (save and exit) when the sweep dies, even by `kill -9` (on Linux): no run outlives its
    sweep to write beside the run a re-started sweep starts (the workdir lock refuses such a second writer)."""
    die_with_sweep = functools.partial(_die_with, os.getpid()) if _PRCTL is not None else None
    return subprocess.Popen(list(argv), env=dict(env), process_group=0, preexec_fn=die_with_sweep)


# ----------------------------------------------------------------------------------------- summary
def variant_status(variant: Variant, workdir: Path, outcomes: Mapping[str, str]) -> str:
    """finished | stopped | failed (exit N) | unfinished | not started."""
    run_dir = workdir / variant.name
    if metrics.is_done(run_dir, variant.config):
        return "finished"
    outcome = outcomes.get(variant.name, "")
    if outcome == "stopped":
        return "stopped"
    if outcome.startswith("exit ") and outcome != "exit 0":
        return f"failed ({outcome})"
    return "unfinished" if (run_dir / metrics.METRICS_FILE).exists() else "not started"


def run_summary(run_dir: str | Path) -> dict[str, Any]:
    """Final and best held-out reward (with steps), each dimension's held-out reward at the final eval, final KL
    and training reward, the mean zero-std fraction, GRPO steps done, seconds per GRPO step and wall time of one
    run, from its metrics.jsonl (None where the run has no such row yet)."""
    path = Path(run_dir) / metrics.METRICS_FILE
    rows = metrics.read_jsonl_metrics(path) if path.exists() else []
    eval_rows = [r for r in rows if r.get("stage") == "eval" and metrics.scalar_value(r.get("eval/reward_mean")) is not None]
    evals = [(r["step"], metrics.scalar_value(r["eval/reward_mean"])) for r in eval_rows]
    best = metrics.best_eval(evals) or (None, None)  # the checkpoint `--config.which=best` picks
    grpo = [r for r in rows if r.get("stage") == "grpo"]
    zero_std = [v for v in (metrics.scalar_value(r.get("zero_std_frac")) for r in grpo) if v is not None]
    return {
        "final_eval_reward": evals[-1][1] if evals else None, "final_eval_step": evals[-1][0] if evals else None,
        "final_eval_dimensions": {k.removeprefix(EVAL_DIMENSION): metrics.scalar_value(v)
                                  for k, v in eval_rows[-1].items() if k.startswith(EVAL_DIMENSION)} if evals else {},
        "best_eval_reward": best[1], "best_eval_step": best[0],
        "final_kl": metrics.scalar_value(grpo[-1].get("kl")) if grpo else None,
        "final_train_reward": metrics.scalar_value(grpo[-1].get("reward/mean")) if grpo else None,
        "zero_std_frac": sum(zero_std) / len(zero_std) if zero_std else None,
        "grpo_steps": grpo[-1]["step"] if grpo else 0,
        "seconds_per_step": seconds_per_step(grpo),
        "wall_seconds": wall_seconds(path) if path.exists() else 0.0,
    }


def seconds_per_step(grpo_rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The median time between consecutive GRPO steps' rows: a step's cost without the first step's compile
    or the evals between some steps (a resume's gap is one outlier among many); None under 3 steps."""
    gaps = [b["time"] - a["time"] for a, b in zip(grpo_rows, grpo_rows[1:])
            if "time" in a and "time" in b and b["step"] == a["step"] + 1]
    return statistics.median(gaps) if len(gaps) >= 2 else None


def wall_seconds(metrics_path: str | Path) -> float:
    """Seconds a run spent logging, summed over its starts: from each start's run_info line to the last row
    before the next start (start-up before the log opens, and rows a resume dropped, are not counted)."""
    total, start, last = 0.0, None, None
    for _, row in read_jsonl(metrics_path):
        if "run_info" in row:
            total += (last - start) if start is not None else 0.0
            start = last = row["time"]
        elif start is not None:
            last = row["time"]
    return total + ((last - start) if start is not None else 0.0)


def summarize(sweep: Sweep, workdir: str | Path, outcomes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The sweep's summary.json content: per variant its overrides, status and `run_summary`; and when variants
    differ in `seed`, the groups that differ only in it (`seed_groups.aggregate`)."""
    workdir = Path(workdir)
    variants = [{"name": v.name, "workdir": str(workdir / v.name), "overrides": v.overrides,
                 "status": variant_status(v, workdir, outcomes or {}), **run_summary(workdir / v.name)}
                for v in sweep.variants]
    return {"config_file": sweep.config_file, "extra_flags": list(sweep.extra_flags), "variants": variants,
            "seed_groups": seed_groups.aggregate(variants, lambda overrides: variant_names([overrides])[0])}


def write_summary(sweep: Sweep, workdir: str | Path, summary: Mapping[str, Any]) -> list[Path]:
    """Writes summary.json and summary.md (`summarize`'s content) and the overlay plots (workdir/plots) of
    every variant with metrics; returns the paths written, the two summaries first."""
    workdir = Path(workdir)
    runs = {v.name: metrics.read_jsonl_metrics(workdir / v.name / metrics.METRICS_FILE) for v in sweep.variants
            if (workdir / v.name / metrics.METRICS_FILE).exists()}
    plot_paths = plots.plot_runs(runs, workdir / plots.PLOTS_DIR)
    by_group = {g["name"]: [runs[name] for name in g["variants"] if name in runs] for g in summary["seed_groups"]}
    if any(by_group.values()):  # each group one curve: its seeds' mean
        plot_paths += plots.plot_runs({name: seed_groups.mean_rows(rows) for name, rows in by_group.items() if rows},
                                      workdir / plots.PLOTS_DIR / SEED_MEAN_PLOTS)
    markdown = summary_markdown(summary, [p.relative_to(workdir) for p in plot_paths])
    return [write_atomic(workdir / SUMMARY_JSON, json.dumps(metrics.jsonable(summary), indent=2) + "\n"),
            write_atomic(workdir / SUMMARY_MD, markdown), *plot_paths]


def summary_markdown(summary: Mapping[str, Any], plot_paths: Sequence[Path] = ()) -> str:
    """A table a person reads: one row per variant, a column per swept key, then the results."""
    variants = summary["variants"]
    keys = list(dict.fromkeys(k for v in variants for k in v["overrides"]))
    lines = [f"# Sweep of {summary['config_file']}: {len(variants)} variants", ""]
    if summary["extra_flags"]:
        lines += ["Every variant also ran with `" + " ".join(summary["extra_flags"]) + "`.", ""]
    lines += ["| variant | " + " | ".join(keys) + " | status | final eval reward (step) | best eval reward (step) "
              "| final KL | final train reward | GRPO steps | wall time |",
              "|---" * (len(keys) + 8) + "|"]
    for v in variants:
        cells = [f"[{v['name']}]({v['name']}/)",
                 *(flag_value(v["overrides"][k]) if k in v["overrides"] else "-" for k in keys), v["status"],
                 _at(v["final_eval_reward"], v["final_eval_step"]), _at(v["best_eval_reward"], v["best_eval_step"]),
                 _cell(v["final_kl"]), _cell(v["final_train_reward"]), str(v["grpo_steps"]),
                 _duration(v["wall_seconds"])]
        lines.append("| " + " | ".join(cells) + " |")
    ranked = [v for v in variants if v["final_eval_reward"] is not None and math.isfinite(v["final_eval_reward"])]
    if ranked:
        top = max(ranked, key=lambda v: v["final_eval_reward"])
        lines += ["", f"Highest final held-out reward: **{top['name']}** "
                      f"({metrics.format_number(top['final_eval_reward'])} at GRPO step {top['final_eval_step']})."]
    if summary.get("seed_groups"):
        lines += ["", "Over seeds (spread: half the range; each dimension's held-out reward at the final eval, mean):",
                  "", *seed_groups.markdown_table(summary["seed_groups"])]
    if plot_paths:
        lines += ["", "Overlay plots: " + ", ".join(
            f"[{p.stem if p.parent.name == plots.PLOTS_DIR else p.parent.name + '/' + p.stem}]({p.as_posix()})"
            for p in plot_paths) + "."]
    return "\n".join(lines) + "\n"


def _cell(value: float | None) -> str:
    return "-" if value is None else metrics.format_number(value)


def _at(value: float | None, step: int | None) -> str:
    return "-" if value is None else f"{metrics.format_number(value)} ({step})"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"

"""benchmarks/sft_start.py: each variant of configs/tiny_losses.py starts from its own seed's SFT run, copied into its
directory once, and an SFT run of other SFT settings is refused (no training here: the SFT runs are stand-ins)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from benchmarks import sft_start
from rubric_jax import metrics, sweeps

ROOT = Path(__file__).resolve().parents[1]
LOSSES = str(ROOT / "configs" / "tiny_losses.py")


def _stand_in_sft(sft_dir: Path, config) -> None:
    """A finished SFT-only run of `config` as far as sft_start reads it: config.json, done.json, a checkpoint, rows."""
    workdir = sft_dir / f"seed_{config.seed}"
    (workdir / "checkpoints" / "sft" / "176").mkdir(parents=True)
    (workdir / "checkpoints" / "sft" / "176" / "params").write_text(f"seed {config.seed}")
    (workdir / "config.json").write_text(sft_start.sft_config(config).to_json_best_effort(indent=2, sort_keys=True))
    (workdir / metrics.DONE_FILE).write_text("{}\n")
    (workdir / "metrics.jsonl").write_text(json.dumps({"stage": "sft", "step": 176, "seed": config.seed}) + "\n")


def test_every_loss_variant_is_seeded_from_its_seeds_sft_once(tmp_path, command_server):
    sweep = sweeps.load_sweep(LOSSES)
    assert len(sweep.variants) == 15 and all(v.config.rl.updates_per_batch == 2 for v in sweep.variants)
    assert {"seed=0", "loss=cispo,seed=1", "loss=sapo,seed=2", "clip_ratio_c=3.0,seed=0",
            "importance_level=sequence,clip_low=0.0003,clip_high=0.0004,seed=1"} <= {v.name for v in sweep.variants}
    for seed in (0, 1, 2):
        _stand_in_sft(tmp_path / "sft", next(v.config for v in sweep.variants if v.config.seed == seed))
    out = tmp_path / "sweep"
    assert sorted(sft_start.seed_sweep(LOSSES, tmp_path / "sft", out)) == sorted(v.name for v in sweep.variants)
    for v in sweep.variants:
        assert (out / v.name / "checkpoints" / "sft" / "176" / "params").read_text() == f"seed {v.config.seed}"
        assert json.loads((out / v.name / "metrics.jsonl").read_text())["seed"] == v.config.seed
    assert sft_start.seed_sweep(LOSSES, tmp_path / "sft", out) == []  # seeded directories are left as they are
    command = ["--config=configs/tiny_losses.py", f"--sft_dir={tmp_path / 'sft'}"]  # `python -m benchmarks.sft_start`
    server = command_server("benchmarks.sft_start")  # both runs forked from one process that imported the command
    seeded = server.run(*command, f"--sweep_dir={tmp_path / 'by_command'}")
    assert seeded.returncode == 0, seeded.stderr[-3000:]
    assert seeded.stdout.startswith(f"seeded 15 variant directories of {tmp_path / 'by_command'} from ")
    assert (tmp_path / "by_command" / "loss=cispo,seed=2" / "checkpoints" / "sft" / "176" / "params").is_file()
    missing = server.run(*command)
    assert (missing.returncode, missing.stderr) == (2, "benchmarks.sft_start: --sweep_dir is required\n")


def test_an_unknown_loss_option_names_the_file():
    from configs import tiny_losses

    with pytest.raises(ValueError, match=r"configs/tiny_losses.py: option='ppo' is not one of \['cispo', 'dual_clip', "
                                         r"'grpo', 'gspo', 'sapo'\]"):
        tiny_losses.get_config("option=ppo")
    assert tiny_losses.get_config("option=sapo").rl.loss == "sapo"


def test_an_sft_run_of_other_sft_settings_is_refused(tmp_path):
    config = sweeps.load_sweep(LOSSES).variants[0].config
    other = sft_start.sft_config(config)
    other.sft.lr = 1e-3
    _stand_in_sft(tmp_path, other)
    with pytest.raises(ValueError, match=r"seed_0/config.json: its sft differs from this run's config"):
        sft_start.sft_run(config, tmp_path)
    with pytest.raises(ValueError, match="checkpoints: exists"):
        sft_start.start_from(tmp_path / "seed_0", tmp_path / "seed_0")


@pytest.mark.parametrize("sweep", ["runs", "runs/sweep"])
def test_a_sweep_dir_overlapping_the_sft_dir_is_refused_before_any_write(tmp_path, sweep):
    """--sweep_dir equal to --sft_dir (or one inside the other) is refused with exit 2 before an SFT runs."""
    holders = {n: type("Flag", (), {"name": n, "value": v})() for n, v in (
        ("config", "configs/tiny_losses.py"), ("sft_dir", str(tmp_path / "runs")), ("sweep_dir", str(tmp_path / sweep)))}
    with pytest.raises(SystemExit) as exit_info:
        sft_start.main([], **holders)
    assert exit_info.value.code == 2 and not (tmp_path / "runs").exists()


def test_the_documented_sweep_command_runs_every_option_of_a_seed_before_the_next_seed(command_server):
    """configs/tiny_losses.py's sweep command, as its docstring writes it, lists the 15 runs seed by seed (a sweep
    stopped part-way has complete seeds), each from the same config file in the documented directory."""
    from configs import tiny_losses

    line = next(line for line in tiny_losses.__doc__.splitlines() if line.strip().startswith("./launch.sh"))
    launcher, module, *flags = shlex.split(line)
    assert (launcher, module) == ("./launch.sh", "experiments.sweep")
    proc = command_server(module).run(*flags, "--print_commands")
    assert proc.returncode == 0, proc.stderr
    runs = proc.stdout.splitlines()
    assert [re.search(r" --config\.seed=(\d+)$", run).group(1) for run in runs] == ["0"] * 5 + ["1"] * 5 + ["2"] * 5
    assert all(run.startswith("./launch.sh experiments.run --config=configs/tiny_losses.py "
                              "--workdir=runs/tiny_losses/") for run in runs)

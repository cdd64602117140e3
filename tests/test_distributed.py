"""Which environments start jax.distributed (the launch.sh cluster contract)."""
import jax
import pytest

from rubric_jax import distributed
from rubric_jax.distributed import describe_environment


def test_single_process_environments_do_not_initialise():
    assert describe_environment({}) is None
    assert describe_environment({"SLURM_NTASKS": "1"}) is None
    assert describe_environment({"TPU_WORKER_HOSTNAMES": "localhost"}) is None


def test_explicit_coordinator_variables():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "2"}
    assert describe_environment(env) == {
        "coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 2}


def test_incomplete_coordinator_variables_name_what_is_missing():
    with pytest.raises(ValueError, match="JAX_PROCESS_ID"):
        describe_environment({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2"})


def test_slurm_and_tpu_pods_use_autodetection():
    assert describe_environment({"SLURM_NTASKS": "16"}) == {}
    assert describe_environment({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"}) == {}


def test_process_blocks_are_disjoint_equal_and_cover_the_batch(monkeypatch):
    rows = list(range(12))
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    blocks = []
    for p in range(3):
        monkeypatch.setattr(jax, "process_index", lambda p=p: p)
        blocks.append(distributed.process_block(rows))
    assert blocks == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # process p: block p, as global_batch places it
    distributed.check_divides(12, "rl.questions_per_step")
    with pytest.raises(ValueError, match=r"config.rl.questions_per_step=7: must be a multiple of the number of "
                                         r"processes \(3\)"):
        distributed.check_divides(7, "rl.questions_per_step")
    monkeypatch.setattr(jax, "process_index", lambda: 2)
    assert distributed.block_bounds(7) == (4, 7)  # uneven host-side blocks (golden references): 2, 2, 3 rows


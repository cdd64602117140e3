"""Checkpoint round trips (exact), keep-last-K, restore into shardings, and clear errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rubric_jax import loader, sharding
from rubric_jax.models.config import ModelConfig
from rubric_jax.train import checkpointing
from rubric_jax.train import state as train_state

# A one-layer model: enough for sharding, optimizer moments and weight-decay masks.
MODEL = ModelConfig(architecture="llama", vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1,
                    num_heads=2, num_kv_heads=2, head_dim=4, rope_theta=1e4, rms_norm_eps=1e-6,
                    tie_word_embeddings=True, attention_bias=False, rope_scaling=None, max_position_embeddings=16)


def _emb(params):
    return params["embed_tokens"]["embedding"]


def _norm(params):
    return params["norm"]["scale"]


TX = train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=1e-2, warmup_steps=3))


def _state(mesh=None, seed=0, updates=2):
    """A state whose optimizer moments, counts and step are all non-trivial."""
    state, shardings = train_state.init_train_state(MODEL, TX, jax.random.key(seed),
                                                    None if mesh is None else sharding.Layout(mesh))
    for i in range(updates):
        grads = jax.tree.map(lambda x: jnp.full_like(x, 0.1 * (i + 1)) + x, state.params)
        upd, opt_state = state.tx.update(grads, state.opt_state, state.params)
        state = state.replace(params=jax.tree.map(jnp.add, state.params, upd), opt_state=opt_state,
                              step=state.step + 1)
    return state, shardings


def _assert_equal(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
    assert jax.tree.structure(a) == jax.tree.structure(b)


def test_round_trip_is_exact(tmp_path):
    state, _ = _state()
    with checkpointing.Checkpointer(tmp_path / "ckpt", max_to_keep=3) as ckpt:
        assert ckpt.latest_step() is None
        ckpt.save(state, data_state={"epoch": 1, "index": 96}, rubric_hash="sha256:abc", extra={"stage": "grpo"})
        ckpt.wait_until_finished()
        assert ckpt.latest_step() == 2
        other, _ = _state(seed=1, updates=0)  # a target with other values, same structure
        restored = ckpt.restore(other)
    _assert_equal(restored.state, state)
    assert int(restored.state.step) == 2 and restored.state.graphdef == state.graphdef
    assert restored.data_state == {"epoch": 1, "index": 96}
    assert restored.rubric_hash == "sha256:abc" and restored.extra == {"stage": "grpo"}
    meta = json.loads((tmp_path / "ckpt" / "2" / "meta" / "metadata").read_text())
    assert meta["data_state"]["index"] == 96


def test_keeps_last_k_and_restores_any_kept_step(tmp_path):
    state, _ = _state(updates=0)
    ckpt = checkpointing.Checkpointer(tmp_path, max_to_keep=2, async_save=False)
    for step in range(1, 6):
        state = state.replace(step=jnp.int32(step), params=jax.tree.map(lambda x: x + 1, state.params))
        ckpt.save(state, data_state={"index": step * 10}, rubric_hash="h")
    assert ckpt.all_steps() == [4, 5] and ckpt.latest_step() == 5
    # A save killed mid-write leaves a temporary directory that is never taken for a checkpoint.
    (tmp_path / "9.orbax-checkpoint-tmp-1234" / "state").mkdir(parents=True)
    ckpt.close()
    ckpt = checkpointing.Checkpointer(tmp_path, max_to_keep=2, async_save=False)
    assert ckpt.latest_step() == 5
    restored = ckpt.restore(state, step=4)
    assert restored.data_state == {"index": 40} and int(restored.state.step) == 4
    np.testing.assert_array_equal(_norm(restored.state.params), _norm(state.params) - 1)
    with pytest.raises(checkpointing.CheckpointError, match=r"no complete checkpoint for step 2; available: \[4, 5\]"):
        ckpt.restore(state, step=2)
    ckpt.close()
    # A fresh Checkpointer on the same directory sees the same steps (resume after restart).
    assert checkpointing.Checkpointer(tmp_path, max_to_keep=2).latest_step() == 5



@pytest.mark.parametrize("async_save", [False, True])
def test_keep_best_keeps_the_highest_ranked_checkpoint_past_max_to_keep(async_save, tmp_path):
    """Latest 2 plus the best-ranked one (ties: the later); unranked or non-finite saves are never "best";
    a reopened manager (a resumed run) still knows each kept checkpoint's rank."""
    state, _ = _state(updates=0)
    ranks = {1: 0.5, 2: 0.9, 3: None, 4: 0.9, 5: float("nan"), 6: 0.1, 7: None, 8: 0.2}
    ckpt = checkpointing.Checkpointer(tmp_path, max_to_keep=2, keep_best=True, async_save=async_save)
    for step, value in list(ranks.items())[:6]:
        ckpt.save(state.replace(step=jnp.int32(step)), data_state={}, rubric_hash="h", best_value=value)
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [4, 5, 6] and ckpt.best_step() == 4
    ckpt.close()
    ckpt = checkpointing.Checkpointer(tmp_path, max_to_keep=2, keep_best=True, async_save=False)
    for step in (7, 8):
        ckpt.save(state.replace(step=jnp.int32(step)), data_state={}, rubric_hash="h", best_value=ranks[step])
    assert ckpt.all_steps() == [4, 7, 8] and ckpt.best_step() == 4
    assert int(ckpt.restore(state, step=4).state.step) == 4
    ckpt.close()
    without = checkpointing.Checkpointer(tmp_path / "plain", max_to_keep=2, async_save=False)
    for step in (1, 2, 3):
        without.save(state.replace(step=jnp.int32(step)), data_state={}, rubric_hash="h", best_value=9.0 - step)
    assert without.all_steps() == [2, 3] and without.best_step() is None

@pytest.mark.parametrize("mesh_cfg", [sharding.MeshConfig(data=1, fsdp=8, tensor=1),
                                      sharding.MeshConfig(data=2, fsdp=2, tensor=2)])
def test_restore_straight_into_target_shardings(tmp_path, mesh_cfg):
    state, _ = _state()
    ckpt = checkpointing.Checkpointer(tmp_path, max_to_keep=1)
    ckpt.save(state, data_state={}, rubric_hash="h")
    mesh = sharding.make_mesh(mesh_cfg)
    shardings = train_state.state_shardings(loader.expected_shardings(MODEL, sharding.Layout(mesh)), state, mesh)
    target = checkpointing.abstract_with_shardings(jax.eval_shape(lambda: state), shardings)
    restored = ckpt.restore(target).state
    _assert_equal(restored, state)
    for x, want in zip(jax.tree.leaves(restored), jax.tree.leaves(shardings)):
        assert x.sharding.is_equivalent_to(want, x.ndim), (x.sharding, want)
    w = _emb(restored.params)
    assert not w.sharding.is_fully_replicated and len(w.addressable_shards) == 8
    # Params alone (a frozen reference policy), through the loader: no optimizer state is read.
    params = ckpt.restore_params(MODEL, sharding.Layout(mesh)).params
    _assert_equal(params, state.params)
    assert _emb(params).sharding.is_equivalent_to(_emb(shardings.params), 2)
    # And back: a sharded state restores onto a single device.
    ckpt.save(restored.replace(step=restored.step + 1), data_state={}, rubric_hash="h")
    single = ckpt.restore(checkpointing.abstract_with_shardings(state, None)).state
    assert _emb(single.params).sharding.is_fully_replicated and int(single.step) == 3
    ckpt.close()


def test_missing_and_broken_checkpoints_raise_clear_errors(tmp_path):
    from rubric_jax.models import checkpoint as hf_checkpoint

    assert checkpointing.CheckpointError is hf_checkpoint.CheckpointError  # one class for every checkpoint
    state, _ = _state()
    ckpt = checkpointing.Checkpointer(tmp_path / "run", max_to_keep=3, async_save=False)
    with pytest.raises(checkpointing.CheckpointError, match="run: no complete checkpoint to restore"):
        ckpt.restore(state)
    ckpt.save(state, data_state={"index": 1}, rubric_hash="h1")
    with pytest.raises(checkpointing.CheckpointError, match="rubric hash 'h1', expected 'h2'"):
        ckpt.restore(state, expected_rubric_hash="h2")
    assert ckpt.restore(state, expected_rubric_hash="h1").rubric_hash == "h1"
    small = state.replace(params={**state.params, "embed_tokens": {"embedding": jnp.zeros((4, 8))}})
    with pytest.raises(checkpointing.CheckpointError,
                       match=r"params/embed_tokens/embedding is saved as shape/dtype \(\(16, 8\), 'float32'\), "
                             r"target wants \(\(4, 8\), 'float32'\)"):
        ckpt.restore(small)
    sgd_state = train_state.train_state_from_params(state.graphdef, state.params, optax.sgd(0.1))
    with pytest.raises(checkpointing.CheckpointError, match="another structure than the target"):
        ckpt.restore(sgd_state)
    with pytest.raises(checkpointing.CheckpointError, match=r"params/embed_tokens/embedding is saved as shape"):
        ckpt.restore_params(MODEL.replace(vocab_size=4))
    with pytest.raises(checkpointing.CheckpointError, match=r"no complete checkpoint for step 5"):
        ckpt.restore_params(MODEL, step=5)
    with pytest.raises(ValueError, match="JSON-serialisable"):
        ckpt.save(state, data_state={"index": float("nan")}, rubric_hash="h1")
    with pytest.raises(ValueError, match="max_to_keep=0"):
        checkpointing.Checkpointer(tmp_path / "other", max_to_keep=0)
    # Files removed behind orbax's back: restoring says which step directory is broken.
    (tmp_path / "run" / "2" / "state" / "_METADATA").unlink()
    with pytest.raises(checkpointing.CheckpointError, match=r"run/2: cannot restore checkpoint step 2"):
        ckpt.restore(state)
    with pytest.raises(checkpointing.CheckpointError, match=r"run/2/state: cannot restore the params"):
        ckpt.restore_params(MODEL)
    # An empty step directory (e.g. a copy that never finished) is named, not silently skipped.
    (tmp_path / "run" / "7").mkdir()
    ckpt.close()
    ckpt = checkpointing.Checkpointer(tmp_path / "run", max_to_keep=3, async_save=False)
    assert ckpt.latest_step() == 7
    with pytest.raises(checkpointing.CheckpointError, match=r"run/7: cannot restore checkpoint step 7"):
        ckpt.restore(state)
    ckpt.close()


FULL_DISK = ("RESOURCE_EXHAUSTED: Error writing local file: Failed to write 4096 bytes to file 18: No space left on "
             "device [os_error_code='28']")  # tensorstore's words for ENOSPC, from a run on a full tmpfs


def test_a_full_disk_is_one_error_naming_the_step_and_the_checkpoint_to_resume_from(tmp_path, monkeypatch, caplog,
                                                                                    capfd):
    """Issue 38 T5: a background write that fails (a full disk) is raised once, in the main thread, as a
    CheckpointWriteError naming the step, the OS reason and the newest complete checkpoint; orbax's own reports of
    it (a traceback from each of its threads) are not printed."""
    from orbax.checkpoint._src.serialization import serialization

    state, _ = _state()
    with checkpointing.Checkpointer(tmp_path / "ckpt", max_to_keep=3) as ckpt:
        ckpt.save(state, data_state={}, rubric_hash="h")
        ckpt.wait_until_finished()

        async def full(*args, **kwargs):
            raise ValueError(FULL_DISK)

        monkeypatch.setattr(serialization, "async_serialize_from_host", full)
        with pytest.raises(checkpointing.CheckpointWriteError) as e:
            ckpt.save(state.replace(step=state.step + 1), data_state={}, rubric_hash="h")
            ckpt.wait_until_finished()
    assert str(e.value) == (f"{tmp_path / 'ckpt'}: writing the checkpoint of step 3 failed (No space left on device); "
                            "once that is fixed, the same command resumes from step 2, the newest complete checkpoint")
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    assert "Traceback" not in capfd.readouterr().err


def test_tensorstores_closed_loop_reports_are_dropped_and_others_kept():
    """After a failed background write, tensorstore's callbacks find orbax's event loop closed; those reports are
    noise (the failure is raised once); any other unraisable exception still reaches the previous hook."""
    seen = []
    hook = checkpointing._drop_closed_loop_reports(lambda u: seen.append(str(u.exc_value)))

    class Unraisable:
        def __init__(self, error):
            self.exc_value = error

    hook(Unraisable(RuntimeError("Event loop is closed")))
    hook(Unraisable(RuntimeError("something else")))
    assert seen == ["something else"]

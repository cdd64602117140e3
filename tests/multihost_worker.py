"""One process of the multi-host test (tests/test_multihost.py): 8 CPU devices in all, split over
NUM_PROCESSES local processes joined by a local coordinator. Each process reads only its own rows of
the data; the results it writes to OUT/<process id>.npz are compared with a one-process run's (`run`,
called by the test in its own 8-device process).

  python tests/multihost_worker.py OUT PROCESS_ID NUM_PROCESSES PORT
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from xla_flags import FAST_COMPILE

DEVICES = 8


def main(out: Path, process_id: int, num_processes: int, port: int) -> None:
    os.environ["XLA_FLAGS"] = f"{FAST_COMPILE} --xla_force_host_platform_device_count={DEVICES // num_processes}"
    # The three variables the README's two-host launch sets, read by the same start-up as experiments.run.
    os.environ.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(num_processes),
                      JAX_PROCESS_ID=str(process_id))
    from rubric_jax import distributed

    assert distributed.maybe_initialize()
    run(out, stop_and_resume=True)


def run(out: Path, stop_and_resume: bool = False) -> None:
    """Everything each process does (also the one-process reference, in the test's own process); with
    `stop_and_resume`, the trainer loop is stopped after its first GRPO step and run again."""
    import jax
    import numpy as np
    import optax
    from flax import traverse_util

    from rubric_jax import distributed, loader, sampling, sharding
    from rubric_jax.models.checkpoint import export_hf_checkpoint
    from rubric_jax.models.config import ModelConfig
    from rubric_jax.train import checkpointing, state as train_state, step as train_step

    assert jax.device_count() == DEVICES
    process_id, num_processes = jax.process_index(), jax.process_count()
    cfg = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, attention_bias=True, rope_scaling=None, max_position_embeddings=64)
    layout = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=4, tensor=1)))
    weights = loader.init_weights(cfg, layout, jax.random.key(0))
    rng = np.random.default_rng(0)
    results: dict[str, np.ndarray] = {}

    # Generate in the decode layout (tensor groups of 2 within a host): this process's 4 of 8 prompts.
    prompts = [rng.integers(1, cfg.vocab_size, size=int(rng.integers(3, 9))).tolist() for _ in range(8)]
    share = len(prompts) // num_processes
    mine = prompts[process_id * share:(process_id + 1) * share]
    decode = sharding.decode_layout(layout.mesh, 2)
    result = sampling.generate(loader.to_layout(weights, decode), mine, key=jax.random.key(1), n=2, max_new_tokens=6,
                               sampler="temperature(1.0)", stop_tokens=(0,), pad_id=0, layout=decode)
    results.update(gen_tokens=result.tokens, gen_logprobs=result.logprobs, gen_lengths=result.lengths)

    # One SFT step, FSDP over 4 devices per host and data-parallel across hosts: this process's 8 of 16 rows.
    tokens = rng.integers(1, cfg.vocab_size, size=(16, 12)).astype(np.int32)
    input_mask = np.ones_like(tokens, bool)
    loss_mask = np.zeros_like(tokens, bool)
    loss_mask[:, 6:] = True
    rows = slice(process_id * 16 // num_processes, (process_id + 1) * 16 // num_processes)
    batch = distributed.global_batch({"tokens": tokens[rows], "input_mask": input_mask[rows],
                                      "loss_mask": loss_mask[rows]}, sharding.batch_sharding(layout.mesh))
    tx = optax.sgd(0.5)  # plain SGD: a parameter moves by 0.5 x its gradient (Adam's g/|g| would amplify float noise)
    state, shardings = train_state.new_train_state(weights, tx, layout.mesh)
    step = train_step.jit_sft_step(shardings=shardings, mesh=layout.mesh)
    state, metrics = step(state, batch)
    results.update({f"metric/{k}": v for k, v in distributed.host_tree(metrics).items()})
    flat = traverse_util.flatten_dict(state.params, sep="/")
    results.update({f"param/{k}": distributed.host_array(v) for k, v in flat.items()})

    # Orbax saves from every host (one shared directory) and restores into the same shardings.
    with checkpointing.Checkpointer(out / "ckpt", max_to_keep=1, async_save=False) as ckpt:
        ckpt.save(state, data_state={}, rubric_hash="h")
        restored = ckpt.restore(checkpointing.abstract_with_shardings(state, shardings)).state
    restored_flat = traverse_util.flatten_dict(restored.params, sep="/")
    results["restored_equal"] = np.asarray(all(
        np.array_equal(distributed.host_array(restored_flat[k]), results[f"param/{k}"]) for k in flat))
    export_hf_checkpoint(cfg, state.params, out / "export")  # gathered across hosts, written by process 0

    # The trainer loop in one shared workdir (see loop_config): each process its own block of every batch,
    # process 0 writing the logs and the export. With `stop_and_resume`, the last process gets a SIGTERM
    # during GRPO step 1 (the loop stops every process there, after a checkpoint) and the run is started
    # again on the same workdir, as a restarted job would be.
    from rubric_jax.train import grpo_stage, loop

    config = loop_config(out)
    if stop_and_resume:
        stopped = _stop_during_first_grpo_step(grpo_stage, last_process=process_id == num_processes - 1)
        loop.run(config, out / "loop")
        results["stopped_before_export"] = np.asarray(stopped() and not (out / "loop" / "export").exists())
    loop.run(config, out / "loop")
    np.savez(out / f"{process_id}.npz", **results)


def _stop_during_first_grpo_step(grpo_stage, last_process: bool):
    """Wraps `grpo_stage.grpo_iteration` so that the first GRPO step raises SIGTERM in the last process only (the
    loop must stop every process at that step, save and return) and later calls run unchanged; returns a
    function telling whether the stop was requested."""
    import signal

    original, calls = grpo_stage.grpo_iteration, []

    def grpo_iteration(*args, **kwargs):
        calls.append(None)
        if len(calls) == 1 and last_process:
            signal.raise_signal(signal.SIGTERM)  # the loop's handler: finish this step, save, return
        return original(*args, **kwargs)

    grpo_stage.grpo_iteration = grpo_iteration

    def stopped() -> bool:
        grpo_stage.grpo_iteration = original
        return len(calls) == 1

    return stopped


def loop_config(out: Path):
    """The tiny default cut to seconds, with every multi-host path of the trainer on: its model, a rubric of a
    length rule (a word count, which varies between 8-token samples, so advantages are not all zero) and an
    LLM-judged politeness criterion (the shipped distilled tiny judge, greedy), a golden set of 4 questions
    with labelled reference answers scored at every eval, a KL reference (rl.beta > 0), 8 SFT rows in one
    step, 4 questions x 2 samples a GRPO step for 2 steps with a checkpoint after each, 4 eval questions,
    export at the end. Every per-step count is 2 per process; the decode layout's tensor groups of 2 make
    each process's rows a whole block of the sampler's batch, so the rows sit where one process would put
    them."""
    import json

    from rubric_jax import distributed
    from tiny_config import absolute_tiny_config

    topics = ("a refund", "a late parcel", "a password reset", "a broken screen", "an invoice", "a discount",
              "a new address", "a cancelled order")
    golden = (("Can a gift card pay for shipping?", "Thank you for asking. Yes, a gift card covers shipping.", 2),
              ("Is there a phone line for complaints?", "Call the number on the contact page.", 1),
              ("Where can I download a warranty form?", "The form is on the support page.", 1),
              ("Why was my loyalty point balance reset?", "Points expire after a year without purchases.", 1))
    files = {
        "train.jsonl": [{"id": f"q{i}", "question": f"How do I ask about {t}?", "category": "customer_service",
                         "lang": "en"} for i, t in enumerate(topics)],
        "eval.jsonl": [{"id": f"e{i}", "question": f"Who handles {t}?", "category": "customer_service", "lang": "en"}
                       for i, t in enumerate(topics[:4])],
        "sft.jsonl": [{"id": f"s{i}", "prompt": f"Help with {t}.",
                       "response": f"<think>Steps.</think><answer>Sorry about {t}. Contact us.</answer>"}
                      for i, t in enumerate(topics)],
        "golden.jsonl": [{"id": f"g{i}", "question": q, "category": "customer_service", "lang": "en", "reference": a,
                          "labels": {"politeness": label}} for i, (q, a, label) in enumerate(golden)],
    }
    length = {"id": "length", "description": "20-40 words.", "kind": "rule", "scale": {"kind": "binary"},
              "anchors": {"0": "Far too short.", "1": "20-40 words."}, "rule": "length",
              "params": {"min": 20, "max": 40, "unit": "auto"}}  # 8-token answers score by their word count
    # The tiny judge's criterion on a 1-2 scale: distilled on 0/1, it answers "SCORE: 1" to a polite answer (a
    # valid level) and "SCORE: 0" to most others (out of range: re-asked with a new nonce and anchor order, up
    # to twice, then missing), so every step has retry rounds, and their prompt counts differ between the
    # processes (the golden references: 1 polite answer of 2 on process 0, none of 2 on process 1).
    politeness = {"id": "politeness", "description": "The response thanks or apologises to the customer "
                  "(thank you / sorry).", "kind": "llm", "scale": {"kind": "integer", "lo": 1, "hi": 2},
                  "anchors": {"1": "No thanks or apology.", "2": "Thanks or apologises."}}
    rubric = {"name": "multihost", "version": "1.0.0", "dimensions": [length, politeness],
              "changelog": [{"version": "1.0.0", "change": "a length score and a judged one", "reason": "a test"}]}
    if distributed.is_writer():
        for name, rows in files.items():
            (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / "rubric.yaml").write_text(json.dumps(rubric))  # JSON is YAML
    distributed.wait_for_everyone("loop data written")
    config = absolute_tiny_config()
    with config.unlocked():
        config.data.train, config.data.eval, config.data.sft, config.data.golden = (str(out / n) for n in files)
        config.data.rubric = str(out / "rubric.yaml")
        config.data.max_prompt_len = 64
        config.mesh.rollout.tensor = 2
        config.sft.update(batch_size=8, epochs=1, warmup_steps=0, max_response_len=32)
        config.rl.update(steps=2, questions_per_step=4, group_size=2, micro_batches=1, max_new_tokens=8,
                         warmup_steps=0, beta=0.02)
        config.eval.update(max_questions=4, max_new_tokens=8, every_steps=2)
        config.checkpoint.every_steps = 1
        config.export.at_end = True
    return config


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))

"""Seconds per GRPO step: rubric_jax (train.grpo_stage.grpo_iteration) vs TRL 1.16 GRPOTrainer (PyTorch CPU), one run.

Install (a venv of its own: trl pulls accelerate/datasets, keep them out of the test venv .venv):
  python3 -m venv /tmp/venv-bench
  /tmp/venv-bench/bin/pip install torch==2.13.0          # first: the CPU wheel on disk, never another version
  /tmp/venv-bench/bin/pip install -r requirements.txt
  /tmp/venv-bench/bin/pip install trl==1.16.0            # `pip index versions trl`: 1.16.0 is the 1.16 release
Run (from the repository root):
  /tmp/venv-bench/bin/python -m benchmarks.bench_grpo_vs_trl
  /tmp/venv-bench/bin/python -m benchmarks.bench_grpo_vs_trl --torch_threads=1     # fair on a loaded machine
  taskset -c 0 /tmp/venv-bench/bin/python -m benchmarks.bench_grpo_vs_trl --torch_threads=1  # both sides on one core

One random Qwen2ForCausalLM (hidden 96, 3 layers, 4 heads, 2 kv heads, MLP 256, vocab 512) is saved with a
byte-level BPE tokenizer of 512 tokens (trained here on the tiny assets' text, Qwen2 chat template) to a temp
HF directory; both sides load it. Same settings on both: 8 prompts x 8 samples, <= 64 new tokens at
temperature 1 (no top-k/top-p), stop at <|im_end|>, the same chat prompts (system + question), float32,
beta 0.04 with the k3 KL, clip 0.2 / 0.28, per-sequence token-mean loss averaged over sequences, group-std
advantages, AdamW at a constant learning rate, global-norm clip 1, one update per rollout batch, no gradient
checkpointing. The reward is literally the same: TRL's reward function decodes the completion ids like our
loop and calls the same rubric_jax RubricReward (a rule-only rubric: a length range and a keyword rule).

Ours: an Experiment from `train.loop.build(config)` (configs/tiny.py with overrides) and, per step,
`grpo_iteration` (sampling.sample -> decode -> RubricReward -> group advantages -> reference log-probs once
per rollout -> jitted update). TRL: `trainer.train()` with max_steps = warm-up + timed steps; a callback records
the wall time between consecutive step ends. With --schedule=interleaved (default) one of our steps runs
inside each TRL step-end callback (outside TRL's timed window, after a --settle_s pause: torch's idle OpenMP
workers spin for a while after a step), so both sides see the same machine load (this machine is shared);
--schedule=sequential runs all our steps first. The first --warmup steps of each
side are not timed (ours: they include compilation, reported separately); the median of --steps is reported.
A breakdown times the parts (sampling, reward, ref_logp, update, rest) by wrapping the functions each side calls;
process CPU seconds per step (all threads) are printed too: on a loaded machine they move less than wall time.
torch's default thread count (one per core) spin-waits badly when the cores are oversubscribed: on a shared
machine also run --torch_threads=1 and report both (RESULTS.md, "GRPO step vs TRL").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from absl import app, flags

from configs import tiny
from rubric_jax import data, sampling
from rubric_jax.assets import TINY_DIR
from rubric_jax.assets import build_tiny_assets
from rubric_jax.rubrics.io import save_rubric
from rubric_jax.rubrics.schema import Aggregation, Anchor, ChangelogEntry, Dimension, Rubric, Scale
from rubric_jax.train import grpo_stage, loop

MODEL = dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=256, max_position_embeddings=512, rms_norm_eps=1e-6)
VOCAB_SIZE = 512
NUM_QUESTIONS = 16
QUESTIONS_PER_STEP, GROUP_SIZE, MAX_NEW_TOKENS, BETA = 8, 8, 64, 0.04

_STEPS = flags.DEFINE_integer("steps", 8, "Timed steps per side (after warm-up); the median is reported.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps per side first (>= 1; ours include compilation).",
                               lower_bound=1)
_LR = flags.DEFINE_float("lr", 1e-5, "Learning rate of both sides.")
_SCHEDULE = flags.DEFINE_enum("schedule", "interleaved", ["interleaved", "sequential"],
                              "interleaved: one of our steps after each TRL step (same load); sequential: ours first.")
_THREADS = flags.DEFINE_integer("torch_threads", 0, "torch.set_num_threads (0: torch's default).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random model, the data order and the sampling.")
_SETTLE = flags.DEFINE_float(
    "settle_s", 0.5, "Interleaved: pause (timed by neither side) before each of our steps; torch's idle OpenMP "
    "workers spin-wait after a TRL step and would otherwise take a core from ours (measured: +30% on our step).")
_MICRO = flags.DEFINE_integer(
    "micro_batches", 8, "Our rl.micro_batches (whole groups: at most the 8 prompts): gradient accumulation gives "
    "the same update (step.py), and on CPU small micro-batches keep activations cache-sized (RESULTS.md).")


# ------------------------------------------------------------------------------------------ fixtures
def _binary_rule(dim_id: str, description: str, rule: str, params: dict[str, Any]) -> Dimension:
    return Dimension(id=dim_id, description=description, kind="rule", scale=Scale.binary(),
                     anchors={0: Anchor("Fails the rule."), 1: Anchor("Meets the rule.")}, rule=rule, params=params)


def bench_rubric() -> Rubric:
    """Rule-only: a length range (graded outside it, so random text gets varied rewards) and a keyword rule."""
    return Rubric(
        name="bench_grpo", version="1.0.0",
        changelog=(ChangelogEntry("1.0.0", "length range + keyword", "benchmark reward shared with TRL"),),
        dimensions=(
            _binary_rule("length", "The response is 20-40 units long.", "length",
                         {"min": 20, "max": 40, "unit": "auto"}),
            _binary_rule("keyword", "The response names refund, order or thanks.", "keywords",
                         {"words": ["refund", "order", "thank you", "sorry"], "mode": "any"}),
        ),
        aggregation=Aggregation(method="weighted_sum", missing="renormalize"),
    )


def _tiny_texts() -> list[str]:
    """Questions and SFT answers of the shipped tiny assets: the tokenizer's training text."""
    texts = [data.SYSTEM_PROMPT, "system", "user", "assistant", "You are a helpful assistant."]
    for name, field in (("questions_train.jsonl", "question"), ("questions_eval.jsonl", "question"),
                        ("sft.jsonl", "response")):
        texts += [row[field] for _, row in data.read_jsonl(Path(TINY_DIR) / name)]
    return texts


def write_fixture(root: Path, seed: int) -> dict[str, Any]:
    """The shared HF checkpoint + tokenizer, the question jsonl and the rubric YAML under `root`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tiny_assets.train_tokenizer(_tiny_texts(), vocab_size=VOCAB_SIZE,
                                                  model_max_length=MODEL["max_position_embeddings"])
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, architectures=["Qwen2ForCausalLM"],
                         rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         dtype="float32", **MODEL)
    model_dir = root / "model"
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rows = [{k: row[k] for k in ("id", "question", "category", "lang")}
            for _, row in data.read_jsonl(Path(TINY_DIR) / "questions_train.jsonl") if row["lang"] == "en"]
    questions = root / "questions.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows[:NUM_QUESTIONS]), encoding="utf-8")
    rubric = root / "rubric.yaml"
    save_rubric(bench_rubric(), rubric)
    prompts = data.encode_prompts(tokenizer, [r["question"] for r in rows[:NUM_QUESTIONS]])
    return {"model_dir": str(model_dir), "questions": str(questions), "rubric": str(rubric),
            "longest_prompt": max(len(p) for p in prompts), "params": sum(p.numel() for p in model.parameters())}


# ------------------------------------------------------------------------------------------- timing
class Timer:
    """Accumulates wall seconds per part name for the current step; `take()` returns and resets them."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.parts[name] += time.perf_counter() - start

    def wrap(self, name: str, fn: Callable[..., Any], block: bool = False) -> Callable[..., Any]:
        """fn timed under `name` (block: wait for its jax outputs so the time is the computation's)."""
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.part(name):
                out = fn(*args, **kwargs)
                return jax.block_until_ready(out) if block else out
        return timed

    def take(self) -> dict[str, float]:
        parts, self.parts = dict(self.parts), defaultdict(float)
        return parts


def _median_parts(steps: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({k for s in steps for k in s})
    return {k: statistics.median(s.get(k, 0.0) for s in steps) for k in names}


# --------------------------------------------------------------------------------------------- ours
def our_config(fixture: dict[str, Any], lr: float, seed: int, micro_batches: int):
    """configs/tiny.py with the benchmark's model, data, rubric and GRPO settings (GRPO stage only, 1 device)."""
    c = tiny.get_config()
    c.seed = seed
    c.stages = ("grpo",)
    c.model.checkpoint = c.model.tokenizer = fixture["model_dir"]
    c.model.config_json = ""
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1
    c.data.train = c.data.eval = fixture["questions"]
    c.data.rubric = fixture["rubric"]
    c.data.golden = ""  # no evals here (the tiny golden set's extra criteria would clash with the bench rubric)
    c.data.max_prompt_len = 1 << (fixture["longest_prompt"] - 1).bit_length()  # one tight power-of-two bucket
    c.data.length_buckets = 1
    c.rl.questions_per_step, c.rl.group_size, c.rl.max_new_tokens, c.rl.beta = (
        QUESTIONS_PER_STEP, GROUP_SIZE, MAX_NEW_TOKENS, BETA)
    c.rl.sampler = "temperature(1.0)"
    c.rl.lr, c.rl.warmup_steps, c.rl.schedule = lr, 0, "constant"
    c.rl.updates_per_batch, c.rl.micro_batches = 1, micro_batches
    return c


class OurSide:
    """The pieces the GRPO stage (train/grpo_stage.py) runs (without evals/checkpoints), stepped one GRPO iteration
    at a time."""

    def __init__(self, fixture: dict[str, Any], workdir: Path, lr: float, seed: int, micro_batches: int,
                 timer: Timer):
        cfg = our_config(fixture, lr, seed, micro_batches)
        run_ = loop.build(cfg, workdir)
        self.config = cfg  # the Experiment keeps validated settings, not the config
        self.timer = timer
        rl = cfg.rl
        # What the GRPO stage starts from, without its evals and checkpoints.
        programs = run_.programs.grpo
        self.state = run_.programs.grpo_state.init(run_.initial_params())
        self.ref_params = jax.tree.map(lambda x: x.copy(), self.state.params)  # the update donates the state
        self.programs = dataclasses.replace(programs, update=timer.wrap("update", programs.update, block=True),
                                            logprobs=timer.wrap("ref_logp", programs.logprobs, block=True))
        self.batches = data.BatchIterator(run_.train_questions, rl.questions_per_step,
                                          data.IteratorState(seed=cfg.seed))
        self.run = dataclasses.replace(run_, reward=_TimedReward(run_.reward, timer))
        self.step_count = 0
        self.rows: list[dict[str, float]] = []

    @contextlib.contextmanager
    def _instrumented(self) -> Iterator[None]:
        """Times sampling.sample (waited for: its samples stay on the device) and the response decoding that
        grpo_iteration calls (module attributes)."""
        sample, decode = sampling.sample, data.decode_responses
        sampling.sample = self.timer.wrap("sampling", sample, block=True)
        data.decode_responses = self.timer.wrap("decode", decode)
        try:
            yield
        finally:
            sampling.sample, data.decode_responses = sample, decode

    def step(self) -> dict[str, float]:
        """One GRPO iteration; returns its wall time and parts."""
        self.step_count += 1
        key = jax.random.fold_in(self.run.key, 1000 + self.step_count)
        with self._instrumented():
            start, cpu = time.perf_counter(), time.process_time()
            self.state, out = grpo_stage.grpo_iteration(self.run, self.programs, self.state, self.ref_params,
                                                        next(self.batches), key)
            row = grpo_stage.grpo_row(out)
            total, cpu = time.perf_counter() - start, time.process_time() - cpu
        self.rows.append(row)
        parts = self.timer.take()
        parts["rest"] = total - sum(parts.values())
        return {"total": total, "cpu": cpu, **parts}


class _TimedReward:
    """The run's RubricReward, timed under "reward" (grpo_iteration calls `run_.reward(...)`)."""

    def __init__(self, reward: Any, timer: Timer):
        self.reward, self.timer = reward, timer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.timer.part("reward"):
            return self.reward(*args, **kwargs)


# ---------------------------------------------------------------------------------------------- TRL
def trl_reward_fn(tokenizer: Any, reward: Any, rubric_of: dict[str, Rubric]) -> Callable[..., list[float]]:
    """TRL reward function: decode like our loop (special tokens kept, stop token dropped), then RubricReward."""
    stop = (int(tokenizer.eos_token_id),)

    def rubric_reward(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]],
                      question: list[str], question_id: list[str], **_: Any) -> list[float]:
        lengths = [len(ids) for ids in completion_ids]
        tokens = np.zeros((len(completion_ids), max(lengths, default=0) + 1), np.int64)  # rectangular, as ours
        for row, ids in zip(tokens, completion_ids):
            row[:len(ids)] = ids
        as_result = types.SimpleNamespace(tokens=tokens, lengths=lengths)
        responses = data.decode_responses(tokenizer, as_result, stop)
        return reward(question, responses, [rubric_of[i] for i in question_id]).reward.tolist()

    return rubric_reward


def make_trl_trainer(fixture: dict[str, Any], our: OurSide, outdir: Path, max_steps: int, lr: float, seed: int,
                     timer: Timer, callbacks: list[Any]) -> Any:
    """GRPOTrainer on the same checkpoint, prompts and reward, with settings matched to ours."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rl = our.config.rl
    tokenizer = AutoTokenizer.from_pretrained(fixture["model_dir"], padding_side="left")
    questions = our.run.train_questions
    dataset = Dataset.from_list([{"prompt": data.chat_messages(q.question), "question": q.question,
                                  "question_id": q.id} for q in questions])
    args = GRPOConfig(
        output_dir=str(outdir), seed=seed, use_cpu=True, bf16=False, fp16=False, report_to="none",
        logging_strategy="no", save_strategy="no", disable_tqdm=True, gradient_checkpointing=False,
        max_steps=max_steps, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=rl.grad_clip, per_device_train_batch_size=QUESTIONS_PER_STEP * GROUP_SIZE,
        gradient_accumulation_steps=1, num_generations=GROUP_SIZE, max_completion_length=MAX_NEW_TOKENS,
        temperature=1.0, top_p=1.0, top_k=0, beta=BETA, epsilon=rl.clip_low, epsilon_high=rl.clip_high,
        loss_type="grpo", scale_rewards="group", num_iterations=1, dataloader_num_workers=0,
        model_init_kwargs={"dtype": "float32", "attn_implementation": "sdpa"})
    trainer = GRPOTrainer(model=fixture["model_dir"], reward_funcs=trl_reward_fn(tokenizer, our.run.reward.reward,
                                                                                   our.run.rubric_of),
                          args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)
    # Parts: generation (incl. prompt tokenising and decoding), reward, reference log-probs (no grad);
    # "update" = the rest of TRL's step (policy forward/backward + AdamW), computed from the total.
    trainer._generate = timer.wrap("sampling", trainer._generate)
    trainer._calculate_rewards = timer.wrap("reward", trainer._calculate_rewards)
    logps = trainer._get_per_token_logps_and_entropies

    def timed_logps(model: Any, *args: Any, **kwargs: Any) -> Any:
        import torch
        name = "ref_logp" if not torch.is_grad_enabled() else "policy_fwd"
        with timer.part(name):
            return logps(model, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = timed_logps
    prepare = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = timer.wrap("rollout_total", prepare)
    return trainer


def _trl_parts(total: float, cpu: float, parts: dict[str, float]) -> dict[str, float]:
    """Sampling / reward / ref_logp as timed; update = policy fwd/bwd/AdamW; rest = the rollout's remainder."""
    rollout_total = parts.pop("rollout_total", 0.0)
    policy_fwd = parts.pop("policy_fwd", 0.0)
    inside = sum(parts.get(k, 0.0) for k in ("sampling", "reward", "ref_logp"))
    return {"total": total, "cpu": cpu, **parts, "update": total - rollout_total, "update_policy_fwd": policy_fwd,
            "rest": rollout_total - inside}


# --------------------------------------------------------------------------------------------- main
def _fmt(parts: dict[str, float]) -> str:
    order = ["sampling", "decode", "reward", "ref_logp", "update", "update_policy_fwd", "rest"]
    return ", ".join(f"{k} {parts[k]:.3f}" for k in order if k in parts)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str]) -> None:
    del argv
    import torch
    from transformers import TrainerCallback
    from trl import __version__ as trl_version

    if _THREADS.value:
        torch.set_num_threads(_THREADS.value)
    warmup, steps, seed, lr = _WARMUP.value, _STEPS.value, _SEED.value, _LR.value
    load_before = _load()
    if os.getloadavg()[0] > (os.cpu_count() or 1) and not _THREADS.value:
        print(f"note: load average {load_before} > {os.cpu_count()} cores; torch's thread pool thrashes when "
              "oversubscribed, so compare with --torch_threads=1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fixture = write_fixture(root, seed)
        timer = Timer()
        ours = OurSide(fixture, root / "ours", lr, seed, _MICRO.value, timer)
        our_steps: list[dict[str, float]] = []
        trl_steps: list[dict[str, float]] = []

        start = time.perf_counter()
        first = ours.step()
        our_first_total = time.perf_counter() - start
        for _ in range(warmup - 1):
            ours.step()
        if _SCHEDULE.value == "sequential":
            our_steps = [ours.step() for _ in range(steps)]

        class StepClock(TrainerCallback):
            """TRL step wall time = between consecutive step ends (our interleaved step excluded)."""

            def __init__(self) -> None:
                self.ready, self.cpu = 0.0, 0.0

            def on_train_begin(self, args, state, control, **kwargs):
                timer.take()
                self.ready, self.cpu = time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kwargs):
                parts = _trl_parts(time.perf_counter() - self.ready, time.process_time() - self.cpu, timer.take())
                if state.global_step > warmup:
                    trl_steps.append(parts)
                    if _SCHEDULE.value == "interleaved":
                        time.sleep(_SETTLE.value)
                        our_steps.append(ours.step())
                timer.take()
                self.ready, self.cpu = time.perf_counter(), time.process_time()

        tokenizer = ours.run.tokenizer
        questions = [q.question for q in ours.run.train_questions]
        trl_prompt_ids = [tokenizer.apply_chat_template(data.chat_messages(q), add_generation_prompt=True,
                                                        tokenize=True, return_dict=False) for q in questions]
        same_prompts = trl_prompt_ids == data.encode_prompts(tokenizer, questions)
        trl_start = time.perf_counter()
        trainer = make_trl_trainer(fixture, ours, root / "trl", warmup + steps, lr, seed, timer, [StepClock()])
        trl_setup = time.perf_counter() - trl_start
        trainer.train()

        load_after = _load()
        ours_s = statistics.median(s["total"] for s in our_steps)
        trl_s = statistics.median(s["total"] for s in trl_steps)
        our_median = _median_parts(our_steps)
        compiled = ("sampling", "ref_logp", "update")
        compile_s = sum(first[k] - our_median[k] for k in compiled)
        rewards = [r["reward/mean"] for r in ours.rows]
        print(f"model: random Qwen2 {MODEL} vocab {VOCAB_SIZE} ({fixture['params'] / 1e6:.2f}M params), float32; "
              f"{QUESTIONS_PER_STEP} prompts x {GROUP_SIZE} samples, <= {MAX_NEW_TOKENS} new tokens, beta {BETA}; "
              f"longest prompt {fixture['longest_prompt']} tokens (ours padded to "
              f"{ours.config.data.max_prompt_len}); prompt ids identical on both sides: {same_prompts}")
        print(f"jax {jax.__version__} ({jax.devices()[0].platform}, {len(jax.devices())} device), torch "
              f"{torch.__version__} ({torch.get_num_threads()} threads), trl {trl_version}; our micro-batches "
              f"{_MICRO.value}; schedule {_SCHEDULE.value}, warm-up {warmup}, timed steps {steps}; load avg before "
              f"{load_before}, after {load_after}")
        print(f"ours: mean response length {np.mean([r['response_len/mean'] for r in ours.rows]):.1f}, "
              f"reward/mean per step {[round(x, 3) for x in rewards]}")
        print(f"ours first step (incl. compile): {our_first_total:.2f} s; compile ~ {compile_s:.2f} s "
              f"(first-call minus median of sampling + ref_logp + update); TRL trainer set-up {trl_setup:.2f} s")
        for name, timed in (("ours", our_steps), ("TRL ", trl_steps)):
            print(f"{name} per step (s): {[round(s['total'], 3) for s in timed]}; process CPU s/step (all "
                  f"threads): median {statistics.median(s['cpu'] for s in timed):.3f}")
        print(f"ours median breakdown (s): {_fmt(our_median)}")
        print(f"TRL  median breakdown (s): {_fmt(_median_parts(trl_steps))}")
        print(f"rubric_jax: {ours_s:.3f} s/step   TRL GRPOTrainer: {trl_s:.3f} s/step   "
              f"ratio TRL/ours: {trl_s / ours_s:.2f}x")
        ours.run.log.close()


if __name__ == "__main__":
    app.run(main)

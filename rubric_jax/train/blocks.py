"""The experiment's config blocks (experiments.run, sweep, build_rubrics) as typed frozen dataclasses that are their
own schema (rubric_jax/schema.py): every key's type, default, bounds or choices and one-line meaning (with its
source) is here and only here, with the rules between a block's keys in its `validate`. configs/common.py makes the
ConfigDicts that config files change from these (`config_boundary.config_dict`), and `config_boundary.experiment`
turns a resolved ConfigDict back into an `ExperimentConfig`, naming the key of any bad value.

The judge blocks (config.judge, config.audit.judge) are judges/spec.py's JudgeSpec, config.qurl is qurl/config.py's
BuildConfig: blocks of their own, nested here. Integer counts are bounded (rubric_jax/counts.py): the smallest keeps a
zero or negative count from silently skipping a stage; the largest, a typo from hours of work or an exhausted
memory. Derived values (rollout specs, the GRPO objective, optimizer settings) are train/settings.py's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rubric_jax import counts
from rubric_jax.grpo import ADVANTAGE_SCALINGS, AGGREGATIONS, IMPORTANCE_LEVELS, KL_ESTIMATORS, LOSSES
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.loader import ATTENTION_CHOICES
from rubric_jax.models import lora
from rubric_jax.models.config import REMAT_POLICIES
from rubric_jax.qurl.config import BuildConfig
from rubric_jax.schema import Block, BlockError, setting
from rubric_jax.train.rollout import ADVANTAGES, MISSING_SCORES
from rubric_jax.train.scaffold import HINT_DECAYS
from rubric_jax.train.state import SCHEDULES

STAGES = ("sft", "grpo")
REWARD_SOURCES = ("rubric", "reward_model")
EXPORT_WHICH = ("latest", "best")  # also experiments.export/evaluate config.which
ROLLOUT_DTYPES = ("compute", "float32", "bfloat16")
COMPUTE_DTYPES = ("float32", "bfloat16")
UNIT = (0.0, 1.0)  # a share or a normalised score
CORRELATION = (-1.0, 1.0)


@dataclasses.dataclass(frozen=True)
class ModelBlock(Block):
    """The policy model: where its weights come from and how it computes (experiments.run, build_rubrics)."""

    checkpoint: str = setting("", "Local HF directory to load; empty = random init from `config_json`.")
    config_json: str = setting("", "HF config.json for a random init (the tiny default ships one).")
    tokenizer: str = setting("", "Tokenizer directory (AutoTokenizer); empty = the checkpoint directory.")
    param_dtype: str = setting("float32", "Parameters and optimizer state dtype.")
    compute_dtype: str = setting("float32", 'Activation dtype ("bfloat16" on accelerators).',
                                 choices=COMPUTE_DTYPES)
    remat: bool = setting(False, "Recompute layer activations in the backward pass (saves memory).")
    remat_policy: str = setting("full", "With remat, what a layer keeps: full (nothing) or dots (its matmul outputs).",
                                choices=REMAT_POLICIES)
    scan_layers: bool = setting(True, "lax.scan over the stacked layers (flat compile time).")
    attention: str = setting(
        "auto", "Attention of the teacher-forced forwards (GRPO/SFT updates, log-probs; decoding always uses "
        "einsum): auto (cudnn on NVIDIA GPUs in bf16, einsum elsewhere), einsum (ours), xla or cudnn "
        "(jax.nn.dot_product_attention).", choices=ATTENTION_CHOICES)

    def validate(self) -> None:
        if self.param_dtype != "float32":
            self.fail("param_dtype", "training keeps float32 master weights; set model.compute_dtype='bfloat16' "
                                     "for bf16 compute")
        if self.attention == "cudnn" and self.compute_dtype == "float32":
            self.fail("attention", "cuDNN flash attention runs in bfloat16: set model.compute_dtype='bfloat16'")


@dataclasses.dataclass(frozen=True)
class LoraBlock(Block):
    """LoRA (issue 34; models/lora.py): the named stages train the policy through low-rank adapters on a frozen base
    (the previous stage's result), the KL reference is that base with the adapters off, and checkpoints hold the
    adapters. The default variant of a LoRA run is a full cold-start SFT, then LoRA GRPO."""

    rank: int = setting(0, "The adapters' rank r (PEFT r); 0 = off: every weight is trained.", bounds=(0, 1 << 16))
    alpha: float = setting(16.0, "The update is scaled by alpha / rank (PEFT lora_alpha).", bounds=(1e-6, 1e6))
    dropout: float = setting(0.0, "Dropout on the adapters' input (PEFT lora_dropout); only 0 is implemented.",
                             bounds=(0.0, 0.0))
    targets: tuple[str, ...] = setting(lora.LAYER_TARGETS, "Adapted projections by HF module name (PEFT "
                                                           "target_modules); lm_head needs an untied LM head.",
                                       choices=lora.TARGETS)
    stages: tuple[str, ...] = setting(("grpo",), "Stages that train through the adapters (each starts fresh ones on "
                                                 "the previous stage's merged result).", choices=STAGES)

    def validate(self) -> None:
        if not self.targets or len(set(self.targets)) != len(self.targets):
            self.fail("targets", f"expected a non-empty subset of {lora.TARGETS} without repeats")
        if not self.stages or len(set(self.stages)) != len(self.stages):
            self.fail("stages", f"expected a non-empty subset of {STAGES} without repeats")


@dataclasses.dataclass(frozen=True)
class RewardBlock(Block):
    """What scores rollouts: rubrics (rule and LLM judges) or a scalar reward model (rubric_jax/judges/reward_model.py;
    QuRL's "w/ RLHF reward model" ablation, which uses internlm2-7b-reward)."""

    source: str = setting("rubric", '"rubric" (the rows\' rubrics) or "reward_model" (reward.model_checkpoint).',
                          choices=REWARD_SOURCES)
    gates_first: bool = setting(
        True, "A row whose rule gate failed (reward 0 whatever else it scores) sends no LLM dimension to the judge "
        '(docs/judges.md, "Gates first"; judges/reward.py): rewards unchanged, 10% of the tiny default\'s judge '
        "prompts spared (benchmarks/RESULTS.md).")
    model_checkpoint: str = setting("", "Local HF Qwen2/Llama *ForSequenceClassification directory with one label.")
    model_dtype: str = setting("float32", "Reward-model weights and activations: float32 or bfloat16.",
                               choices=COMPUTE_DTYPES)
    model_max_len: int = setting(4096, "Longest chat (question + response, RM tokens) scored; a longer one scores "
                                       "the minimum (counted).", bounds=(1, counts.TOKENS))
    model_batch_size: int = setting(64, "Rows per reward-model forward call (bounds attention memory).",
                                    bounds=(1, 1 << 16))
    model_center: float = setting(0.0, "reward = sigmoid((logit - center) / scale): the scalar mapped to (0, 1).")
    model_scale: float = setting(1.0, "Logit units per unit of the sigmoid's argument (> 0).")

    def validate(self) -> None:
        if self.source == "rubric" and self.model_checkpoint:
            self.fail("model_checkpoint", "config.reward.source='rubric' never reads it; add "
                                          "--config.reward.source=reward_model or drop the checkpoint")
        if self.source == "reward_model" and not self.model_checkpoint:
            self.fail("model_checkpoint", "config.reward.source='reward_model' needs "
                                          "config.reward.model_checkpoint=DIR (a local HF "
                                          "*ForSequenceClassification directory with one label)")


@dataclasses.dataclass(frozen=True)
class RolloutMeshBlock(Block):
    """Decode layout of rollouts over the same devices (verl's 3D-HybridEngine idea; judges have their own,
    judge.tensor): the policy is resharded to it once per rollout, so no decode step all-gathers an FSDP weight."""

    tensor: int = setting(1, "Tensor-parallel group (consecutive devices of one host); the rest replicate. Must divide "
                             "the heads and KV heads.", bounds=(1, counts.DEVICES))
    param_dtype: str = setting("compute", "Policy weights while decoding: compute (= model.compute_dtype), float32 or "
                                          "bfloat16.", choices=ROLLOUT_DTYPES)


@dataclasses.dataclass(frozen=True)
class MeshBlock(Block):
    """The training mesh's axis sizes (rubric_jax/sharding.py MeshConfig); experiments.run adds `rollout`."""

    data: int = setting(1, "Data-parallel axis size.", bounds=(1, counts.DEVICES))
    fsdp: int = setting(-1, "Fully-sharded axis size (-1: all devices left).")
    tensor: int = setting(1, "Tensor-parallel axis size.", bounds=(1, counts.DEVICES))

    def validate(self) -> None:
        if self.fsdp != -1 and counts.problem(self.fsdp, 1, counts.DEVICES) is not None:
            self.fail("fsdp", f"expected an integer in [1, {counts.DEVICES}], or -1 for every device left")


@dataclasses.dataclass(frozen=True)
class ExperimentMeshBlock(MeshBlock):
    """config.mesh of an experiment: the training mesh and the rollouts' decode layout over the same devices."""

    rollout: RolloutMeshBlock = setting(RolloutMeshBlock, "The rollouts' decode layout.")


@dataclasses.dataclass(frozen=True)
class DataBlock(Block):
    """The run's data files: questions, SFT pairs, rubric, golden set, and prompt padding."""

    train: str = setting("", 'jsonl of training questions ({"id","question",...}), or tfds:NAME[:SPLIT] (split '
                             '"train").')
    eval: str = setting("", 'jsonl of held-out questions, or tfds:NAME[:SPLIT] (split "eval"; ":golden" for the '
                            "golden set).")
    tfds_dir: str = setting("", "Directory holding the tfds datasets named by tfds:NAME (experiments.prepare_data "
                                "--out).")
    sft: str = setting("", 'jsonl of cold-start SFT pairs ({"prompt","response"}).')
    rubric: str = setting("", "Rubric file (YAML/JSON) shared by every question; rows may add their own.")
    golden: str = setting("", "Golden set (issue 7 §4): held-out questions with reference answers (+ optional "
                              '"labels" of them), never trained on; jsonl, or tfds:NAME[:SPLIT] (split "golden"); '
                              "empty = none. Scored at every eval.")
    golden_max_jaccard: float = setting(0.7, "Refuse golden questions whose char 3-gram Jaccard with a training one "
                                             "reaches this (prepare_data's dedup threshold).", bounds=UNIT)
    rubric_correction: str = setting("", "Score correction (JSON/YAML) applied to judge scores (experiments.calibrate;"
                                         " RubricRL §3.3 后处理校准); empty = none; in the hash.")
    max_prompt_len: int = setting(128, "Prompts are left-padded to a bucket up to this length.",
                                  bounds=(1, counts.TOKENS))
    length_buckets: int = setting(3, "Power-of-two padding widths per length (max, max/2, ...); each compiles once.",
                                  bounds=(1, 16))


@dataclasses.dataclass(frozen=True)
class SFTBlock(Block):
    """Cold-start supervised fine-tuning (the `sft` stage)."""

    lr: float = setting(1e-6, "QuRL cold start: lr 1e-6.")
    batch_size: int = setting(16, "QuRL cold start: batch 16.", bounds=(1, 1 << 16))
    epochs: int = setting(2, "QuRL cold start: 2 epochs.", bounds=(1, 10**4))
    warmup_steps: int = setting(0, "Linear warmup steps.", bounds=(0, counts.STEPS))
    schedule: str = setting("constant", "constant or cosine after warmup.", choices=SCHEDULES)
    weight_decay: float = setting(0.0, "AdamW weight decay.")
    grad_clip: float = setting(1.0, "Global-norm gradient clipping.")
    max_response_len: int = setting(256, "Longest SFT response in tokens (responses are padded to power-of-two "
                                         "buckets).", bounds=(1, counts.TOKENS))


@dataclasses.dataclass(frozen=True)
class RLBlock(Block):
    """GRPO (the `grpo` stage): optimiser, sampling, loss and the multi-dimension recipe."""

    lr: float = setting(1e-6, "RubricRL §4.3 and QuRL: 1e-6 (drop to 5e-7 if the reward oscillates).")
    steps: int = setting(100, "GRPO steps (rollout batches).", bounds=(1, counts.STEPS))
    questions_per_step: int = setting(32, "QuRL: global batch 32 questions.", bounds=(1, 1 << 16))
    group_size: int = setting(8, "Samples per question (RubricRL §4.3, QuRL: 8); at least 2, a group's advantages "
                                 "compare its samples.", bounds=(2, 1024))
    max_new_tokens: int = setting(256, "Response budget per sample.", bounds=(1, counts.TOKENS))
    sampler: str = setting("temperature(1.0)", '"temperature(t)" only: every log-prob is of softmax(logits/t) (TRL, '
                                               "verl).")
    beta: float = setting(0.04, "KL coefficient (RubricRL §4.3: 0.01-0.05); 0 skips the reference model.")
    kl_estimator: str = setting("k3", "k1, k2 or k3 (Schulman's estimators).", choices=KL_ESTIMATORS)
    clip_low: float = setting(0.2, "PPO clip below 1 (RubricRL §4.3: 0.2-0.3).")
    clip_high: float = setting(0.28, "Clip above 1 (DAPO clip-higher).")
    loss_aggregation: str = setting("seq_mean_token_mean", "GRPO; or token_mean (DAPO), seq_mean_token_sum_norm "
                                                           "(Dr. GRPO).", choices=AGGREGATIONS)
    advantage_scaling: str = setting("group", "group std (GRPO), batch std, or none (Dr. GRPO).",
                                     choices=ADVANTAGE_SCALINGS)
    advantage_eps: float = setting(1e-6, "Added to the std before dividing (RubricRL §5.3 pseudo-code).")
    updates_per_batch: int = setting(1, "Optimizer updates per rollout batch (importance ratio vs behaviour).",
                                     bounds=(1, 64))
    recompute_old_logprobs: bool = setting(
        False, "Behaviour log-probs: False = the sampler's own; True = recomputed teacher-forced with the params "
        "that sampled, once per rollout (verl's recompute; costs one forward). Either way `logprob_gap/mean` logs "
        "mean |teacher-forced - sampler| on the first update: ~3e-7 in float32 on CPU, the bf16 decode drift on GPU.")
    micro_batches: int = setting(1, "Gradient accumulation micro-batches per update: whole groups, or equal parts of "
                                    "groups; 0 = the fewest whose compiled update fits the device's memory "
                                    "(train/micro_batching.py).", bounds=(0, 1 << 16))
    warmup_steps: int = setting(0, "Linear warmup steps.", bounds=(0, counts.STEPS))
    schedule: str = setting("constant", "constant or cosine after warmup.", choices=SCHEDULES)
    weight_decay: float = setting(0.0, "AdamW weight decay.")
    grad_clip: float = setting(1.0, "Global-norm gradient clipping.")
    max_nan_streak: int = setting(5, "Consecutive skipped (NaN/Inf) updates before the run stops.", bounds=(1, 10**4))
    missing_scores: str = setting("renormalize", '"renormalize" over present dimensions, or "drop" the sample (no '
                                                 "loss).", choices=MISSING_SCORES)
    advantage: str = setting(
        "sum_then_normalise", "The multi-dimension recipe (issue 21; every option off by default: the default run "
        'is GRPO as above): or "per_dimension": each dimension normalised in its group, weighted, whitened (GDPO, '
        "arXiv 2601.05242).", choices=ADVANTAGES)
    overlong_buffer: int = setting(0, "DAPO soft overlong punishment over the last N tokens before max_new_tokens "
                                      "(DAPO: 4096 of 20480); 0 = off.", bounds=(0, counts.TOKENS))
    overlong_penalty: float = setting(1.0, "Reward penalty at max_new_tokens, falling linearly from 0 over the buffer "
                                           "(DAPO: 1).")
    mask_truncated: bool = setting(False, "DAPO overlong filtering: responses cut at max_new_tokens get no loss.")
    importance_level: str = setting("token", 'or "sequence": GSPO\'s length-normalised sequence ratio (arXiv '
                                             "2507.18071; TRL importance_sampling_level).", choices=IMPORTANCE_LEVELS)
    clip_ratio_c: float = setting(0.0, "Dual-clip PPO bound c > 1 for negative advantages (arXiv 1912.09729; verl "
                                       "default 3); 0 = off.")
    kl_cap: float = setting(0.0, "Clip each token's KL estimate to [-cap, cap] (verl clips k3 to 10); 0 = off.")
    behaviour_correction_cap: float = setting(
        0.0, "Truncated importance sampling between trainer and sampler log-probs, weight min(pi_old/pi_sampler, C) "
        "(TRL vllm_importance_sampling_cap, verl tis_imp_ratio_cap); needs recompute_old_logprobs; 0 = off.")
    loss: str = setting("grpo", "Policy loss (docs/training.md): grpo (PPO's clipped surrogate), cispo (MiniMax-M1, arXiv "
                                "2506.13585; TRL/verl \"cispo\") or sapo (Qwen, arXiv 2511.20347; TRL/verl \"sapo\").",
                        choices=LOSSES)
    cispo_clip_low: float = setting(1.0, "CISPO: IS weight clipped below at 1 - this (MiniMax-M1: no floor, 1; verl "
                                         "clip_ratio_low).")
    cispo_clip_high: float = setting(4.0, "CISPO: IS weight clipped above at 1 + this (TRL: weight cap epsilon_high "
                                          "5.0, from ScaleRL).")
    sapo_tau_pos: float = setting(1.0, "SAPO: soft-gate temperature for A > 0 (TRL sapo_temperature_pos, verl tau_pos: "
                                       "1.0).")
    sapo_tau_neg: float = setting(1.05, "SAPO: soft-gate temperature for A <= 0 (TRL sapo_temperature_neg, verl "
                                        "tau_neg: 1.05).")
    entropy_coef: float = setting(0.0, "Entropy bonus: minus this x the policy's full-distribution entropy per response "
                                       "token, aggregated as the loss (verl entropy_coeff, TRL entropy_coef); 0 = off.")
    dynamic_sampling: bool = setting(
        False, "DAPO dynamic sampling (arXiv 2503.14476 §3.2; train/dynamic.py): keep only groups whose rewards vary; "
        "refill from the next questions (shapes stay those of one round).")
    dynamic_sampling_min_spread: float = setting(0.0, "A group is kept when max - min of its rewards exceeds this "
                                                      "(rubric rewards are continuous).")
    dynamic_sampling_max_rounds: int = setting(2, "Most extra sampling rounds per step, of dynamic_sampling and of "
                                                  "group_selection alike (one refill mechanism, one rule at a time; "
                                                  "top_variance(p) needs ceil(1/p) - 1); then the least-flat dropped "
                                                  "groups fill the batch.", bounds=(1, 100))
    off_policy_steps: int = setting(0, "1: sample and judge step t + 1 while step t updates (train/off_policy.py; verl "
                                       "one-step off-policy, AReaL, SkyRL); needs recompute_old_logprobs and "
                                       "behaviour_correction_cap; 0 = off.", bounds=(0, 1))
    group_selection: str = setting("none", "Or zero_std / top_variance(p): keep groups whose advantage-input std > 0 / "
                                           "the top fraction p by it, refilled as dynamic sampling does (verl #7894, "
                                           "TRL #7242, SkyRL #2217; its rounds bounded by dynamic_sampling_max_rounds; "
                                           "not with dynamic_sampling).")
    rollout_chunks: int = setting(
        1, "Judging overlapped with sampling (docs/training.md; train/overlap.py): a rollout is sampled in this many "
        "sampler calls of whole groups (must divide questions_per_step; one process), the host judging chunk j (an "
        "HTTP or rule judge) while the devices sample chunk j + 1. Same parameters, tokens, rewards and batch as one "
        "call; 1 = off.", bounds=(1, 1 << 16))
    lr_on_oscillation: bool = setting(False, "Multiply the lr by lr_drop_factor when the windowed reward oscillates "
                                             "(RubricRL §4.3: 1e-6 -> 5e-7; train/oscillation.py); off by default.")
    oscillation_window: int = setting(20, "GRPO steps of reward/mean in the oscillation test (and between two "
                                          "drops).", bounds=(3, 10**6))
    oscillation_ratio: float = setting(4.0, "Oscillating: path length / displacement of the window's rewards at "
                                            "least this.")
    oscillation_min_swing: float = setting(0.02, "... and a mean step-to-step change of at least this (a quiet reward "
                                                 "never drops).")
    lr_drop_factor: float = setting(0.5, "Each drop multiplies the lr by this (RubricRL: 1e-6 -> 5e-7).")
    min_lr_factor: float = setting(0.25, "No drop below this fraction of the configured lr.")
    dynamic_weights: bool = setting(False, "Move weight from saturated to discriminating dimensions (RubricRL §2.3).")
    dynamic_weights_window: int = setting(20, "Steps of score statistics behind the saturation test.",
                                          bounds=(1, 10**6))
    rubric_hints: float = setting(
        0.0, "RuscaRL rubric scaffolding (arXiv 2508.16949; train/scaffold.py): sample j of each group of G sees this "
        "share x (G-1-j)/(G-1) x the step decay of its rubric's criteria in its system prompt; the update reads the "
        "plain prompt (needs recompute_old_logprobs); 0 = off.", bounds=UNIT)
    rubric_hints_decay: str = setting("sigmoid", "The hints' decay over GRPO steps: sigmoid 1/(1+exp(steepness (x - "
                                                 "midpoint))) at progress x in [0, 1] (RuscaRL step_sigmoid), linear "
                                                 "1 - x, or none.", choices=HINT_DECAYS)
    rubric_hints_midpoint: float = setting(0.2, "Sigmoid decay: progress where the hints are halved (RuscaRL's "
                                                "HealthBench script: 0.2).", bounds=UNIT)
    rubric_hints_steepness: float = setting(125.0, "Sigmoid decay: its steepness (RuscaRL's HealthBench script: 125; "
                                                   "its code's default 10).", bounds=(0.1, 1e4))
    rubric_hints_max_chars: int = setting(300, "Longest criterion text in a hint (characters; longer ones are cut): "
                                               "per-row rubrics come from the data.", bounds=(16, 4096))
    rubric_refresh_every: int = setting(0, "Evolving rubrics (open-instruct PRs #1460, #1581; train/evolving.py): every "
                                        "N GRPO steps the judge's LLM proposes criteria from the step's best/worst "
                                        "answer pairs, the QuRL filter keeps those that discriminate; 0 = off.",
                                        bounds=(0, counts.STEPS))
    rubric_refresh_pairs: int = setting(2, "Questions whose best/worst answer pair the proposer sees per refresh; the "
                                        "step's other questions are held out for the filter.", bounds=(1, 1 << 16))
    rubric_refresh_max_new: int = setting(2, "Most criteria one refresh adds (the most discriminating kept first).",
                                          bounds=(1, 64))
    rubric_retire_saturation: float = setting(0.95, "An evolved criterion retires at a refresh when this share of its "
                                              "valid scores on the step is at its top level (monitor/saturation).",
                                              bounds=(0.0, 1.0))

    def validate(self) -> None:
        if self.questions_per_step % self.rollout_chunks:
            self.fail("rollout_chunks", f"must divide rl.questions_per_step={self.questions_per_step}: a chunk holds "
                                        "whole groups")
        if self.behaviour_correction_cap and not self.recompute_old_logprobs:
            self.fail("behaviour_correction_cap", "the correction weighs the trainer's recomputed log-probs against "
                                                  "the sampler's: set rl.recompute_old_logprobs=True")
        if self.rubric_hints and not self.recompute_old_logprobs:
            self.fail("rubric_hints", "a hinted sample's update reads the plain prompt, so its behaviour log-probs must "
                                      "be recomputed on it (RuscaRL): set rl.recompute_old_logprobs=True")
        if self.rubric_hints and self.behaviour_correction_cap:
            self.fail("rubric_hints", "the behaviour correction would weigh a hinted sample by pi(plain) / pi(hinted), "
                                      "undoing the scaffold (RuscaRL applies none): set rl.behaviour_correction_cap=0")
        if self.rubric_refresh_every and self.rubric_refresh_pairs >= self.questions_per_step:
            self.fail("rubric_refresh_pairs", f"must be below rl.questions_per_step={self.questions_per_step}: the "
                                              "step's other questions are the filter's held-out ones")


@dataclasses.dataclass(frozen=True)
class EvalBlock(Block):
    """Held-out evaluation inside the grpo stage."""

    every_steps: int = setting(10, "Eval on the held-out set every N GRPO steps (and before/after).",
                               bounds=(1, counts.STEPS))
    max_questions: int = setting(64, "Held-out questions per eval.", bounds=(1, 10**6))
    sampler: str = setting("greedy", "Eval sampler.")
    max_new_tokens: int = setting(256, "Response budget of an eval answer (its own: rl.max_new_tokens is the "
                                       "rollouts').", bounds=(1, counts.TOKENS))


@dataclasses.dataclass(frozen=True)
class MonitorBlock(Block):
    """Reward-hacking monitors (RubricRL §6, issue 7 §3): written every GRPO step (train/monitors.py); a value past
    its threshold appends to <workdir>/alerts.jsonl and logs "alert step N: template share 0.61 > 0.40". The
    template share and reward-length Spearman of one step depend on which questions it drew: their alerts compare
    the mean of the last `window_steps` steps (monitor/<m>/window_mean) with the threshold."""

    window_steps: int = setting(10, "GRPO steps behind the windowed alerts (template share, reward-length, zero-std, "
                                    "saturation rise, redundancy; 1 = per step).", bounds=(1, 10**6))
    max_template_share: float = setting(
        0.4, "Share of responses in a 首先…其次…最后 / first…second…finally template (RubricRL: 12% -> 67% while reward "
        "rose).", bounds=UNIT)
    max_length_drift: float = setting(1.0, "Mean response tokens / first GRPO step's - 1 (1.0 = doubled; inf = "
                                           "never).", bounds=(0.0, math.inf))
    max_saturation_rise: float = setting(
        0.5, "Rise of a dimension's top-level share since steps 1-window_steps (window means): penalty and gate "
        "dimensions sit at their top level from step 1 by design (RubricRL §2.3 刷满, §6.3 collapse).", bounds=UNIT)
    max_zero_std_frac: float = setting(0.9, "Window mean share of groups whose rewards are all equal: no GRPO signal "
                                            "(RubricRL §4.3, §6.3).", bounds=UNIT)
    max_redundancy: float = setting(0.9, "Spearman of two dimensions over the window's rollouts, alert at or above "
                                         "(RubricRL §2.1 MECE).", bounds=CORRELATION)
    max_reward_length_corr: float = setting(0.5, "Spearman of reward vs response length within a step (length bias, "
                                                 "RubricRL §3.3).", bounds=CORRELATION)
    max_judge_parse_failure: float = setting(0.1, "Share of LLM-judge prompts without a parseable verdict (rejected, "
                                                  "cut, too long).", bounds=UNIT)
    max_missing_share: float = setting(0.2, "Share of a dimension's scores missing at a step (its judge failed; the "
                                            "reward drops them).", bounds=UNIT)
    min_golden_spearman: float = setting(0.6, "Judge vs labels on golden reference answers, per dimension (RubricRL: "
                                              "below 0.6 is unusable).", bounds=CORRELATION)
    min_audit_agreement: float = setting(0.6, "Training vs audit judge on eval responses: Spearman and quadratic kappa"
                                              " per dimension (the calibration floor).", bounds=CORRELATION)
    max_audit_gap_rise: float = setting(0.1, "Rise of a dimension's training-minus-audit score gap over the last "
                                             "audit.window audits (normalised units).", bounds=UNIT)


@dataclasses.dataclass(frozen=True)
class AuditBlock(Block):
    """Audit of the judge on what the policy writes now (RubricRL §6.2, issue 23 §1; train/audit.py): at every eval,
    a fixed sample of the eval responses is scored again by another judge on the LLM dimensions (audit/* metrics,
    alerts in the monitor block)."""

    judge: JudgeSpec = setting(JudgeSpec, "The audit judge: any judge spec (configs/judges/*.py); checkpoint \"\" with "
                                          "backend jax = no audit.")
    rubric: str = setting("", "Rubric whose LLM dimensions the audit judge reads (the anchors it was calibrated on); "
                              '"" = each row\'s own.')
    sample_size: int = setting(32, "Eval responses audited per eval: the same seeded subset every time (all when "
                                   "fewer); at least 3, the fewest pairs a rank correlation needs.", bounds=(3, 10**5))
    window: int = setting(5, "Audits behind audit/gap/<d>/rise: the gap minus the smallest gap of the previous "
                             "`window` audits.", bounds=(1, 10**4))

    def validate(self) -> None:
        if not self.judge.has_judge and self.rubric:
            self.fail("rubric", "there is no audit judge to read it: set config.audit.judge.checkpoint")


@dataclasses.dataclass(frozen=True)
class CheckpointBlock(Block):
    """When checkpoints are saved and how many are kept."""

    every_steps: int = setting(10, "Save every N GRPO steps (and at the end and on SIGTERM).",
                               bounds=(1, counts.STEPS))
    keep: int = setting(3, "Checkpoints kept (the newest ones).", bounds=(1, 1000))
    keep_best: bool = setting(True, "Also save at every eval and keep the best-evaluated GRPO checkpoint (QuRL "
                                    "reports it).")


@dataclasses.dataclass(frozen=True)
class ExportBlock(Block):
    """Export of the policy as a Hugging Face directory at the end of a run."""

    at_end: bool = setting(False, "Write the policy to <workdir>/export as a HF directory (transformers, vLLM).")
    which: str = setting("latest", 'At the end: the final policy ("latest") or the best-evaluated checkpoint '
                                   '("best").', choices=EXPORT_WHICH)


@dataclasses.dataclass(frozen=True)
class LogBlock(Block):
    """What a run writes beside its metrics."""

    samples_per_step: int = setting(4, "Responses written to samples.jsonl per step.", bounds=(0, 10**4))


@dataclasses.dataclass(frozen=True)
class ExperimentConfig(Block):
    """An experiment's full set of keys (experiments.run, sweep, build_rubrics): experiment files change values,
    never add keys (the config is locked)."""

    seed: int = setting(0, "Seeds parameter init, data order, sampling and judging.", bounds=(0, counts.SEED))
    stages: tuple[str, ...] = setting(STAGES, "Stages run in order; eval runs inside grpo (before, every N steps, "
                                              "end).", choices=STAGES)
    model: ModelBlock = setting(ModelBlock, "The policy model.")
    lora: LoraBlock = setting(LoraBlock, "LoRA: the stages that train through low-rank adapters (rank 0 = off).")
    judge: JudgeSpec = setting(JudgeSpec, "The LLM judge: the same block as configs/judges/*.py and every command's "
                                          "--judge.")
    reward: RewardBlock = setting(RewardBlock, "What scores rollouts.")
    mesh: ExperimentMeshBlock = setting(ExperimentMeshBlock, "The training mesh and the rollouts' decode layout.")
    data: DataBlock = setting(DataBlock, "The run's data files.")
    sft: SFTBlock = setting(SFTBlock, "Cold-start SFT.")
    rl: RLBlock = setting(RLBlock, "GRPO.")
    eval: EvalBlock = setting(EvalBlock, "Held-out evaluation.")
    monitor: MonitorBlock = setting(MonitorBlock, "Reward-hacking monitors.")
    audit: AuditBlock = setting(AuditBlock, "Audit of the judge.")
    checkpoint: CheckpointBlock = setting(CheckpointBlock, "Checkpoint cadence and retention.")
    export: ExportBlock = setting(ExportBlock, "HF export at the end.")
    qurl: BuildConfig = setting(BuildConfig, "experiments.build_rubrics: QuRL case-wise rubric construction.")
    log: LogBlock = setting(LogBlock, "What a run writes beside its metrics.")

    def validate(self) -> None:
        stages = self.stages
        if not stages or len(set(stages)) != len(stages) or sorted(stages, key=STAGES.index) != list(stages):
            self.fail("stages", f"expected a non-empty subset of {STAGES} without repeats")
        if self.export.which == "best" and "grpo" not in stages:
            raise BlockError("export.which", "best", "the best checkpoint is the best-evaluated GRPO one; this run "
                                                     "has no GRPO stage")
        if self.lora.rank and not set(self.lora.stages) & set(stages):
            raise BlockError("lora.stages", self.lora.stages, f"none of them runs (config.stages={stages}): the "
                                                              "adapters would train nothing; set lora.rank=0 or a stage")
        if self.reward.source == "reward_model":
            self._check_reward_model()
        self._check_shared_base()
        if self.rl.rubric_refresh_every:
            self._check_rubric_refresh()
        if self.audit.judge.has_judge and self.reward.source != "rubric":
            raise BlockError("audit.judge.checkpoint", ",".join(self.audit.judge.checkpoints), "the audit compares "
                             f"LLM-judged rubric dimensions; config.reward.source={self.reward.source!r} has none")

    def _check_shared_base(self) -> None:
        """judge.share_policy_base needs a base to share in every stage that judges (GRPO: its rollouts and evals):
        that stage must train through LoRA; and the audit judge is another judge, never the policy's base."""
        if self.audit.judge.share_policy_base:
            raise BlockError("audit.judge.share_policy_base", True, "the audit judge is a second opinion: name its "
                                                                    "checkpoint (only config.judge may share the base)")
        if not self.judge.share_policy_base:
            return
        if not (self.lora.rank and "grpo" in self.lora.stages and "grpo" in self.stages):
            raise BlockError("judge.share_policy_base", True, "needs a GRPO stage trained through LoRA (the judge is "
                             f"its frozen base with the adapters off): config.lora.rank={self.lora.rank}, "
                             f"lora.stages={self.lora.stages}, stages={self.stages}")

    def _check_rubric_refresh(self) -> None:
        """Evolving rubrics need an LLM to write criteria (the judge's backend) and a rubric reward to evolve; the
        dynamic weights and a batch sampled ahead assume a fixed rubric."""
        every = self.rl.rubric_refresh_every
        if not self.judge.has_judge:
            raise BlockError("rl.rubric_refresh_every", every, "the judge's LLM writes the new criteria: set "
                             "config.judge.checkpoint, or judge.backend=openai with base_url and model")
        if self.reward.source != "rubric":
            raise BlockError("rl.rubric_refresh_every", every, f"evolves the rubric; config.reward.source="
                                                               f"{self.reward.source!r} has none")
        for key, value in (("rl.dynamic_weights", self.rl.dynamic_weights),
                           ("rl.off_policy_steps", self.rl.off_policy_steps)):
            if value:
                raise BlockError("rl.rubric_refresh_every", every, f"not with {key}={value}: it assumes the rubric's "
                                                                   "dimensions stay fixed")

    def _check_reward_model(self) -> None:
        """A reward model scores alone: every key that reads rubric dimensions is refused, naming it."""
        if self.judge.checkpoints:
            raise BlockError("judge.checkpoint", ",".join(self.judge.checkpoints), "config.reward.source="
                             "'reward_model' scores with the reward model alone; drop the judge")
        if self.judge.share_policy_base:
            raise BlockError("judge.share_policy_base", True, "config.reward.source='reward_model' scores with the "
                                                              "reward model alone; drop the judge")
        if self.rl.dynamic_weights:
            raise BlockError("rl.dynamic_weights", True, "re-weights rubric dimensions; a reward model has none")
        if self.rl.advantage == "per_dimension":
            raise BlockError("rl.advantage", "per_dimension", "normalises each rubric dimension; a reward model has "
                                                              "none (use 'sum_then_normalise')")
        if self.data.rubric_correction:
            raise BlockError("data.rubric_correction", self.data.rubric_correction, "corrects judge scores; a reward "
                                                                                    "model has none")


@dataclasses.dataclass(frozen=True)
class ConfigRecord:
    """The resolved config as a run writes it (config_boundary.record): run_info's dict, config.json's text (sorted
    keys, indent 2) and its sha256 (done.json: a sweep skips a finished run whose config is unchanged)."""

    values: dict[str, Any]
    json: str
    sha256: str

"""Config blocks: small functions each returning one ConfigDict block (model, judge, mesh, data, rl, ...) that the
experiment files (configs/tiny.py, ...) and the command configs (configs/commands/*.py) compose.

Every field has a one-line comment with its meaning and, where it comes from a paper, the source.
Dependent values are derived in code after command-line overrides, never here.
"""

from __future__ import annotations

import ml_collections


def judge_block() -> ml_collections.ConfigDict:
    """The LLM judge (rubric_jax/judges/spec.py JudgeSpec): one block with one set of defaults for experiments.run
    (config.judge) and the --judge of score, calibrate, evaluate, distill_judge and build_rubrics; judge files in
    configs/judges/ start from it. Fields marked [hash] change verdicts and enter the judge hash. Each comment gives the
    field's meaning and its source: the paper section it follows, or the module that implements it (docs/judges.md has
    the same table)."""
    j = ml_collections.ConfigDict()
    j.checkpoint = ""  # [hash: weights identity] Local HF dir(s) of the judge, comma-separated for an ensemble; "" = rule dimensions only.
    j.ensemble = "mean"  # [hash] How several judges combine: mean, or agreement weighting (RubricRL §6.2).
    # [hash] per_dimension: one prompt per (response, LLM dimension) (RubricRL §3); all_criteria: one prompt per response
    # over all its LLM criteria (QuRL); benchmark: the benchmark's prescribed one (experiments.evaluate only).
    j.mode = "per_dimension"
    j.prompt = "full"  # [hash] full (rules, question, criteria), or compact: a distilled judge's short prompt (per_dimension only).
    # [hash, when not the default] criteria_first: each prompt prefilled whole, the criterion before the response; shared_prefix:
    # the response first and the criterion last, a response's shared part prefilled once for all its LLM dimensions
    # (per_dimension only; its own calibration; cost and agreement in docs/judges.md, "Shared-prefix judging").
    j.layout = "criteria_first"
    j.samples = 3  # [hash] Judge samples per item, combined by the median (RubricRL §3.3).
    j.shuffle_anchors = True  # [hash] A fresh anchor order per judge sample (RubricRL §3.3).
    j.max_retries = 2  # [hash] Re-prompt rounds for unparseable answers before a score is missing (judges/llm_judge.py rounds).
    j.max_new_tokens = 64  # [hash] Judge answer budget in tokens (a verdict cut at it is invalid: judges/llm_judge.py).
    j.sampler = "temperature(0.7)"  # [hash] Judge sampler (rubric_jax.sampling: greedy, temperature(t), topk, nucleus).
    # [hash] Judge weights dtype (rubric_jax/loader.py): auto (bfloat16 on accelerators, float32 on CPU), float32, bfloat16.
    j.param_dtype = "auto"
    j.compute_dtype = "auto"  # [hash] Judge activation dtype, same choices.
    j.batch_size = 0  # Most judge prompts per generate call (bounds its KV cache; 0 = a whole round at once; judges/llm_judge.py).
    # Consecutive devices splitting each judge weight (its decode tensor-parallel group: sharding.decode_layout); the
    # other devices hold replicas.
    j.tensor = 1
    # A calibration report.json (experiments.calibrate; RubricRL §3.2: Spearman/kappa vs human labels, flagged below 0.6)
    # checked against this (rubric, judge) pair at start-up (rubric_jax/calibration/pinning.py); "" = none.
    j.calibration = ""
    j.require_calibration = False  # True: an uncalibrated (rubric, judge) pair or a flagged dimension stops the command (exit 2).
    j.store = ""  # Verdict store (judges/store.py: SQLite on a local disk) of judge answers, keyed by the judge hash; "" = none.
    j.store_rollouts = False  # Policy responses read/write the store too (off: they never repeat; golden references always do).
    # Where verdicts come from (docs/judges.md, "Judges anywhere"): jax = the checkpoint in this process; openai = an
    # OpenAI-compatible endpoint (an API, vLLM/SGLang, or experiments.serve), checkpoint then optional (its tokenizer).
    # The endpoint fields below are judges/http_backend.py's.
    j.backend = "jax"  # [hash, openai only] jax | openai.
    j.base_url = ""  # [hash] The endpoint's URL up to /v1, e.g. http://127.0.0.1:8000/v1 (backend=openai only).
    j.model = ""  # [hash] The served model's name, as GET <base_url>/models lists it (backend=openai only).
    j.api_key_env = ""  # NAME of the environment variable holding the API key ("" = no key); the key is never stored.
    j.endpoint = "chat"  # [hash] chat: /v1/chat/completions; completions: /v1/completions with the checkpoint's chat template.
    j.max_concurrency = 8  # Judge requests in flight at once.
    j.timeout_s = 60.0  # Seconds one request may take before it is retried.
    j.max_retries_http = 5  # HTTP retries per request (exponential backoff with jitter, honouring Retry-After).
    j.outage_s = 300.0  # Seconds an unreachable endpoint is waited for (then the command stops, resumable); 0 = its prompts' scores go missing.
    j.requests_per_minute = 0  # Request rate limit (0 = unlimited).
    j.tokens_per_minute = 0  # Token rate limit: prompt + completion tokens, estimated before the answer (0 = unlimited).
    # Cascade (RubricRL §7 "用更小的模型做初筛、大模型做精评"; docs/judges.md, "Cascade"): this judge screens every item
    # (one score of one response on one LLM dimension); a second judge re-judges only the uncertain ones, and its
    # verdict replaces the first's. The cascade_* fields are read (and hashed) only with a cascade.
    # [hash: the refining judge's own hash] Path of the refining judge's config file (configs/judges/*.py); "" = none.
    j.cascade = ""
    j.cascade_spread = 0.0  # [hash] Escalate an item whose valid samples spread (max - min, [0, 1] scale) more than this.
    # [hash] Escalate an item whose score (median, [0, 1] scale) lies within this of a decision: a gate dimension's
    # failing score 0 (a gate failure is confirmed), or one of cascade_thresholds. An item without a verdict escalates.
    j.cascade_margin = 0.0
    j.cascade_thresholds = ()  # [hash] Decision thresholds ([0, 1] scale) besides the gates', e.g. (0.5,): met / not met.
    return j


def benchmark_judge_block() -> ml_collections.ConfigDict:
    """The judge of a public benchmark in experiments.evaluate (configs/judges/<benchmark>.py): the benchmark's own
    prompt, one verdict per item as its grader gives, and a budget for its graders' written justifications."""
    j = judge_block()
    j.mode = "benchmark"  # HelloBench, LongBench-Write: all criteria in one prompt; HealthBench, BiGGen: one per criterion.
    j.samples = 1  # The benchmarks report one grader verdict per item.
    j.max_retries = 3  # Re-prompt rounds for an unparseable verdict (LongBench-Write retries its grader too).
    j.max_new_tokens = 512  # Room for a justification per criterion before the verdict lines.
    return j


def model_block() -> ml_collections.ConfigDict:
    """The policy model: where its weights come from and how it computes (experiments.run, build_rubrics)."""
    b = ml_collections.ConfigDict()
    b.checkpoint = ""  # Local HF directory to load; empty = random init from `config_json`.
    b.config_json = ""  # HF config.json for a random init (the tiny default ships one).
    b.tokenizer = ""  # Tokenizer directory (AutoTokenizer); empty = the checkpoint directory.
    b.param_dtype = "float32"  # Parameters and optimizer state dtype.
    b.compute_dtype = "float32"  # Activation dtype ("bfloat16" on accelerators).
    b.remat = False  # Recompute layer activations in the backward pass (saves memory).
    b.remat_policy = "full"  # With remat, what a layer keeps: full (nothing) or dots (its matmul outputs).
    b.scan_layers = True  # lax.scan over the stacked layers (flat compile time).
    # Attention of the teacher-forced forwards (GRPO/SFT updates, log-probs; decoding always uses einsum):
    # auto (cudnn on NVIDIA GPUs in bf16, einsum elsewhere), einsum (ours), xla or cudnn (jax.nn.dot_product_attention).
    b.attention = "auto"
    return b


def reward_block() -> ml_collections.ConfigDict:
    """What scores rollouts: rubrics (rule and LLM judges) or a scalar reward model (rubric_jax/judges/reward_model.py;
    QuRL's "w/ RLHF reward model" ablation, which uses internlm2-7b-reward)."""
    b = ml_collections.ConfigDict()
    b.source = "rubric"  # "rubric" (the rows' rubrics) or "reward_model" (reward.model_checkpoint).
    # A row whose rule gate failed (reward 0 whatever else it scores) sends no LLM dimension to the judge (docs/judges.md,
    # "Gates first"; judges/reward.py): rewards unchanged, 10% of the tiny default's judge prompts spared (benchmarks/RESULTS.md).
    b.gates_first = True
    b.model_checkpoint = ""  # Local HF Qwen2/Llama *ForSequenceClassification directory with one label.
    b.model_dtype = "float32"  # Reward-model weights and activations: float32 or bfloat16.
    b.model_max_len = 4096  # Longest chat (question + response, RM tokens) scored; a longer one scores the minimum (counted).
    b.model_batch_size = 64  # Rows per reward-model forward call (bounds attention memory).
    b.model_center = 0.0  # reward = sigmoid((logit - center) / scale): the scalar mapped to (0, 1).
    b.model_scale = 1.0  # Logit units per unit of the sigmoid's argument (> 0).
    return b


def mesh_block() -> ml_collections.ConfigDict:
    """The training mesh's axis sizes (rubric_jax/sharding.py MeshConfig); experiments.run adds `rollout`."""
    b = ml_collections.ConfigDict()
    b.data = 1  # Data-parallel axis size.
    b.fsdp = -1  # Fully-sharded axis size (-1: all devices left).
    b.tensor = 1  # Tensor-parallel axis size.
    return b


def rollout_block() -> ml_collections.ConfigDict:
    """Decode layout of rollouts over the same devices (verl's 3D-HybridEngine idea; judges have their own, judge.tensor):
    the policy is resharded to it once per rollout, so no decode step all-gathers an FSDP weight."""
    b = ml_collections.ConfigDict()
    b.tensor = 1  # Tensor-parallel group (consecutive devices of one host); the rest replicate. Must divide the heads and KV heads.
    b.param_dtype = "compute"  # Policy weights while decoding: compute (= model.compute_dtype), float32 or bfloat16.
    return b



def data_block() -> ml_collections.ConfigDict:
    """The run's data files: questions, SFT pairs, rubric, golden set, and prompt padding."""
    b = ml_collections.ConfigDict()
    b.train = ""  # jsonl of training questions ({"id","question",...}), or tfds:NAME[:SPLIT] (split "train").
    b.eval = ""  # jsonl of held-out questions, or tfds:NAME[:SPLIT] (split "eval"; ":golden" for the golden set).
    b.tfds_dir = ""  # Directory holding the tfds datasets named by tfds:NAME (experiments.prepare_data --out).
    b.sft = ""  # jsonl of cold-start SFT pairs ({"prompt","response"}).
    b.rubric = ""  # Rubric file (YAML/JSON) shared by every question; rows may add their own.
    # Golden set (issue 7 §4): held-out questions with reference answers (+ optional "labels" of them), never trained on.
    b.golden = ""  # jsonl of golden questions, or tfds:NAME[:SPLIT] (split "golden"); empty = none. Scored at every eval.
    b.golden_max_jaccard = 0.7  # Refuse golden questions whose char 3-gram Jaccard with a training one reaches this (prepare_data's dedup threshold).
    # Calibration (experiments.calibrate): a fitted per-dimension score correction, RubricRL §3.3 "后处理校准".
    b.rubric_correction = ""  # Score correction (JSON/YAML) applied to judge scores; empty = none; in the hash.
    b.max_prompt_len = 128  # Prompts are left-padded to a bucket up to this length.
    b.length_buckets = 3  # Power-of-two padding widths per length (max, max/2, ...); each compiles once.
    return b


def sft_block() -> ml_collections.ConfigDict:
    """Cold-start supervised fine-tuning (the `sft` stage)."""
    b = ml_collections.ConfigDict()
    b.lr = 1e-6  # QuRL cold start: lr 1e-6.
    b.batch_size = 16  # QuRL cold start: batch 16.
    b.epochs = 2  # QuRL cold start: 2 epochs.
    b.warmup_steps = 0  # Linear warmup steps.
    b.schedule = "constant"  # constant or cosine after warmup.
    b.weight_decay = 0.0  # AdamW weight decay.
    b.grad_clip = 1.0  # Global-norm gradient clipping.
    b.max_response_len = 256  # Longest SFT response in tokens (responses are padded to power-of-two buckets).
    return b


def rl_block() -> ml_collections.ConfigDict:
    """GRPO (the `grpo` stage): optimiser, sampling, loss and the multi-dimension recipe."""
    b = ml_collections.ConfigDict()
    b.lr = 1e-6  # RubricRL §4.3 and QuRL: 1e-6 (drop to 5e-7 if the reward oscillates).
    b.steps = 100  # GRPO steps (rollout batches).
    b.questions_per_step = 32  # QuRL: global batch 32 questions.
    b.group_size = 8  # Samples per question (RubricRL §4.3, QuRL: 8).
    b.max_new_tokens = 256  # Response budget per sample.
    b.sampler = "temperature(1.0)"  # "temperature(t)" only: every log-prob is of softmax(logits/t) (TRL, verl).
    b.beta = 0.04  # KL coefficient (RubricRL §4.3: 0.01-0.05); 0 skips the reference model.
    b.kl_estimator = "k3"  # k1, k2 or k3 (Schulman's estimators).
    b.clip_low = 0.2  # PPO clip below 1 (RubricRL §4.3: 0.2-0.3).
    b.clip_high = 0.28  # Clip above 1 (DAPO clip-higher).
    b.loss_aggregation = "seq_mean_token_mean"  # GRPO; or token_mean (DAPO), seq_mean_token_sum_norm (Dr. GRPO).
    b.advantage_scaling = "group"  # group std (GRPO), batch std, or none (Dr. GRPO).
    b.advantage_eps = 1e-6  # Added to the std before dividing (RubricRL §5.3 pseudo-code).
    b.updates_per_batch = 1  # Optimizer updates per rollout batch (importance ratio vs behaviour).
    # Behaviour log-probs: False = the sampler's own; True = recomputed teacher-forced with the params that
    # sampled, once per rollout (verl's recompute; costs one forward). Either way `logprob_gap/mean` logs
    # mean |teacher-forced - sampler| on the first update: ~3e-7 in float32 on CPU, the bf16 decode drift on GPU.
    b.recompute_old_logprobs = False
    b.micro_batches = 1  # Gradient accumulation micro-batches per update: whole groups, or equal parts of groups.
    b.warmup_steps = 0  # Linear warmup steps.
    b.schedule = "constant"  # constant or cosine after warmup.
    b.weight_decay = 0.0  # AdamW weight decay.
    b.grad_clip = 1.0  # Global-norm gradient clipping.
    b.max_nan_streak = 5  # Consecutive skipped (NaN/Inf) updates before the run stops.
    b.missing_scores = "renormalize"  # "renormalize" over present dimensions, or "drop" the sample (no loss).
    # The multi-dimension recipe (issue 21; every option off by default: the default run is GRPO as above).
    b.advantage = "sum_then_normalise"  # or "per_dimension": each dimension normalised in its group, weighted, whitened (GDPO, arXiv 2601.05242).
    b.overlong_buffer = 0  # DAPO soft overlong punishment over the last N tokens before max_new_tokens (DAPO: 4096 of 20480); 0 = off.
    b.overlong_penalty = 1.0  # Reward penalty at max_new_tokens, falling linearly from 0 over the buffer (DAPO: 1).
    b.mask_truncated = False  # DAPO overlong filtering: responses cut at max_new_tokens get no loss.
    b.importance_level = "token"  # or "sequence": GSPO's length-normalised sequence ratio (arXiv 2507.18071; TRL importance_sampling_level).
    b.clip_ratio_c = 0.0  # Dual-clip PPO bound c > 1 for negative advantages (arXiv 1912.09729; verl default 3); 0 = off.
    b.kl_cap = 0.0  # Clip each token's KL estimate to [-cap, cap] (verl clips k3 to 10); 0 = off.
    # Truncated importance sampling between trainer and sampler log-probs, weight min(pi_old/pi_sampler, C) (TRL
    # vllm_importance_sampling_cap, verl tis_imp_ratio_cap); needs recompute_old_logprobs; 0 = off.
    b.behaviour_correction_cap = 0.0
    # DAPO dynamic sampling (arXiv 2503.14476 §3.2; train/dynamic.py): more rounds of questions until every group of
    # the batch has a reward spread above the threshold; shapes stay those of one round (off by default).
    b.dynamic_sampling = False  # Keep only groups whose rewards vary; refill from the next questions.
    b.dynamic_sampling_min_spread = 0.0  # A group is kept when max - min of its rewards exceeds this (rubric rewards are continuous).
    b.dynamic_sampling_max_rounds = 2  # Most extra sampling rounds per step; then the least-flat dropped groups fill the batch.
    # Judging overlapped with sampling (docs/training.md; train/overlap.py): a rollout is sampled in this many sampler
    # calls of whole groups (must divide questions_per_step; one process), the host judging chunk j (an HTTP or rule
    # judge) while the devices sample chunk j + 1. Same parameters, tokens, rewards and batch as one call; 1 = off.
    b.rollout_chunks = 1
    b.off_policy_steps = 0  # 1: sample and judge step t + 1 while step t updates (train/off_policy.py; verl, AReaL); 0 = off.
    # RubricRL §4.3: lower the learning rate (1e-6 -> 5e-7) when the reward oscillates (train/oscillation.py).
    b.lr_on_oscillation = False  # Multiply the lr by lr_drop_factor when the windowed reward oscillates; off by default.
    b.oscillation_window = 20  # GRPO steps of reward/mean in the oscillation test (and between two drops).
    b.oscillation_ratio = 4.0  # Oscillating: path length / displacement of the window's rewards at least this.
    b.oscillation_min_swing = 0.02  # ... and a mean step-to-step change of at least this (a quiet reward never drops).
    b.lr_drop_factor = 0.5  # Each drop multiplies the lr by this (RubricRL: 1e-6 -> 5e-7).
    b.min_lr_factor = 0.25  # No drop below this fraction of the configured lr.
    b.dynamic_weights = False  # Move weight from saturated to discriminating dimensions (RubricRL §2.3).
    b.dynamic_weights_window = 20  # Steps of score statistics behind the saturation test.
    return b


def eval_block() -> ml_collections.ConfigDict:
    """Held-out evaluation inside the grpo stage."""
    b = ml_collections.ConfigDict()
    b.every_steps = 10  # Eval on the held-out set every N GRPO steps (and before/after).
    b.max_questions = 64  # Held-out questions per eval.
    b.sampler = "greedy"  # Eval sampler.
    b.max_new_tokens = 256  # Response budget of an eval answer (its own: rl.max_new_tokens is the rollouts').
    return b


def monitor_block() -> ml_collections.ConfigDict:
    """Reward-hacking monitors (RubricRL §6, issue 7 §3): written every GRPO step (train/monitors.py); a value past
    its threshold appends to <workdir>/alerts.jsonl and logs "alert step N: template share 0.61 > 0.40"."""
    b = ml_collections.ConfigDict()
    # The template share and reward-length Spearman of one step depend on which questions it drew: their alerts
    # compare the mean of the last `window_steps` steps (monitor/<m>/window_mean) with the threshold.
    b.window_steps = 10  # GRPO steps behind the windowed alerts (template share, reward-length, zero-std, saturation rise, redundancy; 1 = per step).
    b.max_template_share = 0.4  # Share of responses in a 首先…其次…最后 / first…second…finally template (RubricRL: 12% -> 67% while reward rose).
    b.max_length_drift = 1.0  # Mean response tokens / first GRPO step's - 1 (1.0 = doubled; inf = never).
    # Saturation (RubricRL §2.3 刷满, §6.3 collapse): penalty and gate dimensions sit at their top level from step 1 by design,
    # so the alert reads the rise of a dimension's window-mean share of top scores over the run's first window.
    b.max_saturation_rise = 0.5  # Rise of a dimension's top-level share since steps 1-window_steps (window means).
    b.max_zero_std_frac = 0.9  # Window mean share of groups whose rewards are all equal: no GRPO signal (RubricRL §4.3, §6.3).
    b.max_redundancy = 0.9  # Spearman of two dimensions over the window's rollouts, alert at or above (RubricRL §2.1 MECE).
    b.max_reward_length_corr = 0.5  # Spearman of reward vs response length within a step (length bias, RubricRL §3.3).
    b.max_judge_parse_failure = 0.1  # Share of LLM-judge prompts without a parseable verdict (rejected, cut, too long).
    b.max_missing_share = 0.2  # Share of a dimension's scores missing at a step (its judge failed; the reward drops them).
    b.min_golden_spearman = 0.6  # Judge vs labels on golden reference answers, per dimension (RubricRL: below 0.6 is unusable).
    b.min_audit_agreement = 0.6  # Training vs audit judge on eval responses: Spearman and quadratic kappa per dimension (the calibration floor).
    b.max_audit_gap_rise = 0.1  # Rise of a dimension's training-minus-audit score gap over the last audit.window audits (normalised units).
    return b


def audit_block() -> ml_collections.ConfigDict:
    """Audit of the judge on what the policy writes now (RubricRL §6.2, issue 23 §1; train/audit.py): at every eval, a
    fixed sample of the eval responses is scored again by another judge on the LLM dimensions (audit/* metrics, alerts
    in the monitor block)."""
    b = ml_collections.ConfigDict()
    b.judge = judge_block()  # The audit judge: any judge spec (configs/judges/*.py); checkpoint "" with backend jax = no audit.
    b.rubric = ""  # Rubric whose LLM dimensions the audit judge reads (the anchors it was calibrated on); "" = each row's own.
    b.sample_size = 32  # Eval responses audited per eval: the same seeded subset every time (all when fewer).
    b.window = 5  # Audits behind audit/gap/<d>/rise: the gap minus the smallest gap of the previous `window` audits.
    return b


def checkpoint_block() -> ml_collections.ConfigDict:
    """When checkpoints are saved and how many are kept."""
    b = ml_collections.ConfigDict()
    b.every_steps = 10  # Save every N GRPO steps (and at the end and on SIGTERM).
    b.keep = 3  # Checkpoints kept (the newest ones).
    b.keep_best = True  # Also save at every eval and keep the best-evaluated GRPO checkpoint (QuRL reports it).
    return b


def export_block() -> ml_collections.ConfigDict:
    """Export of the policy as a Hugging Face directory at the end of a run."""
    b = ml_collections.ConfigDict()
    b.at_end = False  # Write the policy to <workdir>/export as a HF directory (transformers, vLLM).
    b.which = "latest"  # At the end: the final policy ("latest") or the best-evaluated checkpoint ("best").
    return b


def qurl_block() -> ml_collections.ConfigDict:
    """experiments.build_rubrics: QuRL case-wise rubric construction (rubric_jax/qurl). The construction LLM is
    `model` (QuRL distils with Qwen2.5-7B); the judge that scores candidates is `judge` (empty: `model`)."""
    b = ml_collections.ConfigDict()
    b.top_k = 5  # Documents kept per question after the quality re-rank (QuRL §3.1); 0 = from the question alone.
    b.retrieval_pool = 20  # BM25 candidates re-ranked by the quality prior (click-through in QuRL §3.1).
    b.min_relevance = 0.5  # Pool floor: BM25 score >= this fraction of the best (a prior never promotes noise).
    b.bm25_k1 = 1.5  # BM25 term-frequency saturation (Lucene default 1.2; 1.5 as in bm25s).
    b.bm25_b = 0.75  # BM25 length normalisation (Robertson & Zaragoza).
    b.max_document_chars = 8000  # Document text read for its meta-description (QuRL: pages exceed 100k tokens).
    b.meta_max_words = 150  # Length asked of a meta-description (QuRL §3.2: short, information-dense).
    b.meta_max_new_tokens = 384  # Token budget of a meta-description; cut off = invalid, retried.
    b.num_candidates = 4  # K candidate rubric sets per question (QuRL §3.3 filter).
    b.min_criteria = 3  # Fewest criteria a candidate may have.
    b.max_criteria = 7  # Most criteria of a candidate and of R*(q) (RubricRL §2.3: at most ~7).
    b.max_points = 5  # Most points of one criterion (QuRL example: "clarity and logical flow (2 points)").
    b.rubric_max_new_tokens = 2048  # Token budget of one candidate rubric (JSON).
    b.num_answers = 4  # Sampled answers each candidate scores in the filter.
    b.answer_max_new_tokens = 1024  # Token budget of one sampled answer.
    b.max_retries = 2  # Re-prompt rounds for invalid meta-descriptions and candidates.
    b.min_valid_answers = 3  # A candidate needs this many usable judge scores to be judged at all.
    b.min_std = 0.05  # Drop a candidate whose reward std over the answers is below this (QuRL §3.3 filter).
    b.min_spread = 0.1  # Drop a candidate whose reward max - min over the answers is below this.
    b.merge_threshold = 0.5  # Two criteria are one when description trigram Jaccard >= this (or ids are equal).
    b.min_support = 2  # R*(q) keeps criteria recurring in this many kept sets (capped at the kept count).
    b.questions_per_batch = 32  # Questions per batch: one generate call per round each; resume unit.
    b.sampler = "temperature(0.7)"  # Sampler of every construction call (retries need fresh samples).
    b.generator = "model"  # Who writes meta-descriptions, rubrics and answers: model (config.model, in process) | judge (config.judge's OpenAI-compatible endpoint, backend=openai).
    return b


def log_block() -> ml_collections.ConfigDict:
    """What a run writes beside its metrics."""
    b = ml_collections.ConfigDict()
    b.samples_per_step = 4  # Responses written to samples.jsonl per step.
    return b


def sampler_block(sampler: str = "greedy", max_new_tokens: int = 256) -> ml_collections.ConfigDict:
    """How a command's model answers (experiments.generate, evaluate's policy, distill_judge's measurement)."""
    b = ml_collections.ConfigDict()
    b.sampler = sampler  # rubric_jax.sampling: greedy, temperature(t), topk(k[, t]), nucleus(p[, t]).
    b.max_new_tokens = max_new_tokens  # Answer budget in tokens.
    return b


def decode_block() -> ml_collections.ConfigDict:
    """A model loaded for decoding only (experiments.generate): its decode layout over every local device, and dtypes."""
    b = ml_collections.ConfigDict()
    b.tensor = 1  # Consecutive devices splitting each weight (tensor parallel; must divide the heads); the rest hold replicas.
    b.param_dtype = "auto"  # Weights dtype: auto (bfloat16 on accelerators, float32 on CPU), float32, bfloat16.
    b.compute_dtype = "auto"  # Activation dtype, same choices.
    return b


def base_config() -> ml_collections.ConfigDict:
    """An experiment's full set of keys (experiments.run, sweep, build_rubrics): experiment files change values,
    never add keys (the config is locked)."""
    c = ml_collections.ConfigDict()
    c.seed = 0  # Seeds parameter init, data order, sampling and judging.
    c.stages = ("sft", "grpo")  # Stages run in order; eval runs inside grpo (before, every N steps, end).
    c.model = model_block()
    c.judge = judge_block()  # The LLM judge: the same block as configs/judges/*.py and every command's --judge.
    c.reward = reward_block()
    c.mesh = mesh_block()
    c.mesh.rollout = rollout_block()
    c.data = data_block()
    c.sft = sft_block()
    c.rl = rl_block()
    c.eval = eval_block()
    c.monitor = monitor_block()
    c.audit = audit_block()
    c.checkpoint = checkpoint_block()
    c.export = export_block()
    c.qurl = qurl_block()
    c.log = log_block()
    return c

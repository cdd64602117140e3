"""Config blocks shared by every experiment file (each experiment's get_config starts from these).

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


def base_config() -> ml_collections.ConfigDict:
    """The full set of keys; experiment files change values, never add keys (the config is locked)."""
    c = ml_collections.ConfigDict()
    c.seed = 0  # Seeds parameter init, data order, sampling and judging.
    c.stages = ("sft", "grpo")  # Stages run in order; eval runs inside grpo (before, every N steps, end).

    c.model = ml_collections.ConfigDict()
    c.model.checkpoint = ""  # Local HF directory to load; empty = random init from `config_json`.
    c.model.config_json = ""  # HF config.json for a random init (the tiny default ships one).
    c.model.tokenizer = ""  # Tokenizer directory (AutoTokenizer); empty = the checkpoint directory.
    c.model.param_dtype = "float32"  # Parameters and optimizer state dtype.
    c.model.compute_dtype = "float32"  # Activation dtype ("bfloat16" on accelerators).
    c.model.remat = False  # Recompute layer activations in the backward pass (saves memory).
    c.model.scan_layers = True  # lax.scan over the stacked layers (flat compile time).
    # Attention of the teacher-forced forwards (GRPO/SFT updates, log-probs; decoding always uses einsum):
    # auto (cudnn on NVIDIA GPUs in bf16, einsum elsewhere), einsum (ours), xla or cudnn (jax.nn.dot_product_attention).
    c.model.attention = "auto"

    c.judge = judge_block()  # The LLM judge: the same block as configs/judges/*.py and every command's --judge.

    # What scores rollouts: rubrics (rule and LLM judges, above) or a scalar reward model (rubric_jax/judges/
    # reward_model.py; QuRL's "w/ RLHF reward model" ablation, which uses internlm2-7b-reward).
    c.reward = ml_collections.ConfigDict()
    c.reward.source = "rubric"  # "rubric" (the rows' rubrics) or "reward_model" (reward.model_checkpoint).
    # A row whose rule gate failed (reward 0 whatever else it scores) sends no LLM dimension to the judge (docs/judges.md,
    # "Gates first"; judges/reward.py): rewards unchanged, 10% of the tiny default's judge prompts spared (benchmarks/RESULTS.md).
    c.reward.gates_first = True
    c.reward.model_checkpoint = ""  # Local HF Qwen2/Llama *ForSequenceClassification directory with one label.
    c.reward.model_dtype = "float32"  # Reward-model weights and activations: float32 or bfloat16.
    c.reward.model_max_len = 4096  # Longest chat (question + response, RM tokens) scored; longer rows get no reward (counted).
    c.reward.model_batch_size = 64  # Rows per reward-model forward call (bounds attention memory).
    c.reward.model_center = 0.0  # reward = sigmoid((logit - center) / scale): the scalar mapped to (0, 1).
    c.reward.model_scale = 1.0  # Logit units per unit of the sigmoid's argument (> 0).

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1  # Data-parallel axis size.
    c.mesh.fsdp = -1  # Fully-sharded axis size (-1: all devices left).
    c.mesh.tensor = 1  # Tensor-parallel axis size.
    # Decode layout of rollouts over the same devices (verl's 3D-HybridEngine idea; judges have their own, judge.tensor): the
    # policy is resharded to it once per rollout, so no decode step all-gathers an FSDP weight.
    c.mesh.rollout = ml_collections.ConfigDict()
    c.mesh.rollout.tensor = 1  # Tensor-parallel group (consecutive devices of one host); the rest replicate. Must divide the heads and KV heads.
    c.mesh.rollout.param_dtype = "compute"  # Policy weights while decoding: compute (= model.compute_dtype), float32 or bfloat16.

    c.data = ml_collections.ConfigDict()
    c.data.train = ""  # jsonl of training questions ({"id","question",...}), or tfds:NAME[:SPLIT] (split "train").
    c.data.eval = ""  # jsonl of held-out questions, or tfds:NAME[:SPLIT] (split "eval"; ":golden" for the golden set).
    c.data.tfds_dir = ""  # Directory holding the tfds datasets named by tfds:NAME (experiments.prepare_data --out).
    c.data.sft = ""  # jsonl of cold-start SFT pairs ({"prompt","response"}).
    c.data.rubric = ""  # Rubric file (YAML/JSON) shared by every question; rows may add their own.
    # Golden set (issue 7 §4): held-out questions with reference answers (+ optional "labels" of them), never trained on.
    c.data.golden = ""  # jsonl of golden questions, or tfds:NAME[:SPLIT] (split "golden"); empty = none. Scored at every eval.
    c.data.golden_max_jaccard = 0.7  # Refuse golden questions whose char 3-gram Jaccard with a training one reaches this (prepare_data's dedup threshold).
    # Calibration (experiments.calibrate): a fitted per-dimension score correction, RubricRL §3.3 "后处理校准".
    c.data.rubric_correction = ""  # Score correction (JSON/YAML) applied to judge scores; empty = none; in the hash.
    c.data.max_prompt_len = 128  # Prompts are left-padded to a bucket up to this length.
    c.data.length_buckets = 3  # Power-of-two padding widths per length (max, max/2, ...); each compiles once.

    c.sft = ml_collections.ConfigDict()
    c.sft.lr = 1e-6  # QuRL cold start: lr 1e-6.
    c.sft.batch_size = 16  # QuRL cold start: batch 16.
    c.sft.epochs = 2  # QuRL cold start: 2 epochs.
    c.sft.warmup_steps = 0  # Linear warmup steps.
    c.sft.schedule = "constant"  # constant or cosine after warmup.
    c.sft.weight_decay = 0.0  # AdamW weight decay.
    c.sft.grad_clip = 1.0  # Global-norm gradient clipping.
    c.sft.max_response_len = 256  # Longest SFT response in tokens (responses are padded to power-of-two buckets).

    c.rl = ml_collections.ConfigDict()
    c.rl.lr = 1e-6  # RubricRL §4.3 and QuRL: 1e-6 (drop to 5e-7 if the reward oscillates).
    c.rl.steps = 100  # GRPO steps (rollout batches).
    c.rl.questions_per_step = 32  # QuRL: global batch 32 questions.
    c.rl.group_size = 8  # Samples per question (RubricRL §4.3, QuRL: 8).
    c.rl.max_new_tokens = 256  # Response budget per sample.
    c.rl.sampler = "temperature(1.0)"  # "temperature(t)" only: every log-prob is of softmax(logits/t) (TRL, verl).
    c.rl.beta = 0.04  # KL coefficient (RubricRL §4.3: 0.01-0.05); 0 skips the reference model.
    c.rl.kl_estimator = "k3"  # k1, k2 or k3 (Schulman's estimators).
    c.rl.clip_low = 0.2  # PPO clip below 1 (RubricRL §4.3: 0.2-0.3).
    c.rl.clip_high = 0.28  # Clip above 1 (DAPO clip-higher).
    c.rl.loss_aggregation = "seq_mean_token_mean"  # GRPO; or token_mean (DAPO), seq_mean_token_sum_norm (Dr. GRPO).
    c.rl.advantage_scaling = "group"  # group std (GRPO), batch std, or none (Dr. GRPO).
    c.rl.advantage_eps = 1e-6  # Added to the std before dividing (RubricRL §5.3 pseudo-code).
    c.rl.updates_per_batch = 1  # Optimizer updates per rollout batch (importance ratio vs behaviour).
    # Behaviour log-probs: False = the sampler's own; True = recomputed teacher-forced with the params that
    # sampled, once per rollout (verl's recompute; costs one forward). Either way `logprob_gap/mean` logs
    # mean |teacher-forced - sampler| on the first update: ~3e-7 in float32 on CPU, the bf16 decode drift on GPU.
    c.rl.recompute_old_logprobs = False
    c.rl.micro_batches = 1  # Gradient accumulation micro-batches per update, of whole groups (must divide questions_per_step).
    c.rl.warmup_steps = 0  # Linear warmup steps.
    c.rl.schedule = "constant"  # constant or cosine after warmup.
    c.rl.weight_decay = 0.0  # AdamW weight decay.
    c.rl.grad_clip = 1.0  # Global-norm gradient clipping.
    c.rl.max_nan_streak = 5  # Consecutive skipped (NaN/Inf) updates before the run stops.
    c.rl.missing_scores = "renormalize"  # "renormalize" over present dimensions, or "drop" the sample (no loss).
    # The multi-dimension recipe (issue 21; every option off by default: the default run is GRPO as above).
    c.rl.advantage = "sum_then_normalise"  # or "per_dimension": each dimension normalised in its group, weighted, whitened (GDPO, arXiv 2601.05242).
    c.rl.overlong_buffer = 0  # DAPO soft overlong punishment over the last N tokens before max_new_tokens (DAPO: 4096 of 20480); 0 = off.
    c.rl.overlong_penalty = 1.0  # Reward penalty at max_new_tokens, falling linearly from 0 over the buffer (DAPO: 1).
    c.rl.mask_truncated = False  # DAPO overlong filtering: responses cut at max_new_tokens get no loss.
    c.rl.importance_level = "token"  # or "sequence": GSPO's length-normalised sequence ratio (arXiv 2507.18071; TRL importance_sampling_level).
    c.rl.clip_ratio_c = 0.0  # Dual-clip PPO bound c > 1 for negative advantages (arXiv 1912.09729; verl default 3); 0 = off.
    c.rl.kl_cap = 0.0  # Clip each token's KL estimate to [-cap, cap] (verl clips k3 to 10); 0 = off.
    # Truncated importance sampling between trainer and sampler log-probs, weight min(pi_old/pi_sampler, C) (TRL
    # vllm_importance_sampling_cap, verl tis_imp_ratio_cap); needs recompute_old_logprobs; 0 = off.
    c.rl.behaviour_correction_cap = 0.0
    # DAPO dynamic sampling (arXiv 2503.14476 §3.2; train/dynamic.py): more rounds of questions until every group of
    # the batch has a reward spread above the threshold; shapes stay those of one round (off by default).
    c.rl.dynamic_sampling = False  # Keep only groups whose rewards vary; refill from the next questions.
    c.rl.dynamic_sampling_min_spread = 0.0  # A group is kept when max - min of its rewards exceeds this (rubric rewards are continuous).
    c.rl.dynamic_sampling_max_rounds = 2  # Most extra sampling rounds per step; then the least-flat dropped groups fill the batch.
    # RubricRL §4.3: lower the learning rate (1e-6 -> 5e-7) when the reward oscillates (train/oscillation.py).
    c.rl.lr_on_oscillation = False  # Multiply the lr by lr_drop_factor when the windowed reward oscillates; off by default.
    c.rl.oscillation_window = 20  # GRPO steps of reward/mean in the oscillation test (and between two drops).
    c.rl.oscillation_ratio = 4.0  # Oscillating: path length / displacement of the window's rewards at least this.
    c.rl.oscillation_min_swing = 0.02  # ... and a mean step-to-step change of at least this (a quiet reward never drops).
    c.rl.lr_drop_factor = 0.5  # Each drop multiplies the lr by this (RubricRL: 1e-6 -> 5e-7).
    c.rl.min_lr_factor = 0.25  # No drop below this fraction of the configured lr.
    c.rl.dynamic_weights = False  # Move weight from saturated to discriminating dimensions (RubricRL §2.3).
    c.rl.dynamic_weights_window = 20  # Steps of score statistics behind the saturation test.

    c.eval = ml_collections.ConfigDict()
    c.eval.every_steps = 10  # Eval on the held-out set every N GRPO steps (and before/after).
    c.eval.max_questions = 64  # Held-out questions per eval.
    c.eval.sampler = "greedy"  # Eval sampler.
    c.eval.max_new_tokens = 256  # Response budget of an eval answer (its own: rl.max_new_tokens is the rollouts').

    # Reward-hacking monitors (RubricRL §6, issue 7 §3): written every GRPO step (train/monitors.py); a value past
    # its threshold appends to <workdir>/alerts.jsonl and logs "alert step N: template share 0.61 > 0.40".
    c.monitor = ml_collections.ConfigDict()
    # The template share and reward-length Spearman of one step depend on which questions it drew: their alerts
    # compare the mean of the last `window_steps` steps (monitor/<m>/window_mean) with the threshold.
    c.monitor.window_steps = 10  # GRPO steps behind the windowed alerts (template share, reward-length, zero-std, saturation rise, redundancy; 1 = per step).
    c.monitor.max_template_share = 0.4  # Share of responses in a 首先…其次…最后 / first…second…finally template (RubricRL: 12% -> 67% while reward rose).
    c.monitor.max_length_drift = 1.0  # Mean response tokens / first GRPO step's - 1 (1.0 = doubled; inf = never).
    # Saturation (RubricRL §2.3 刷满, §6.3 collapse): penalty and gate dimensions sit at their top level from step 1 by design,
    # so the alert reads the rise of a dimension's window-mean share of top scores over the run's first window.
    c.monitor.max_saturation_rise = 0.5  # Rise of a dimension's top-level share since steps 1-window_steps (window means).
    c.monitor.max_zero_std_frac = 0.9  # Window mean share of groups whose rewards are all equal: no GRPO signal (RubricRL §4.3, §6.3).
    c.monitor.max_redundancy = 0.9  # Spearman of two dimensions over the window's rollouts, alert at or above (RubricRL §2.1 MECE).
    c.monitor.max_reward_length_corr = 0.5  # Spearman of reward vs response length within a step (length bias, RubricRL §3.3).
    c.monitor.max_judge_parse_failure = 0.1  # Share of LLM-judge prompts without a parseable verdict (rejected, cut, too long).
    c.monitor.max_missing_share = 0.2  # Share of a dimension's scores missing at a step (its judge failed; the reward drops them).
    c.monitor.min_golden_spearman = 0.6  # Judge vs labels on golden reference answers, per dimension (RubricRL: below 0.6 is unusable).
    c.monitor.min_audit_agreement = 0.6  # Training vs audit judge on eval responses: Spearman and quadratic kappa per dimension (the calibration floor).
    c.monitor.max_audit_gap_rise = 0.1  # Rise of a dimension's training-minus-audit score gap over the last audit.window audits (normalised units).

    # Audit of the judge on what the policy writes now (RubricRL §6.2, issue 23 §1; train/audit.py): at every eval, a fixed
    # sample of the eval responses is scored again by another judge on the LLM dimensions (audit/* metrics, alerts above).
    c.audit = ml_collections.ConfigDict()
    c.audit.judge = judge_block()  # The audit judge: any judge spec (configs/judges/*.py); checkpoint "" with backend jax = no audit.
    c.audit.rubric = ""  # Rubric whose LLM dimensions the audit judge reads (the anchors it was calibrated on); "" = each row's own.
    c.audit.sample_size = 32  # Eval responses audited per eval: the same seeded subset every time (all when fewer).
    c.audit.window = 5  # Audits behind audit/gap/<d>/rise: the gap minus the smallest gap of the previous `window` audits.

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 10  # Save every N GRPO steps (and at the end and on SIGTERM).
    c.checkpoint.keep = 3  # Checkpoints kept (the newest ones).
    c.checkpoint.keep_best = True  # Also save at every eval and keep the best-evaluated GRPO checkpoint (QuRL reports it).

    c.export = ml_collections.ConfigDict()
    c.export.at_end = False  # Write the policy to <workdir>/export as a HF directory (transformers, vLLM).
    c.export.which = "latest"  # At the end: the final policy ("latest") or the best-evaluated checkpoint ("best").

    # experiments.build_rubrics: QuRL case-wise rubric construction (rubric_jax/qurl). The construction LLM is
    # `model` (QuRL distils with Qwen2.5-7B); the judge that scores candidates is `judge` (empty: `model`).
    c.qurl = ml_collections.ConfigDict()
    c.qurl.top_k = 5  # Documents kept per question after the quality re-rank (QuRL §3.1); 0 = from the question alone.
    c.qurl.retrieval_pool = 20  # BM25 candidates re-ranked by the quality prior (click-through in QuRL §3.1).
    c.qurl.min_relevance = 0.5  # Pool floor: BM25 score >= this fraction of the best (a prior never promotes noise).
    c.qurl.bm25_k1 = 1.5  # BM25 term-frequency saturation (Lucene default 1.2; 1.5 as in bm25s).
    c.qurl.bm25_b = 0.75  # BM25 length normalisation (Robertson & Zaragoza).
    c.qurl.max_document_chars = 8000  # Document text read for its meta-description (QuRL: pages exceed 100k tokens).
    c.qurl.meta_max_words = 150  # Length asked of a meta-description (QuRL §3.2: short, information-dense).
    c.qurl.meta_max_new_tokens = 384  # Token budget of a meta-description; cut off = invalid, retried.
    c.qurl.num_candidates = 4  # K candidate rubric sets per question (QuRL §3.3 filter).
    c.qurl.min_criteria = 3  # Fewest criteria a candidate may have.
    c.qurl.max_criteria = 7  # Most criteria of a candidate and of R*(q) (RubricRL §2.3: at most ~7).
    c.qurl.max_points = 5  # Most points of one criterion (QuRL example: "clarity and logical flow (2 points)").
    c.qurl.rubric_max_new_tokens = 2048  # Token budget of one candidate rubric (JSON).
    c.qurl.num_answers = 4  # Sampled answers each candidate scores in the filter.
    c.qurl.answer_max_new_tokens = 1024  # Token budget of one sampled answer.
    c.qurl.max_retries = 2  # Re-prompt rounds for invalid meta-descriptions and candidates.
    c.qurl.min_valid_answers = 3  # A candidate needs this many usable judge scores to be judged at all.
    c.qurl.min_std = 0.05  # Drop a candidate whose reward std over the answers is below this (QuRL §3.3 filter).
    c.qurl.min_spread = 0.1  # Drop a candidate whose reward max - min over the answers is below this.
    c.qurl.merge_threshold = 0.5  # Two criteria are one when description trigram Jaccard >= this (or ids are equal).
    c.qurl.min_support = 2  # R*(q) keeps criteria recurring in this many kept sets (capped at the kept count).
    c.qurl.questions_per_batch = 32  # Questions per batch: one generate call per round each; resume unit.
    c.qurl.sampler = "temperature(0.7)"  # Sampler of every construction call (retries need fresh samples).
    c.qurl.generator = "model"  # Who writes meta-descriptions, rubrics and answers: model (config.model, in process) | judge (config.judge's OpenAI-compatible endpoint, backend=openai).

    c.log = ml_collections.ConfigDict()
    c.log.samples_per_step = 4  # Responses written to samples.jsonl per step.
    return c

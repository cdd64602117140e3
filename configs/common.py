"""Config blocks: small functions each returning one ConfigDict block (model, judge, mesh, data, rl, ...) that the
experiment files (configs/tiny.py, ...) and the command configs (configs/commands/*.py) compose.

The experiment's blocks come from their typed blocks (rubric_jax/train/blocks.py: every key's type, default, bounds
and one-line meaning with its source); the judge, qurl and command blocks are written here, every field with a
one-line comment giving its meaning and, where it comes from a paper, the source. Dependent values are derived in
code after command-line overrides, never here.
"""

from __future__ import annotations

import ml_collections

from rubric_jax.config_boundary import config_dict
from rubric_jax.train import blocks


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
    """config.model: train/blocks.py ModelBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.ModelBlock)


def reward_block() -> ml_collections.ConfigDict:
    """config.reward: train/blocks.py RewardBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.RewardBlock)


def mesh_block() -> ml_collections.ConfigDict:
    """A command's mesh axis sizes (rubric_jax/sharding.py MeshConfig: experiments.evaluate's policy); an experiment's
    mesh is train/blocks.py ExperimentMeshBlock."""
    b = ml_collections.ConfigDict()
    b.data = 1  # Data-parallel axis size.
    b.fsdp = -1  # Fully-sharded axis size (-1: all devices left).
    b.tensor = 1  # Tensor-parallel axis size.
    return b


def rollout_block() -> ml_collections.ConfigDict:
    """config.mesh.rollout: train/blocks.py RolloutMeshBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.RolloutMeshBlock)


def data_block() -> ml_collections.ConfigDict:
    """config.data: train/blocks.py DataBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.DataBlock)


def sft_block() -> ml_collections.ConfigDict:
    """config.sft: train/blocks.py SFTBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.SFTBlock)


def rl_block() -> ml_collections.ConfigDict:
    """config.rl: train/blocks.py RLBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.RLBlock)


def eval_block() -> ml_collections.ConfigDict:
    """config.eval: train/blocks.py EvalBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.EvalBlock)


def monitor_block() -> ml_collections.ConfigDict:
    """config.monitor: train/blocks.py MonitorBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.MonitorBlock)


def audit_block() -> ml_collections.ConfigDict:
    """config.audit: train/blocks.py AuditBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.AuditBlock, judge=judge_block())


def checkpoint_block() -> ml_collections.ConfigDict:
    """config.checkpoint: train/blocks.py CheckpointBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.CheckpointBlock)


def export_block() -> ml_collections.ConfigDict:
    """config.export: train/blocks.py ExportBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.ExportBlock)


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
    """config.log: train/blocks.py LogBlock's keys and defaults (meanings, bounds, rules)."""
    return config_dict(blocks.LogBlock)


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
    """An experiment's full set of keys (experiments.run, sweep, build_rubrics; train/blocks.py ExperimentConfig):
    experiment files change values, never add keys (the config is locked)."""
    return config_dict(blocks.ExperimentConfig, judge=judge_block(), audit=audit_block(), qurl=qurl_block())
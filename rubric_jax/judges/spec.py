"""The judge specification: one typed, validated description of the LLM judge that every command uses.

The config block (configs/common.py `judge_block()`, or a file in configs/judges/) becomes a frozen `JudgeSpec`
through `JudgeSpec.from_config(block, where)`; `where` is how the user wrote the block ("--judge" on the
standalone commands, "config.judge" in an experiment), so a bad value is one line naming the field as typed
(`--judge.max_new_tokens=0: expected an integer >= 1`). judges/loading.py loads a spec's judges (`load_judges`,
`load_cascade`: the refining judge of its `cascade`, a judge config file whose spec nests here; judges/cascade.py)
and its verdict store; this module loads nothing, so it imports no judge engine (no import cycle).

`judge_hash(spec)` identifies what decides a verdict: the verdict fields (not batch_size, tensor or the
calibration settings, which change neither prompts nor answers; with a cascade, the refining judge's own hash
stands for it), the prompt templates' version
(prompts.PROMPT_VERSION) and each checkpoint's weights identity (`weights_identity`: config.json, the
safetensors headers and sizes, a few KiB at both ends of every tensor, and the tokenizer files; reads about
8 KiB per tensor, so an 8B judge costs milliseconds, never its gigabytes). A path is not part of the hash:
the same weights copied elsewhere are the same judge, and retrained weights in the same directory are not.
A judge sharing the policy's LoRA base (share_policy_base) has no checkpoint: its hash holds the base's identity
with the tokenizer it reads (`policy_base`, set by the experiment), so its verdicts are never mixed with another
judge's.
A served judge's (backend=openai) hash also holds the weights identity its endpoint reports for the model behind
judge.model (experiments.serve reports one); an endpoint that reports none is fingerprinted by the verdict store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rubric_jax import counts, schema
from rubric_jax.judges.prompts import GROUP_PROMPT_VERSION, PROMPT_VERSION
from rubric_jax.sampler_names import parse_sampler
from rubric_jax.schema import setting

MODES = ("per_dimension", "all_criteria")  # one prompt per (response, LLM dimension) | one per response (QuRL)
BENCHMARK_MODE = "benchmark"  # experiments.evaluate only: the benchmark's own prescribed mode
PROMPTS = ("full", "compact")  # prompts.single_prompt / multi_prompt, or a distilled judge's compact_single_prompt
ENSEMBLES = ("mean", "agreement")  # llm_judge.combine_judges
# prompts.py: the criterion before the response (each prompt prefilled whole) | the response first, the criterion
# last, a response's shared part prefilled once and continued by each of its criteria (llm_judge, per_dimension only)
# | group (listwise, OpenPipe RULER; TRL #4707): one prompt per (group, criterion) scoring the group's responses
# side by side, in a seeded shuffled order per sample (prompts.group_prompt; per_dimension and the full prompt only).
LAYOUTS = ("criteria_first", "shared_prefix", "group")
# Fields hashed only when they differ from their default, so judge hashes (stores, calibration reports) made before
# the field existed stay valid for the judge they described.
HASHED_OFF_DEFAULT = ("layout", "share_policy_base")
BACKENDS = ("jax", "openai")  # in-process sampling.generate | an OpenAI-compatible HTTP endpoint (judges/http_backend.py)
ENDPOINTS = ("chat", "completions")  # /v1/chat/completions (messages) | /v1/completions (a locally rendered prompt)
# The endpoint fields: read only with backend=openai, and hashed only then (a jax judge's hash is unchanged by them).
HTTP_FIELDS = ("base_url", "model", "api_key_env", "endpoint", "max_concurrency", "timeout_s", "max_retries_http",
               "outage_s", "requests_per_minute", "tokens_per_minute")
# Fields that change no verdict: how many prompts share a generate call, how the weights are split over
# devices, which calibration report is checked and where verdicts are stored. Every other field enters judge_hash.
# The API key's variable name, concurrency, timeouts and rate limits change no verdict either.
NOT_HASHED = ("checkpoints", "batch_size", "tensor", "calibration", "require_calibration", "store", "store_rollouts",
              "api_key_env", "max_concurrency", "timeout_s", "max_retries_http", "outage_s", "requests_per_minute",
              "tokens_per_minute", "policy_base")
# The cascade's fields (RubricRL §7: a small judge screens, a larger one refines; judges/cascade.py): hashed only
# with a cascade, whose entry in the hash is the refining judge's own hash (a judge without one keeps its hash).
CASCADE_FIELDS = ("cascade", "cascade_spread", "cascade_margin", "cascade_thresholds")
# Tokenizer and chat-template files whose content changes the prompts a judge reads.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                   "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.json", "merges.txt")
TENSOR_EDGE_BYTES = 4096  # bytes hashed at each end of every tensor (weights_identity)
MAX_PROMPT_TOKENS = 4096  # longest judge prompt sent (capped by the judge's context); longer ones are counted


def prompt_budget(context: int, max_new_tokens: int, limit: int = MAX_PROMPT_TOKENS) -> int:
    """The longest prompt a judge of `context` positions reads while leaving room for its `max_new_tokens`-token
    answer, at most `limit` (llm_judge.load_judge, the endpoint judge of judges/loading.py and the dry run all use
    it); a ValueError when the answer leaves no room."""
    if context - max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room in its {context}-token context")
    return min(limit, context - max_new_tokens)


class JudgeSpecError(schema.BlockError):
    """A bad judge field: `field` (the config block's name), `value` and why; str() names `<where>.<field>`."""

    def __init__(self, field: str, value: Any, why: str, where: str = "judge"):
        self.field = field
        super().__init__(f"{where}.{field}", value, why)


@dataclasses.dataclass(frozen=True)
class JudgeSpec(schema.Block):
    """The judge block (configs/common.py `judge_block()` is generated from it): one block with one set of defaults
    for experiments.run (config.judge) and the --judge of score, calibrate, evaluate, distill_judge and
    build_rubrics; judge files in configs/judges/ start from it. Fields marked [hash] change verdicts and enter the
    judge hash. Each meaning gives its source: the paper section it follows, or the module that implements it
    (docs/judges.md has the same table). The block's `checkpoint` is comma-separated and its `cascade` a judge
    config file's path (`from_config`, `to_block`)."""

    checkpoints: tuple[str, ...] = setting(
        (), "[hash: weights identity] Local HF dir(s) of the judge, comma-separated for an ensemble; \"\" = rule "
        "dimensions only.", key="checkpoint")
    ensemble: str = setting("mean", "[hash] How several judges combine: mean, or agreement weighting (RubricRL §6.2).",
                            choices=ENSEMBLES)
    mode: str = setting(
        "per_dimension", "[hash] per_dimension: one prompt per (response, LLM dimension) (RubricRL §3); all_criteria: "
        "one prompt per response over all its LLM criteria (QuRL); benchmark: the benchmark's prescribed one "
        "(experiments.evaluate only).")
    prompt: str = setting("full", "[hash] full (rules, question, criteria), or compact: a distilled judge's short "
                          "prompt (per_dimension only).", choices=PROMPTS)
    layout: str = setting(
        "criteria_first", "[hash, when not the default] criteria_first: each prompt prefilled whole, the criterion "
        "before the response; shared_prefix: the response first and the criterion last, a response's shared part "
        "prefilled once for all its LLM dimensions (per_dimension only; its own calibration; cost and agreement in "
        "docs/judges.md, \"Shared-prefix judging\"); group: listwise (OpenPipe RULER; TRL #4707), one prompt per "
        "(group of responses to one question, criterion), the responses shuffled per sample (per_dimension, "
        "prompt=full; docs/judges.md, \"Group judging\").", choices=LAYOUTS)
    samples: int = setting(3, "[hash] Judge samples per item, combined by the median (RubricRL §3.3).", bounds=(1, 64))
    shuffle_anchors: bool = setting(True, "[hash] A fresh anchor order per judge sample (RubricRL §3.3).")
    max_retries: int = setting(2, "[hash] Re-prompt rounds for unparseable answers before a score is missing "
                               "(judges/llm_judge.py rounds).", bounds=(0, 10))
    max_new_tokens: int = setting(64, "[hash] Judge answer budget in tokens (a verdict cut at it is invalid: "
                                  "judges/llm_judge.py).", bounds=(1, counts.TOKENS))
    sampler: str = setting("temperature(0.7)", "[hash] Judge sampler (rubric_jax.sampling: greedy, temperature(t), "
                           "topk, nucleus).")
    param_dtype: str = setting("auto", "[hash] Judge weights dtype (rubric_jax/loader.py): auto (bfloat16 on "
                               "accelerators, float32 on CPU), float32, bfloat16.", choices=counts.DTYPE_CHOICES)
    compute_dtype: str = setting("auto", "[hash] Judge activation dtype, same choices.", choices=counts.DTYPE_CHOICES)
    batch_size: int = setting(0, "Most judge prompts per generate call (bounds its KV cache; 0 = a whole round at "
                              "once; judges/llm_judge.py).", bounds=(0, 1 << 16))
    tensor: int = setting(1, "Consecutive devices splitting each judge weight (its decode tensor-parallel group: "
                          "sharding.decode_layout); the other devices hold replicas.", bounds=(1, counts.DEVICES))
    calibration: str = setting(
        "", "A calibration report.json (experiments.calibrate; RubricRL §3.2: Spearman/kappa vs human labels, flagged "
        "below 0.6) checked against this (rubric, judge) pair at start-up (rubric_jax/calibration/pinning.py); \"\" = "
        "none.")
    require_calibration: bool = setting(False, "True: an uncalibrated (rubric, judge) pair or a flagged dimension "
                                        "stops the command (exit 2).")
    store: str = setting("", "Verdict store (judges/store.py: SQLite on a local disk) of judge answers, keyed by the "
                         "judge hash; \"\" = none.")
    store_rollouts: bool = setting(False, "Policy responses read/write the store too (off: they never repeat; golden "
                                   "references always do).")
    backend: str = setting(
        "jax", "[hash, openai only] Where verdicts come from (docs/judges.md, \"Judges anywhere\"): jax = the "
        "checkpoint in this process; openai = an OpenAI-compatible endpoint (an API, vLLM/SGLang, or "
        "experiments.serve), checkpoint then optional (its tokenizer). The endpoint fields below are "
        "judges/http_backend.py's.", choices=BACKENDS)
    base_url: str = setting("", "[hash] The endpoint's URL up to /v1, e.g. http://127.0.0.1:8000/v1 (backend=openai "
                            "only).")
    model: str = setting("", "[hash] The served model's name, as GET <base_url>/models lists it (backend=openai only).")
    api_key_env: str = setting("", "NAME of the environment variable holding the API key (\"\" = no key); the key is "
                               "never stored.")
    endpoint: str = setting("chat", "[hash] chat: /v1/chat/completions; completions: /v1/completions with the "
                            "checkpoint's chat template.", choices=ENDPOINTS)
    max_concurrency: int = setting(8, "Judge requests in flight at once, per batch (rl.off_policy_steps=1 may judge "
                                      "two batches at once: docs/training.md).", bounds=(1, 1024))
    timeout_s: float = setting(60.0, "Seconds one request may take before it is retried.")
    max_retries_http: int = setting(5, "HTTP retries per request (exponential backoff with jitter, honouring "
                                    "Retry-After).", bounds=(0, 20))
    outage_s: float = setting(300.0, "Seconds an unreachable endpoint is waited for (then the command stops, "
                              "resumable); 0 = its prompts' scores go missing.")
    requests_per_minute: int = setting(0, "Request rate limit (0 = unlimited).", bounds=(0, 10**7))
    tokens_per_minute: int = setting(0, "Token rate limit: prompt + completion tokens, estimated before the answer "
                                     "(0 = unlimited).", bounds=(0, 10**10))
    cascade: JudgeSpec | None = setting(
        None, "[hash: the refining judge's own hash] Cascade (RubricRL §7 \"用更小的模型做初筛、大模型做精评\"; "
        "docs/judges.md, \"Cascade\"): this judge screens every item (one score of one response on one LLM "
        "dimension); a second judge re-judges only the uncertain ones, and its verdict replaces the first's. The "
        "path of the refining judge's config file (configs/judges/*.py); \"\" = none. The cascade_* fields are "
        "read (and hashed) only with a cascade.")
    cascade_spread: float = setting(0.0, "[hash] Escalate an item whose valid samples spread (max - min, [0, 1] "
                                    "scale) more than this.", bounds=(0.0, 1.0))
    cascade_margin: float = setting(
        0.0, "[hash] Escalate an item whose score (median, [0, 1] scale) lies within this of a decision: a gate "
        "dimension's failing score 0 (a gate failure is confirmed), or one of cascade_thresholds. An item without a "
        "verdict escalates.", bounds=(0.0, 1.0))
    cascade_thresholds: tuple[float, ...] = setting((), "[hash] Decision thresholds ([0, 1] scale) besides the "
                                                    "gates', e.g. (0.5,): met / not met.")
    share_policy_base: bool = setting(
        False, "[hash: the base's and its tokenizer's identity, when True] The judge is the policy's frozen base "
        "with the adapters off, "
        "run in-process from the training state's base (no checkpoint loaded, no judge weights kept: each rollout "
        "makes the base's decode copy as it makes the policy's) in the policy's decode layout and dtype: an experiment whose GRPO stage trains through LoRA only (issue 34; "
        "docs/training.md \"LoRA runs\"). checkpoint must be \"\".")
    # Not a config field: calibration's position probe lists anchors (and all_criteria criteria) reversed.
    reverse_order: bool = False
    # Not a config field: with share_policy_base, the policy base's identity with its tokenizer's and dtypes (set by
    # the experiment that shares it: train/experiment.py), hashed as the judge's weights identity.
    policy_base: str = ""

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except schema.BlockError as e:  # a spec made in code names `judge.<field>`; from_config names its `where`
            raise JudgeSpecError(e.key, e.value, e.why) from None

    def validate(self) -> None:
        """The rules between fields, the sampler's grammar and the endpoint's and cascade's fields."""
        problem = next(_problems(self), None)
        if problem is not None:
            raise schema.BlockError(*problem)

    @classmethod
    def from_values(cls, values: Mapping[str, Any], where: str = "judge") -> JudgeSpec:
        """The judge block nested in another block (an experiment's config.judge): `from_config`."""
        return cls.from_config(values, where)

    def to_values(self) -> dict[str, Any]:
        """The judge block's config form: `to_block`."""
        return self.to_block()

    @classmethod
    def from_config(cls, block: Mapping[str, Any], where: str = "judge", *, allow_benchmark: bool = False
                    ) -> JudgeSpec:
        """The spec of a judge config block (a ConfigDict or dict with exactly the judge_block() fields);
        `where` prefixes every error ("--judge" or "config.judge"). `mode=benchmark` only with
        `allow_benchmark` (experiments.evaluate), resolved later by `for_benchmark`."""
        values = dict(block.to_dict() if hasattr(block, "to_dict") else block)
        names = {schema.config_key(f) for f in schema.config_fields(cls)}
        unknown, missing = sorted(set(values) - names), sorted(names - set(values))
        if unknown or missing:
            problems = [f"unknown field(s) {unknown}"] * bool(unknown) + [f"missing field(s) {missing}"] * bool(missing)
            raise ValueError(f"{where}: " + "; ".join(problems))
        values["cascade"] = _cascade_spec(values["cascade"], where, allow_benchmark)
        if isinstance(values["cascade_thresholds"], list):
            values["cascade_thresholds"] = tuple(values["cascade_thresholds"])
        checkpoint = values.pop("checkpoint")
        if not isinstance(checkpoint, str):
            raise JudgeSpecError("checkpoint", checkpoint, "expected comma-separated directories, or '' for none",
                                 where)
        if values["mode"] == BENCHMARK_MODE and not allow_benchmark:
            raise JudgeSpecError("mode", BENCHMARK_MODE, "the benchmark's own prompt exists only in "
                                 f"experiments.evaluate; expected one of {MODES}", where)
        try:
            return cls(checkpoints=tuple(p.strip() for p in checkpoint.split(",") if p.strip()), **values)
        except JudgeSpecError as e:
            raise JudgeSpecError(e.field, e.value, e.why, where) from None

    @property
    def has_judge(self) -> bool:
        """Whether this spec judges LLM dimensions at all: a checkpoint in process, an endpoint, or the policy's
        base (share_policy_base)."""
        return bool(self.checkpoints) or self.backend == "openai" or self.share_policy_base

    def for_benchmark(self, benchmark_mode: str) -> JudgeSpec:
        """`mode=benchmark` replaced by the benchmark's prescribed mode (the cascade's too); any other mode is kept."""
        cascade = self.cascade.for_benchmark(benchmark_mode) if self.cascade is not None else None
        mode = benchmark_mode if self.mode == BENCHMARK_MODE else self.mode
        return self if (mode, cascade) == (self.mode, self.cascade) else dataclasses.replace(self, mode=mode,
                                                                                          cascade=cascade)

    def to_block(self) -> dict[str, Any]:
        """The config-block form (checkpoint as a comma-separated string, the cascade as its block or ""), e.g. for
        reports and configs/common.py `judge_block()`."""
        fields = {schema.config_key(f): getattr(self, f.name) for f in schema.config_fields(self)}
        fields["checkpoint"] = ",".join(self.checkpoints)
        fields["cascade"] = self.cascade.to_block() if self.cascade is not None else ""
        return fields


FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(JudgeSpec)}  # each spec field's default


def _problems(spec: JudgeSpec):
    """(block field, value, why) of every invalid field the field types, bounds and choices leave, in field order."""
    modes = (*MODES, BENCHMARK_MODE) if spec.mode == BENCHMARK_MODE else MODES
    if spec.mode not in modes:
        yield "mode", spec.mode, f"expected one of {modes}"
    if not isinstance(spec.reverse_order, bool):
        yield "reverse_order", spec.reverse_order, "expected True or False"
    try:
        parse_sampler(spec.sampler)
    except ValueError as e:
        yield "sampler", spec.sampler, str(e).removeprefix(f"sampler {spec.sampler!r}: ")
    if spec.store and not spec.has_judge:
        yield "store", spec.store, "there is no LLM judge (checkpoint or endpoint) whose verdicts to store"
    if spec.store_rollouts is True and not spec.store:
        yield "store_rollouts", True, "there is no verdict store: set store=PATH"
    if spec.require_calibration is True and not spec.calibration:
        yield "require_calibration", True, "needs a report to check: set calibration=PATH (a report.json) too"
    if spec.prompt == "compact" and spec.mode == "all_criteria":
        yield "prompt", spec.prompt, "the compact prompt scores one dimension at a time: mode must be per_dimension"
    if spec.layout == "shared_prefix" and spec.mode != "per_dimension":
        yield "layout", spec.layout, "shares a response's prefix among its per-dimension prompts: mode must be per_dimension"
    if spec.layout == "group" and spec.mode != "per_dimension":
        yield "layout", spec.layout, "scores a group's responses on one criterion per prompt: mode must be per_dimension"
    if spec.layout == "group" and spec.prompt != "full":
        yield "layout", spec.layout, "has no compact prompt (a distilled judge learnt one response per prompt): prompt must be full"
    if spec.reverse_order and spec.shuffle_anchors:
        yield "reverse_order", True, "needs shuffle_anchors=False (a shuffled order has no reverse)"
    yield from _endpoint_problems(spec)
    yield from _cascade_problems(spec)
    yield from _shared_base_problems(spec)


def _shared_base_problems(spec: JudgeSpec):
    """(block field, value, why) of every field share_policy_base cannot combine with: the judge is the policy's
    base, read where and as the policy's rollouts read it."""
    if not spec.share_policy_base:
        return
    if spec.checkpoints:
        yield "checkpoint", ",".join(spec.checkpoints), "share_policy_base=True: the judge is the policy's base; set ''"
    if spec.backend != "jax":
        yield "backend", spec.backend, "share_policy_base=True judges in this process: set jax"
    for field, rule in (("param_dtype", "config.mesh.rollout.param_dtype"), ("compute_dtype", "config.model"),
                        ("tensor", "config.mesh.rollout.tensor")):
        if getattr(spec, field) != FIELD_DEFAULTS[field]:
            yield field, getattr(spec, field), (f"share_policy_base=True reads the policy's decode copy ({rule} sets "
                                                f"it); leave {FIELD_DEFAULTS[field]!r}")


def _cascade_spec(value: Any, where: str, allow_benchmark: bool) -> JudgeSpec | None:
    """The block's `cascade` as the refining judge's spec: "" = none, a judge config file's path (loaded here), or
    a nested block (to_block's form, e.g. from a report.json); a bad one is a ValueError naming `<where>.cascade`.
    A refining judge that names a cascade of its own (itself: a cycle) is refused before that one is read."""
    if isinstance(value, str) and not value:
        return None
    if isinstance(value, str):
        path = value
        try:
            value = load_judge_file(path)
        except Exception as e:  # a user's config file: whatever it raises is one line naming it
            raise JudgeSpecError("cascade", path, f"cannot load this judge config file ({e})", where) from None
    elif not isinstance(value, Mapping) and not hasattr(value, "to_dict"):
        raise JudgeSpecError("cascade", value, "expected the path of a judge config file (configs/judges/*.py), or ''",
                             where)
    else:
        path = "<nested block>"
    again = value.get("cascade", "")
    if again != "":  # checked before reading it: a file naming itself would recurse without end
        chain = f"{path} -> {again}: " if isinstance(again, str) else ""
        cycle = "a cycle, " if isinstance(again, str) and _same_file(again, path) else ""
        raise JudgeSpecError("cascade", again, f"{cycle}{chain}a refining judge cannot cascade again (its own cascade "
                             "must be '')", f"{where}.cascade")
    inner = JudgeSpec.from_config(value, f"{where}.cascade", allow_benchmark=allow_benchmark)
    if not inner.has_judge:
        raise JudgeSpecError("cascade", path, "the refining judge has no checkpoint (or endpoint)", where)
    return inner


def _same_file(a: str, b: str) -> bool:
    """Whether two judge config file paths (FILE or FILE:ARG) name one file."""
    return Path(a.partition(":")[0]).resolve() == Path(b.partition(":")[0]).resolve()


def _cascade_problems(spec: JudgeSpec):
    """(block field, value, why) of every invalid cascade field (the bounds of its spread and margin are theirs)."""
    thresholds = spec.cascade_thresholds
    if any(isinstance(t, bool) or not 0 <= t <= 1 for t in thresholds):
        yield "cascade_thresholds", thresholds, "expected a tuple of normalised scores in [0, 1], e.g. (0.5,)"
    if spec.cascade is None:
        for field in ("cascade_spread", "cascade_margin", "cascade_thresholds"):
            if getattr(spec, field) != FIELD_DEFAULTS[field]:
                yield field, getattr(spec, field), "is read only with a cascade: set cascade=PATH (a judge config file)"
        return
    if not spec.has_judge:
        yield "cascade", ",".join(spec.cascade.checkpoints), "there is no first judge (checkpoint) whose verdicts to refine"
    elif not spec.cascade.has_judge:
        yield "cascade", "", "the refining judge has no checkpoint (or endpoint)"
    elif spec.cascade.share_policy_base:
        yield "cascade", "", "the refining judge cannot share the policy's base (only the first judge can)"


def load_judge_file(path: str | Path) -> Any:
    """A judge config file's `get_config()` (a configs/common.judge_block(); what --judge=PATH loads), read by path
    (rubric_jax/config_files.py): a cascade names its refining judge by such a file."""
    from rubric_jax.config_files import load_config  # absl and ml_collections: loaded when a file is read

    return load_config(path, "judge config")


def _endpoint_problems(spec: JudgeSpec):
    """(block field, value, why) of every invalid endpoint field (HTTP_FIELDS and the checkpoint they allow)."""
    timeout = spec.timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        yield "timeout_s", timeout, "expected a number of seconds > 0"
    outage = spec.outage_s
    if isinstance(outage, bool) or not isinstance(outage, (int, float)) or not 0 <= outage < float("inf"):
        yield "outage_s", outage, "expected a number of seconds >= 0"
    if spec.backend != "openai":
        for field in ("base_url", "model", "api_key_env"):
            if getattr(spec, field):
                yield field, getattr(spec, field), "is read only with backend=openai"
        return
    if not re.match(r"^https?://[^/\s]+", spec.base_url):
        yield "base_url", spec.base_url, "expected the endpoint's http(s) URL, e.g. http://127.0.0.1:8000/v1"
    if not spec.model:
        yield "model", spec.model, "expected the served model's name (GET <base_url>/models lists them)"
    if spec.api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*",
                                                                               spec.api_key_env):
        yield "api_key_env", spec.api_key_env, "expected the NAME of an environment variable holding the key"
    if len(spec.checkpoints) > 1:
        yield "checkpoint", ",".join(spec.checkpoints), ("backend=openai judges with one endpoint: at most one "
                                                         "local directory (the served model's tokenizer)")
    if spec.endpoint == "completions" and not spec.checkpoints:
        yield "checkpoint", "", ("endpoint=completions sends raw prompts rendered by the served model's chat "
                                 "template: name its local HF directory")


# ------------------------------------------------------------------------------------------ identity and hash
def weights_identity(checkpoint_dir: str | Path) -> str:
    """sha256 hex identifying a HF judge directory's weights and tokenizer without reading the weights:
    config.json, then per *.safetensors file its name, size, JSON header and the first and last
    TENSOR_EDGE_BYTES of every tensor (a retrained judge of the same shapes has the same header: the three
    shipped tiny judges do), then the tokenizer and chat-template files (check_checkpoints first)."""
    root = Path(checkpoint_dir)
    digest = hashlib.sha256()
    digest.update(b"config.json\0" + (root / "config.json").read_bytes())
    shards = sorted(root.glob("*.safetensors"))
    for shard in shards:
        digest.update(f"\0{shard.name}\0{shard.stat().st_size}\0".encode())
        with shard.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header_bytes = f.read(length)
            digest.update(header_bytes)
            try:
                header = json.loads(header_bytes)
            except ValueError as e:
                raise ValueError(f"{shard}: not a safetensors file ({e})") from None
            for name in sorted(k for k in header if k != "__metadata__"):
                begin, end = header[name]["data_offsets"]
                for start in sorted({begin, max(begin, end - TENSOR_EDGE_BYTES)}):
                    f.seek(8 + length + start)
                    digest.update(f.read(min(TENSOR_EDGE_BYTES, end - start)))
    for chunk in _tokenizer_chunks(root):
        digest.update(chunk)
    return digest.hexdigest()


def tokenizer_identity(tokenizer_dir: str | Path) -> str:
    """sha256 hex of a tokenizer directory's tokenizer and chat-template files (the part of `weights_identity` a
    judge's prompts and parsed answers depend on), for a judge that reads a tokenizer of its own directory."""
    digest = hashlib.sha256()
    for chunk in _tokenizer_chunks(Path(tokenizer_dir)):
        digest.update(chunk)
    return digest.hexdigest()


def _tokenizer_chunks(root: Path) -> Iterator[bytes]:
    """Name and content of each TOKENIZER_FILES file present in `root`, in that order, as hashed."""
    for name in TOKENIZER_FILES:
        if (root / name).is_file():
            yield f"\0{name}\0".encode() + (root / name).read_bytes()


def verdict_fields(spec: JudgeSpec) -> dict[str, Any]:
    """The fields that change a verdict (every field but NOT_HASHED; the endpoint's only with backend=openai;
    HASHED_OFF_DEFAULT ones only off their default), with the prompt templates' version (and the group template's
    in the group layout only, so the other layouts' hashes do not move when it changes)."""
    skipped = (NOT_HASHED + (() if spec.backend == "openai" else ("backend", *HTTP_FIELDS))
               + (() if spec.cascade is not None else CASCADE_FIELDS))
    skipped += tuple(name for name in HASHED_OFF_DEFAULT if getattr(spec, name) == FIELD_DEFAULTS[name])
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name not in skipped}
    if spec.cascade is not None:
        fields["cascade"] = judge_hash(spec.cascade)
    if spec.layout == "group":
        fields["group_prompt_version"] = GROUP_PROMPT_VERSION
    return {**fields, "prompt_version": PROMPT_VERSION}


def served_identity(spec: JudgeSpec) -> str:
    """The weights identity a backend=openai judge's endpoint reports for judge.model now (GET /models, one try;
    experiments.serve reports its weights_identity, "" from an endpoint that reports none); a ValueError naming
    the endpoint when it does not answer."""
    from rubric_jax.judges.http_backend import HttpJudgeClient

    return HttpJudgeClient(spec).check()


def judge_hash(spec: JudgeSpec) -> str:
    """sha256 hex of the verdict fields, the prompt version and every checkpoint's weights identity (in
    ensemble order), and for a served judge the identity its endpoint reports for the model behind judge.model
    (served_identity: a name serves other weights after a restart; an endpoint that reports none is fingerprinted
    by its verdict store instead, llm_judge.check_fingerprint); reads each checkpoint's headers (weights_identity)
    and asks the endpoint, so call it once per command."""
    identities = [weights_identity(path) for path in spec.checkpoints] + _shared_identity(spec)
    served = served_identity(spec) if spec.backend == "openai" else ""
    hashed = {"fields": verdict_fields(spec), "weights": identities} | ({"served": served} if served else {})
    payload = json.dumps(hashed, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


# Why a standalone command (score, calibrate, evaluate, ...) refuses share_policy_base, and what to run instead.
NO_BASE_TO_SHARE = ("share_policy_base=True: only an experiment whose GRPO stage trains through LoRA has a policy base "
                    "to share (experiments.run); name a judge checkpoint here. To calibrate the judge a run shares, "
                    "calibrate its base loaded as a judge (judge.checkpoint=the run's model.checkpoint, when no SFT "
                    "stage precedes GRPO): the same weights give the same verdicts, but the run reads that report as "
                    "evidence, not as its pinned pair (docs/judges.md)")


def _shared_identity(spec: JudgeSpec) -> list[str]:
    """[the policy base's identity] with share_policy_base (a ValueError where no experiment set it), else []."""
    if not spec.share_policy_base:
        return []
    if not spec.policy_base:
        raise ValueError(f"judge.{NO_BASE_TO_SHARE}")
    return [f"policy base {spec.policy_base}"]


def describe(spec: JudgeSpec) -> dict[str, Any]:
    """What a run, score, calibration or evaluation records about its judge: the hash, every field of the
    spec, each checkpoint's weights identity and a served judge's reported one."""
    described = {"hash": judge_hash(spec), "prompt_version": PROMPT_VERSION, "spec": spec.to_block(),
                 "weights": {path: weights_identity(path) for path in spec.checkpoints}
                 | ({"policy base": spec.policy_base} if spec.share_policy_base else {})}
    served = {"served_identity": served_identity(spec)} if spec.backend == "openai" else {}
    return described | served | ({"cascade": describe(spec.cascade)} if spec.cascade is not None else {})

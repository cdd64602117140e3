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
A served judge's (backend=openai) hash also holds the weights identity its endpoint reports for the model behind
judge.model (experiments.serve reports one); an endpoint that reports none is fingerprinted by the verdict store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rubric_jax import counts
from rubric_jax.judges.prompts import PROMPT_VERSION

# The judge block's counts: (smallest, largest) allowed (rubric_jax/counts.py).
COUNT_BOUNDS = {
    "samples": (1, 64),  # verdicts per item, combined by the median (RubricRL uses 3-5)
    "max_retries": (0, 10),  # re-prompt rounds
    "max_new_tokens": (1, counts.TOKENS),
    "batch_size": (0, 1 << 16),  # prompts per generate call (0 = a whole round)
    "tensor": (1, counts.DEVICES),
    "max_concurrency": (1, 1024),  # HTTP requests in flight
    "max_retries_http": (0, 20),
    "requests_per_minute": (0, 10**7),  # 0 = unlimited
    "tokens_per_minute": (0, 10**10),  # 0 = unlimited
}
MODES = ("per_dimension", "all_criteria")  # one prompt per (response, LLM dimension) | one per response (QuRL)
BENCHMARK_MODE = "benchmark"  # experiments.evaluate only: the benchmark's own prescribed mode
PROMPTS = ("full", "compact")  # prompts.single_prompt / multi_prompt, or a distilled judge's compact_single_prompt
ENSEMBLES = ("mean", "agreement")  # llm_judge.combine_judges
# prompts.py: the criterion before the response (each prompt prefilled whole) | the response first, the criterion
# last, a response's shared part prefilled once and continued by each of its criteria (llm_judge, per_dimension only).
LAYOUTS = ("criteria_first", "shared_prefix")
# Fields hashed only when they differ from their default, so judge hashes (stores, calibration reports) made before
# the field existed stay valid for the judge they described.
HASHED_OFF_DEFAULT = ("layout",)
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
              "tokens_per_minute")
# The cascade's fields (RubricRL §7: a small judge screens, a larger one refines; judges/cascade.py): hashed only
# with a cascade, whose entry in the hash is the refining judge's own hash (a judge without one keeps its hash).
CASCADE_FIELDS = ("cascade", "cascade_spread", "cascade_margin", "cascade_thresholds")
# Tokenizer and chat-template files whose content changes the prompts a judge reads.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                   "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.json", "merges.txt")
TENSOR_EDGE_BYTES = 4096  # bytes hashed at each end of every tensor (weights_identity)
_BLOCK_NAMES = {"checkpoints": "checkpoint"}  # spec field -> config block field, where they differ


class JudgeSpecError(ValueError):
    """A bad judge field: `field` (the config block's name), `value` and why; str() names `judge.<field>`."""

    def __init__(self, field: str, value: Any, why: str, where: str = "judge"):
        self.field, self.value, self.why = field, value, why
        super().__init__(f"{where}.{field}={value!r}: {why}")


@dataclasses.dataclass(frozen=True)
class JudgeSpec:
    """The LLM judge of a command: which weights, how they are prompted and sampled, and how they are loaded.
    Field meanings are those of configs/common.py `judge_block()`."""

    checkpoints: tuple[str, ...] = ()  # HF directories; () = rule dimensions only
    ensemble: str = "mean"
    mode: str = "per_dimension"
    prompt: str = "full"
    samples: int = 3
    shuffle_anchors: bool = True
    max_retries: int = 2
    max_new_tokens: int = 64
    sampler: str = "temperature(0.7)"
    param_dtype: str = "auto"
    compute_dtype: str = "auto"
    batch_size: int = 0
    tensor: int = 1
    calibration: str = ""
    require_calibration: bool = False
    store: str = ""
    store_rollouts: bool = False
    backend: str = "jax"
    base_url: str = ""
    model: str = ""
    api_key_env: str = ""
    endpoint: str = "chat"
    max_concurrency: int = 8
    timeout_s: float = 60.0
    max_retries_http: int = 5
    outage_s: float = 300.0
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    layout: str = "criteria_first"
    cascade: JudgeSpec | None = None  # the refining judge (block: the path of its judge config file, or "")
    cascade_spread: float = 0.0
    cascade_margin: float = 0.0
    cascade_thresholds: tuple[float, ...] = ()
    # Not a config field: calibration's position probe lists anchors (and all_criteria criteria) reversed.
    reverse_order: bool = False

    def __post_init__(self) -> None:
        problem = next(_problems(self), None)
        if problem is not None:
            raise JudgeSpecError(*problem)

    @classmethod
    def from_config(cls, block: Mapping[str, Any], where: str = "judge", *, allow_benchmark: bool = False
                    ) -> JudgeSpec:
        """The spec of a judge config block (a ConfigDict or dict with exactly the judge_block() fields);
        `where` prefixes every error ("--judge" or "config.judge"). `mode=benchmark` only with
        `allow_benchmark` (experiments.evaluate), resolved later by `for_benchmark`."""
        values = dict(block.to_dict() if hasattr(block, "to_dict") else block)
        names = {_BLOCK_NAMES.get(f.name, f.name) for f in dataclasses.fields(cls) if f.name != "reverse_order"}
        unknown, missing = sorted(set(values) - names), sorted(names - set(values))
        if unknown or missing:
            problems = [f"unknown field(s) {unknown}"] * bool(unknown) + [f"missing field(s) {missing}"] * bool(missing)
            raise ValueError(f"{where}: " + "; ".join(problems))
        values["cascade"] = _cascade_spec(values["cascade"], where, allow_benchmark)
        if isinstance(values["cascade_thresholds"], (list, tuple)):
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
        """Whether this spec judges LLM dimensions at all: a checkpoint in process, or an endpoint."""
        return bool(self.checkpoints) or self.backend == "openai"

    def for_benchmark(self, benchmark_mode: str) -> JudgeSpec:
        """`mode=benchmark` replaced by the benchmark's prescribed mode (the cascade's too); any other mode is kept."""
        cascade = self.cascade.for_benchmark(benchmark_mode) if self.cascade is not None else None
        mode = benchmark_mode if self.mode == BENCHMARK_MODE else self.mode
        return self if (mode, cascade) == (self.mode, self.cascade) else dataclasses.replace(self, mode=mode,
                                                                                          cascade=cascade)

    def to_block(self) -> dict[str, Any]:
        """The config-block form (checkpoint as a comma-separated string), e.g. for reports."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "reverse_order"}
        fields["checkpoint"] = ",".join(fields.pop("checkpoints"))
        fields["cascade"] = self.cascade.to_block() if self.cascade is not None else ""
        return fields


def _problems(spec: JudgeSpec):
    """(block field, value, why) of every invalid field, in field order."""
    from rubric_jax.loader import DTYPE_CHOICES  # imported here (jax): importing this module stays cheap
    from rubric_jax.sampling import parse_sampler

    for field, (smallest, largest) in COUNT_BOUNDS.items():
        why = counts.problem(getattr(spec, field), smallest, largest)
        if why is not None:
            yield field, getattr(spec, field), why
    choices = (("ensemble", ENSEMBLES), ("mode", (*MODES, BENCHMARK_MODE) if spec.mode == BENCHMARK_MODE else MODES),
               ("prompt", PROMPTS), ("param_dtype", DTYPE_CHOICES), ("compute_dtype", DTYPE_CHOICES),
               ("backend", BACKENDS), ("endpoint", ENDPOINTS), ("layout", LAYOUTS))
    for field, allowed in choices:
        if getattr(spec, field) not in allowed:
            yield field, getattr(spec, field), f"expected one of {allowed}"
    for field in ("shuffle_anchors", "require_calibration", "store_rollouts", "reverse_order"):
        if not isinstance(getattr(spec, field), bool):
            yield field, getattr(spec, field), "expected True or False"
    if not isinstance(spec.sampler, str):
        yield "sampler", spec.sampler, "expected a sampler string such as 'greedy' or 'temperature(0.7)'"
    else:
        try:
            parse_sampler(spec.sampler)
        except ValueError as e:
            yield "sampler", spec.sampler, str(e).removeprefix(f"sampler {spec.sampler!r}: ")
    if not isinstance(spec.calibration, str):
        yield "calibration", spec.calibration, "expected the path of a calibration report.json, or ''"
    if not isinstance(spec.store, str):
        yield "store", spec.store, "expected the path of a verdict store (SQLite file), or ''"
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
    if spec.reverse_order and spec.shuffle_anchors:
        yield "reverse_order", True, "needs shuffle_anchors=False (a shuffled order has no reverse)"
    yield from _endpoint_problems(spec)
    yield from _cascade_problems(spec)


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
    """(block field, value, why) of every invalid cascade field."""
    for field in ("cascade_spread", "cascade_margin"):
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            yield field, value, "expected a number in [0, 1] (a distance on the normalised score scale)"
    thresholds = spec.cascade_thresholds
    if not isinstance(thresholds, tuple) or any(isinstance(t, bool) or not isinstance(t, (int, float))
                                                or not 0 <= t <= 1 for t in thresholds):
        yield "cascade_thresholds", thresholds, "expected a tuple of normalised scores in [0, 1], e.g. (0.5,)"
    if spec.cascade is None:
        for field in ("cascade_spread", "cascade_margin", "cascade_thresholds"):
            if getattr(spec, field) != getattr(JudgeSpec, field):
                yield field, getattr(spec, field), "is read only with a cascade: set cascade=PATH (a judge config file)"
        return
    if not isinstance(spec.cascade, JudgeSpec):
        yield "cascade", spec.cascade, "expected the refining judge's JudgeSpec"
    elif not spec.has_judge:
        yield "cascade", ",".join(spec.cascade.checkpoints), "there is no first judge (checkpoint) whose verdicts to refine"
    elif not spec.cascade.has_judge:
        yield "cascade", "", "the refining judge has no checkpoint (or endpoint)"


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
    for field in ("base_url", "model", "api_key_env"):
        if not isinstance(getattr(spec, field), str):
            yield field, getattr(spec, field), "expected a string"
    if spec.backend != "openai":
        for field in ("base_url", "model", "api_key_env"):
            if getattr(spec, field):
                yield field, getattr(spec, field), "is read only with backend=openai"
        return
    if not isinstance(spec.base_url, str) or not re.match(r"^https?://[^/\s]+", spec.base_url):
        yield "base_url", spec.base_url, "expected the endpoint's http(s) URL, e.g. http://127.0.0.1:8000/v1"
    if not spec.model:
        yield "model", spec.model, "expected the served model's name (GET <base_url>/models lists them)"
    if isinstance(spec.api_key_env, str) and spec.api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*",
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
    for name in TOKENIZER_FILES:
        if (root / name).is_file():
            digest.update(f"\0{name}\0".encode() + (root / name).read_bytes())
    return digest.hexdigest()


FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(JudgeSpec)}  # each spec field's default


def verdict_fields(spec: JudgeSpec) -> dict[str, Any]:
    """The fields that change a verdict (every field but NOT_HASHED; the endpoint's only with backend=openai;
    HASHED_OFF_DEFAULT ones only off their default), with the prompt templates' version."""
    skipped = (NOT_HASHED + (() if spec.backend == "openai" else ("backend", *HTTP_FIELDS))
               + (() if spec.cascade is not None else CASCADE_FIELDS))
    skipped += tuple(name for name in HASHED_OFF_DEFAULT if getattr(spec, name) == FIELD_DEFAULTS[name])
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name not in skipped}
    if spec.cascade is not None:
        fields["cascade"] = judge_hash(spec.cascade)
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
    identities = [weights_identity(path) for path in spec.checkpoints]
    served = served_identity(spec) if spec.backend == "openai" else ""
    hashed = {"fields": verdict_fields(spec), "weights": identities} | ({"served": served} if served else {})
    payload = json.dumps(hashed, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def describe(spec: JudgeSpec) -> dict[str, Any]:
    """What a run, score, calibration or evaluation records about its judge: the hash, every field of the
    spec, each checkpoint's weights identity and a served judge's reported one."""
    described = {"hash": judge_hash(spec), "prompt_version": PROMPT_VERSION, "spec": spec.to_block(),
                 "weights": {path: weights_identity(path) for path in spec.checkpoints}}
    served = {"served_identity": served_identity(spec)} if spec.backend == "openai" else {}
    return described | served | ({"cascade": describe(spec.cascade)} if spec.cascade is not None else {})

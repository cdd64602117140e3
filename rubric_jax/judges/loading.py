"""Loading a JudgeSpec's judges, the same way for every command: its checkpoints into the decode layout (the
in-process sampler backend), or its OpenAI-compatible endpoint (the HTTP backend), its cascade's refining judges
and its verdict store; in an experiment with judge.share_policy_base, the judge that reads the policy's base
(`shared_base_judge`: nothing to load).

Kept apart from judges/spec.py, which only describes and hashes a judge: spec.py imports no engine, and the engine
(llm_judge, http_backend, cascade) imports spec.py, so there is no import cycle. jax, the models and the engine
are imported inside the functions: importing this module stays cheap (judges/__init__.py says why that matters).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubric_jax.judges.spec import MAX_PROMPT_TOKENS, NO_BASE_TO_SHARE, JudgeSpec, judge_hash, prompt_budget

if TYPE_CHECKING:  # jax loads only when judges are loaded
    import jax

    from rubric_jax import sharding
    from rubric_jax.judges.llm_judge import Judge
    from rubric_jax.judges.store import VerdictStore
    from rubric_jax.models.config import ModelConfig


def open_verdict_store(spec: JudgeSpec) -> VerdictStore | None:
    """`spec.store` opened under `judge_hash(spec)`, so stored answers are reused only by the judge that gave
    them (None without a store); a bad store file is a StoreError naming it."""
    from rubric_jax.judges.store import open_store

    return open_store(spec.store, judge_hash(spec)) if spec.store else None


def check_checkpoints(spec: JudgeSpec, where: str = "judge") -> None:
    """Every checkpoint is a HF directory with config.json and safetensors weights (what weights_identity and
    load_judges read); else a ValueError naming `<where>.checkpoint`. Reads no weights."""
    for path in spec.checkpoints:
        root = Path(path)
        if not root.is_dir():
            raise ValueError(f"{where}.checkpoint={path}: directory does not exist")
        if not (root / "config.json").is_file() or not any(root.glob("*.safetensors")):
            raise ValueError(f"{where}.checkpoint={path}: not a Hugging Face model directory (needs config.json "
                             "and *.safetensors)")
    if spec.cascade is not None:
        check_checkpoints(spec.cascade, f"{where}.cascade")


def check_tensor_divides(tensor: int, cfg: ModelConfig, where: str = "judge") -> None:
    """A judge's tensor-parallel group must divide its query and KV heads, or those weights would sit whole on
    every device; a ValueError naming `<where>.tensor` otherwise."""
    for field, heads in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads)):
        if heads % tensor:
            raise ValueError(f"{where}.tensor={tensor} does not divide the judge's {field} ({heads}): those weights "
                             "would sit whole on every device; pick a divisor")


def load_judges(spec: JudgeSpec, layout_or_mesh: sharding.Layout | jax.sharding.Mesh | None = None, *,
                where: str = "judge", max_prompt_tokens: int | None = None) -> tuple[Judge, ...]:
    """Every checkpoint of `spec` loaded into the decode layout over the devices of `layout_or_mesh`
    (default: every local device) with groups of `spec.tensor` devices splitting each weight, in the spec's
    dtypes, sampler, answer budget and batch size. `max_prompt_tokens` (default MAX_PROMPT_TOKENS)
    is capped by each judge's context. A bad directory or tensor size is a ValueError naming `where`.
    With backend=openai: one judge answered by the endpoint, checked to answer now (else a ValueError naming it)."""
    from rubric_jax import sharding
    from rubric_jax.judges import llm_judge
    from rubric_jax.models.config import ModelConfig

    if spec.share_policy_base:
        raise ValueError(f"{where}.{NO_BASE_TO_SHARE}")
    if spec.backend == "openai":
        return (_endpoint_judge(spec, where, max_prompt_tokens),)
    if layout_or_mesh is None:
        mesh = sharding.make_mesh(sharding.MeshConfig())
    else:
        mesh = getattr(layout_or_mesh, "mesh", layout_or_mesh)
    try:
        layout = sharding.decode_layout(mesh, spec.tensor)
    except ValueError as e:
        raise ValueError(f"{where}.tensor={spec.tensor}: {e}") from None
    check_checkpoints(spec, where)
    judges = []
    for path in spec.checkpoints:
        try:
            check_tensor_divides(spec.tensor, ModelConfig.from_hf_dir(path), where)
            judges.append(llm_judge.load_judge(
                path, layout=layout, param_dtype=spec.param_dtype, compute_dtype=spec.compute_dtype,
                sampler=spec.sampler, max_new_tokens=spec.max_new_tokens, batch_size=spec.batch_size,
                max_prompt_tokens=max_prompt_tokens or MAX_PROMPT_TOKENS))
        except (OSError, ValueError) as e:
            raise ValueError(f"{where}.checkpoint={path}: {e}") from None
    return tuple(judges)


def shared_base_judge(spec: JudgeSpec, tokenizer: Any, decode: Callable[[Any], Any], layout: sharding.Layout,
                      context: int, *, where: str = "judge", max_prompt_tokens: int | None = None) -> Judge:
    """The judge of judge.share_policy_base: the policy's frozen base (adapters off) decoded by `decode` (the
    policy's rollout path: training layout -> `layout`) and read with the policy's `tokenizer` (its chat template,
    pad and eos are checked here) and `context`; nothing is loaded. A ValueError naming `where` otherwise."""
    from rubric_jax import sampling
    from rubric_jax.judges import llm_judge
    from rubric_jax.judges.backends import SharedBaseBackend

    try:
        limit = prompt_budget(context, spec.max_new_tokens, max_prompt_tokens or MAX_PROMPT_TOKENS)
        return llm_judge.Judge("policy base", tokenizer, SharedBaseBackend(decode, sampling.generate, layout, context,
                                                                           spec.batch_size),
                               sampler=spec.sampler, max_new_tokens=spec.max_new_tokens, max_prompt_tokens=limit)
    except ValueError as e:
        raise ValueError(f"{where}.share_policy_base=True: the judge reads the policy's tokenizer: {e}") from None


def load_cascade(spec: JudgeSpec, layout_or_mesh: sharding.Layout | jax.sharding.Mesh | None = None, *,
                 where: str = "judge", max_prompt_tokens: int | None = None) -> tuple[Judge, ...]:
    """The cascade's refining judges (`spec.cascade`, loaded as `load_judges` loads the first ones, errors naming
    `<where>.cascade`); () without a cascade. RubricReward(refiners=...) takes them."""
    if spec.cascade is None:
        return ()
    return load_judges(spec.cascade, layout_or_mesh, where=f"{where}.cascade", max_prompt_tokens=max_prompt_tokens)


def _endpoint_judge(spec: JudgeSpec, where: str, max_prompt_tokens: int | None) -> Judge:
    """The backend=openai judge: its endpoint must answer GET /models now; the checkpoint (if any) gives the
    served model's tokenizer (raw prompts, local prompt lengths, the special tokens fenced out) and context."""
    from rubric_jax.judges import http_backend, llm_judge
    from rubric_jax.judges.backends import HttpBackend
    from rubric_jax.models.checkpoint import load_tokenizer
    from rubric_jax.models.config import ModelConfig

    check_checkpoints(spec, where)
    tokenizer, limit = None, max_prompt_tokens or MAX_PROMPT_TOKENS
    for path in spec.checkpoints:
        tokenizer = load_tokenizer(path)
        try:
            limit = prompt_budget(ModelConfig.from_hf_dir(path).max_position_embeddings, spec.max_new_tokens, limit)
        except ValueError as e:
            raise ValueError(f"{where}: judge {path}: {e}") from None
    try:
        client = http_backend.HttpJudgeClient(spec, tokenizer)
        client.check()
    except http_backend.EndpointError as e:
        raise ValueError(str(e).replace("judge.", f"{where}.")) from None
    return llm_judge.Judge(client.name, tokenizer, HttpBackend(client), sampler=spec.sampler,
                           max_new_tokens=spec.max_new_tokens, max_prompt_tokens=limit)

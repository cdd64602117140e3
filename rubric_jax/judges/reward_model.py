"""A scalar reward model as a reward source next to rubrics (QuRL's "w/ RLHF reward model" ablation).

`RewardModelReward` is a `reward.Reward`, as RubricReward is: `(questions, responses, rubrics, *, key, weights)
-> RewardOutput`, with one pseudo-dimension "reward_model". For N rows:
  encode     each (question, response) as the reward model's own chat [user: question, assistant: response],
             rendered by its chat template without a generation prompt (how HF reward models are called);
  forward    rows right-padded with the model's pad_token_id to a power-of-two length bucket, `batch_size`
             rows per call of ONE jitted forward (rows split over the mesh's data and fsdp axes); the
             logit is read at each row's last token that is not the pad id (models/transformer.py);
  normalise  reward = sigmoid((logit - center) / scale), in (0, 1); the logit stays in details["raw_scores"].
A row whose chat is longer than `max_len` tokens is not sent to the model (never truncated into another text) and
scores the minimum: score and reward 0, valid and reward_ok True, so making a response too long for the reward model
can only lower its reward (a not-ok row would be dropped from its group: advantage 0, above any below-average answer).
Like a judge prompt too long for its judge (judges/reward.py, "Too long to judge"), it is counted as a failed score
(details["failures"], "failure_causes", "num_failed_scores"), in details["scored_minimum"] and
details["reward_model_too_long"]; its raw score stays NaN. The
rubrics and the key are accepted for the common signature and unused: a reward model reads no rubric and
samples nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rubric_jax import data, loader, padding, sharding
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.judges.spec import weights_identity
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.transformer import causal_padding_mask, padding_to_positions
from rubric_jax.rubrics.schema import Rubric

DIMENSION = "reward_model"  # the one column of RewardOutput
_MIN_BUCKET = 64  # shortest length bucket (tokens); buckets double up to the first power of two >= max_len


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
    """How the reward model is read: input length limit, rows per forward call, and the logit -> [0, 1] map."""

    max_len: int = 4096  # longest chat (question + response, the RM's tokens) scored; a longer one scores the minimum
    batch_size: int = 64  # rows per forward call (bounds the [rows, heads, T, T] attention scores)
    center: float = 0.0  # reward = sigmoid((logit - center) / scale)
    scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_len", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"reward.model_{name}={value!r}: expected a positive integer")
        if isinstance(self.center, bool) or not isinstance(self.center, (int, float)) or not math.isfinite(self.center):
            raise ValueError(f"reward.model_center={self.center!r}: expected a finite number")
        if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)) or not self.scale > 0:
            raise ValueError(f"reward.model_scale={self.scale!r}: expected a number > 0")

    def normalize(self, logits_N: np.ndarray) -> np.ndarray:
        """The documented map of the scalar to (0, 1): sigmoid((logit - center) / scale), in float64."""
        return 1.0 / (1.0 + np.exp(-(np.asarray(logits_N, np.float64) - self.center) / self.scale))


@dataclasses.dataclass(frozen=True)
class RewardModel:
    """A loaded reward model: its Weights placed in `layout` (the run's decode layout) and its tokenizer."""

    name: str
    weights: loader.Weights
    tokenizer: Any
    layout: sharding.Layout

    @property
    def cfg(self) -> ModelConfig:
        return self.weights.cfg


def load_reward_model(checkpoint_dir: str | Path, *, layout: sharding.Layout, param_dtype: str = "float32",
                      compute_dtype: str = "float32") -> RewardModel:
    """A one-label *ForSequenceClassification HF directory (with a chat-template tokenizer), loaded by the one
    loader straight into `layout`."""
    from transformers import AutoTokenizer  # slow import (pulls torch when installed); only loading needs it

    path = Path(checkpoint_dir)
    weights = loader.load_weights(path, layout, param_dtype=loader.resolve_dtype(param_dtype, "reward.model_dtype"),
                                  compute_dtype=loader.resolve_dtype(compute_dtype, "reward.model_dtype"))
    cfg = weights.cfg
    if cfg.num_labels != 1:
        kind = "a causal LM" if not cfg.is_classifier else f"a classifier with {cfg.num_labels} labels"
        raise ValueError(f"{path}: a reward model is a *ForSequenceClassification checkpoint with one label; "
                         f"config.json describes {kind}")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        raise ValueError(f"{path}: the tokenizer has no chat template (the reward model reads a chat)")
    return RewardModel(str(path), weights, tokenizer, layout)


@functools.lru_cache(maxsize=8)
def forward_program(graphdef: nnx.GraphDef, mesh: Mesh):
    """The one jitted forward: (params, tokens [B, T], input_mask [B, T]) -> logits [B], replicated (the dry
    run compiles it too, rubric_jax/aot.py)."""

    def forward(params: dict[str, Any], tokens_BxT: jax.Array, input_mask_BxT: jax.Array) -> jax.Array:
        model = nnx.merge(graphdef, params)
        logits_BxC = model.sequence_logits(tokens_BxT, padding_to_positions(input_mask_BxT),
                                           causal_padding_mask(input_mask_BxT))
        return logits_BxC[:, 0]

    return jax.jit(forward, out_shardings=sharding.replicated(mesh))


def check_context(config: RewardModelConfig, cfg: ModelConfig, name: str) -> None:
    """The longest chat scored must fit the reward model's context."""
    if config.max_len > cfg.max_position_embeddings:
        raise ValueError(f"reward.model_max_len={config.max_len} exceeds the reward model's context "
                         f"({cfg.max_position_embeddings} tokens, {name}/config.json)")


def rows_per_call(config: RewardModelConfig, n: int, mesh: Mesh) -> int:
    """Rows of each forward call scoring `n` chats: up to `batch_size`, rounded up to split over data x fsdp
    (one row count per n: a bounded set of shapes)."""
    split = mesh.shape["data"] * mesh.shape["fsdp"]
    return -(-min(config.batch_size, n) // split) * split


def longest_bucket(config: RewardModelConfig) -> int:
    """The largest length bucket: the first power of two >= max_len."""
    return 1 << (config.max_len - 1).bit_length()


def reward_model_logits(model: RewardModel, token_ids: Sequence[Sequence[int]], config: RewardModelConfig
                        ) -> np.ndarray:
    """Float32 logits [N] of tokenised chats (each at most config.max_len tokens), `batch_size` rows a call."""
    loader.check_placement(model.weights, model.layout, what=f"reward model {model.name}")
    mesh = model.layout.mesh
    n = len(token_ids)
    rows = rows_per_call(config, n, mesh)
    top = longest_bucket(config)
    buckets = padding.power_of_two_buckets(min(_MIN_BUCKET, top), top)
    pad_id = model.cfg.pad_token_id
    forward = forward_program(model.weights.graphdef, mesh)
    logits_N = np.empty((n,), np.float32)
    for start in range(0, n, rows):
        chunk = list(token_ids[start:start + rows])
        tokens_BxT, mask_BxT = padding.pad_right(chunk + [[pad_id]] * (rows - len(chunk)), pad_id, buckets)
        batch = sharding.batch_sharding(mesh, tokens_BxT.shape)
        out_B = forward(model.weights.params, jax.device_put(tokens_BxT, batch), jax.device_put(mask_BxT, batch))
        logits_N[start:start + len(chunk)] = np.asarray(jax.device_get(out_B))[: len(chunk)]
    return logits_N


class RewardModelReward:
    """Callable reward from a scalar reward model: `(questions, responses, rubrics, *, key=None, weights=None)
    -> RewardOutput` with the single column "reward_model" (module docstring)."""

    def __init__(self, model: RewardModel, config: RewardModelConfig = RewardModelConfig()):
        check_context(config, model.cfg, model.name)
        self.model = model
        self.config = config

    def describe(self) -> dict[str, Any]:
        """What a run records about its reward model (rubric.json; its hash in every GRPO checkpoint, so that a resume
        under another reward model is refused: train/workdir.check_resume): the directory, its weights identity
        (judges/spec.weights_identity) and the settings that change a reward, and the sha256 of the last two."""
        cfg = self.model.cfg
        settings = {"max_len": self.config.max_len, "center": self.config.center, "scale": self.config.scale,
                    "param_dtype": cfg.param_dtype, "compute_dtype": cfg.compute_dtype}
        weights = weights_identity(self.model.name)
        digest = hashlib.sha256(json.dumps({"weights": weights, "settings": settings}, sort_keys=True).encode())
        return {"hash": digest.hexdigest(), "checkpoint": self.model.name, "weights": weights, "settings": settings}

    def encode(self, questions: Sequence[str], responses: Sequence[str]) -> list[list[int]]:
        """The reward model's token ids of each [user: question, assistant: response] chat."""
        chats = [[{"role": "user", "content": q}, {"role": "assistant", "content": r}]
                 for q, r in zip(questions, responses)]
        return data.encode_chats(self.model.tokenizer, chats, add_generation_prompt=False)

    def __call__(
        self,
        questions: Sequence[str],
        responses: Sequence[str],
        rubrics: Sequence[Rubric],
        *,
        key: jax.Array | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> RewardOutput:
        """Normalised reward-model scores of N rows; `rubrics` and `key` are unused (module docstring)."""
        del key
        n = len(responses)
        if not len(questions) == n == len(rubrics):
            raise ValueError(f"reward: {len(questions)} questions, {n} responses, {len(rubrics)} rubrics")
        if weights is not None:
            raise ValueError("reward: a reward model has no dimension weights (rl.dynamic_weights needs rubrics)")
        token_ids = self.encode(questions, responses)
        fits_N = np.asarray([len(ids) <= self.config.max_len for ids in token_ids], bool)
        raw_N = np.full((n,), np.nan)
        if fits_N.any():
            raw_N[fits_N] = reward_model_logits(self.model, [ids for ids, ok in zip(token_ids, fits_N) if ok],
                                                self.config)
        scores_N = np.where(fits_N, self.config.normalize(raw_N), 0.0)  # too long: the minimum
        too_long = int((~fits_N).sum())
        details = {
            "reward_ok": np.ones((n,), bool),
            "raw_scores": raw_N[:, None],
            "failures": {DIMENSION: too_long},
            "failure_causes": {DIMENSION: {"reward_model_too_long": too_long}} if too_long else {},
            "scored_minimum": {DIMENSION: too_long},
            "num_failed_scores": too_long,
            "num_not_ok": 0,
            "reward_model_too_long": too_long,
        }
        return RewardOutput(scores_N[:, None], np.ones((n, 1), bool), scores_N.astype(np.float32), [DIMENSION], details)

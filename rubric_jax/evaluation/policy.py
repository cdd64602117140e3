"""The policy under evaluation: loaded from a Hugging Face directory or from a training run's checkpoint
(latest, or best by logged held-out reward), and a `generate` callable over the batched sampler.

`load_policy` is the ONE place an evaluation loads a policy and samples from it (through rubric_jax.loader,
straight into the decode layout over the given mesh: no FSDP sharding of weights, heads / MLP / vocab over
`tensor`), so a change of the loader or sampler API is a change here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
from jax.sharding import Mesh

from rubric_jax import loader, sampling, sharding
from rubric_jax.evaluation.results import EvalInputError
from rubric_jax.models.checkpoint import CheckpointError, load_tokenizer
from rubric_jax.sampling import GenerationResult


@dataclasses.dataclass(frozen=True)
class Policy:
    """A loaded policy: `generate(prompt_ids, key)` samples one response per prompt (sampling.generate)."""

    name: str
    tokenizer: Any
    context_length: int  # max_position_embeddings: prompt + response tokens must fit
    stop_tokens: tuple[int, ...]
    generate: Callable[[Sequence[Sequence[int]], jax.Array], GenerationResult]
    source: dict[str, Any]  # where the parameters came from (written to summary.json)


def load_policy(*, checkpoint: Path | None, workdir: Path | None, which: str, mesh: Mesh, sampler: str,
                max_new_tokens: int) -> Policy:
    """The policy of a HF directory (`checkpoint`) or of a training run (`workdir`, `which` checkpoint), in the
    decode layout over `mesh`."""
    if (checkpoint is None) == (workdir is None):
        raise EvalInputError("give exactly one of --checkpoint (a HF directory) and --workdir (a training run)")
    layout = sharding.Layout(mesh, sharding.DECODE_RULES)
    if checkpoint is not None:
        try:
            weights = loader.load_weights(checkpoint, layout)
        except (OSError, ValueError) as e:
            raise EvalInputError(f"--checkpoint={checkpoint}: {e}") from None
        tokenizer_dir, name, source = checkpoint, checkpoint.name, {"checkpoint": str(checkpoint)}
    else:
        from rubric_jax.train import runs  # imported here: orbax takes seconds; only --workdir needs it

        try:
            record = runs.run_record(workdir)
            chosen = runs.select_checkpoint(workdir, record, which)
            weights = loader.to_layout(runs.restore_run_params(workdir, record, chosen, layout), layout)  # LoRA: merged
        except runs.RunError as e:
            raise EvalInputError(str(e)) from None
        tokenizer_dir = record.tokenizer_dir
        name = f"{workdir.name}@{chosen.stage}/{chosen.step}"
        source = {"workdir": str(workdir), "which": which, "stage": chosen.stage, "step": chosen.step,
                  runs.BEST_BY: chosen.eval_reward}
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
    except CheckpointError as e:
        raise EvalInputError(f"the policy's tokenizer: {e}") from None
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None or not tokenizer.chat_template:
        raise EvalInputError(f"{tokenizer_dir}: the policy's tokenizer needs an eos token, a pad token and a "
                             "chat template")
    stop_tokens = (int(tokenizer.eos_token_id),)
    weights = loader.to_layout(weights, layout, per_layer=True)  # the sampler's decode form (no per-call copy)

    def generate(prompt_ids: Sequence[Sequence[int]], key: jax.Array) -> GenerationResult:
        return sampling.generate(weights, prompt_ids, key=key, n=1, max_new_tokens=max_new_tokens, sampler=sampler,
                                 stop_tokens=stop_tokens, pad_id=tokenizer.pad_token_id, layout=layout)

    return Policy(name, tokenizer, weights.cfg.max_position_embeddings, stop_tokens, generate, source)

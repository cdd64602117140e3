"""One-step off-policy GRPO (rl.off_policy_steps = 1; docs/training.md, "One-step off-policy"): the rollout of
step t + 1 is sampled and judged while step t updates, so a slow judge (another process, an HTTP API) costs no
device time. verl's one-step off-policy recipe and fully-async trainer, AReaL's decoupled PPO and SkyRL's async
trainer do the same.

Within step t: the sampler call of batch t + 1 is dispatched first (with θ_{t−1}, the params before update t) and
handed at once to a judging thread, which fetches it once the devices sampled it and judges it; the host then waits
for batch t's judging (handed over in step t − 1) and dispatches update t. So batch t + 1 is judged while batch t's
judging ends, update t runs and batch t + 2 is sampled: with two judging threads (a judge outside the process:
one_step_ahead.judging_plan says when) a step takes about max(S + U, (S + U + J) / 2) for sampling S, update U and
judging J, against S + J + U on-policy (docs/training.md, "One-step off-policy"). Batch t + 1 was sampled by the
params of step t − 1 (batches 1 and 2 by the starting params); every row logs `off_policy/sampler_step`, the
TrainState's step count (in stage steps) of the params that sampled its batch. One process only (the judging
thread's gather is a collective); evals wait for the judging threads first.

Log-probs (validated at start-up: rl.recompute_old_logprobs and rl.behaviour_correction_cap > 0): the
behaviour log-probs are the sampler's (θ_{t−2} for batch t), kept from the sampler call; `old_logp`, the
proximal policy the PPO ratio is clipped around, is recomputed teacher-forced from θ_{t−1}, the params the
update starts from; each token's loss is weighted by min(π_old / π_behaviour, cap) (AReaL's decoupled
objective, verl's truncated importance sampling).

Resume: the pending batch is regenerated, not saved. Each checkpoint at step t also saves (directory
`checkpoints/behaviour`, written before the GRPO checkpoint) the params that sampled batch t + 1 and the
iterator position before its questions were drawn; a resumed run samples and judges batch t + 1 again with
them and its key (`fold_in(key, 1000 + t + 1)`), which gives the same tokens and rewards as the killed run
(the sampler and the judges are deterministic given the key, as every resume here assumes). Saving the scored
batch instead would mean checkpointing the sampler's device log-probs, the judges' outputs and the samples.
"""

from __future__ import annotations

import dataclasses

from rubric_jax.train.blocks import RLBlock
from rubric_jax.train.dynamic import parse_group_selection


@dataclasses.dataclass(frozen=True)
class OffPolicy:
    """rl.off_policy_steps's setting: how many updates old the params that sample a batch may be (0 or 1)."""

    steps: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or self.steps not in (0, 1):
            raise ValueError(f"config.rl.off_policy_steps={self.steps!r}: expected 0 (on-policy) or 1")

    def check_processes(self, processes: int) -> None:
        """One process only: the judging thread gathers the batch's rows, a collective that must not interleave with
        the main thread's (one line)."""
        if self.steps and processes > 1:
            raise ValueError(f"config.rl.off_policy_steps={self.steps}: one-step off-policy runs on one process, this "
                             f"job has {processes}; set config.rl.off_policy_steps=0")


def off_policy(rl: RLBlock) -> OffPolicy:
    """rl.off_policy_steps, checked against the options it cannot combine with (one line each)."""
    setting = OffPolicy(rl.off_policy_steps)
    refill = ("rl.dynamic_sampling=True" if rl.dynamic_sampling else
              f"rl.group_selection={rl.group_selection!r}" if parse_group_selection(rl.group_selection) else None)
    if setting.steps and refill:
        raise ValueError(f"config.rl.off_policy_steps=1: cannot combine with {refill} (its refill rounds draw "
                         "questions mid-step, depending on rewards the pending batch has not got yet)")
    if setting.steps and not rl.recompute_old_logprobs:
        raise ValueError("config.rl.off_policy_steps=1: needs rl.recompute_old_logprobs=True (old_logp is recomputed "
                         "from the params the update starts from; the sampler's are a step older)")
    if setting.steps and not rl.behaviour_correction_cap:
        raise ValueError("config.rl.off_policy_steps=1: needs rl.behaviour_correction_cap > 0 (the importance "
                         "correction for the one-step-old sampler), e.g. 2.0")
    return setting

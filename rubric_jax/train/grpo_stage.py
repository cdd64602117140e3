"""The GRPO stage: rollouts -> rubric reward -> group advantages -> jitted sharded updates, with held-out evals.

Evals run before the first update (the SFT baseline), every `eval.every_steps` steps and at the end; every step
writes the reward-hacking monitors (train/monitors.py: alerts.jsonl) and every eval scores the golden set
(train/golden.py). A non-finite loss or gradient skips the update (train/step.py); `rl.max_nan_streak` skips
in a row stop the run. The KL reference is the policy GRPO started from, saved once so that a resumed run
keeps it; with LoRA (config.lora naming "grpo") it is the state's frozen base, which is that policy, never saved.
Per-step randomness is `fold_in(key, 1000 + step)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rubric_jax import data, distributed, loader, metrics, padding, sampling
from rubric_jax.judges.reward import Reward, RewardOutput, gather_outputs
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.train import (checkpointing, collect, dynamic, evolving, monitors, one_step_ahead, oscillation,
                              rollout, scaffold, state as train_state)
from rubric_jax.train import programs as run_programs
from rubric_jax.train.experiment import Experiment
from rubric_jax.qurl.textgen import judge_generator
from rubric_jax.train.runner import Runner, Stage, StepOutput, TrainingError

EVAL_SAMPLES = 4  # eval responses written to samples.jsonl per eval
_EVAL_KEY = 2**31 - 1  # fold_in data of the eval sampling key (GRPO step keys are 1000 + step)
_GOLDEN_REFERENCE_KEY = 1  # fold_in data (into the eval key) of the golden references' judge key, the same every eval
_AUDIT_KEY = 2  # fold_in data (into the eval key) of the audit judge's key
ADAPTER_KEY = 2**31 - 2  # fold_in data (into the run key) of the GRPO stage's fresh LoRA adapters
Refresh = Callable[[collect.Rollout, dict[str, Any]], dict[str, Any]]  # a step's rubric refresh (train/evolving.py)


@dataclasses.dataclass
class NanStreak:
    """Counts consecutive skipped (non-finite) updates and stops the run at `limit`."""

    limit: int
    count: int = 0

    def record(self, skipped: float, step: int, last_checkpoint: str) -> None:
        """Raises TrainingError naming the last good checkpoint once `limit` updates in a row were skipped."""
        self.count = self.count + 1 if skipped > 0 else 0
        if self.count >= self.limit:
            raise TrainingError(
                f"{self.count} GRPO updates in a row had a non-finite loss or gradient (up to step {step}); "
                f"stopping. The last good checkpoint is {last_checkpoint}. Lower rl.lr or check the rewards.")


def load_reference(exp: Experiment, state: train_state.TrainState, iterator_state: data.IteratorState
                   ) -> loader.Weights:
    """The frozen KL reference: the policy GRPO started from, saved once (step 0) so that a resumed run
    keeps it, and read back (params only) through the loader into the training layout."""
    with exp.checkpointer("reference") as ref_ckpt:
        if ref_ckpt.latest_step() is None:
            ref_ckpt.save(state, data_state=iterator_state.to_dict(), rubric_hash=exp.rubric_hash)
        return ref_ckpt.restore_params(exp.layouts.model, exp.layouts.training, step=0)


def grpo_iteration(exp: Experiment, programs: run_programs.GRPOPrograms, state: train_state.TrainState,
                   ref_params: Any | None, questions: list[data.Question], key: jax.Array,
                   draw: Callable[[], list[data.Question]] | None = None, hints: scaffold.StepHints | None = None,
                   refresh: Refresh | None = None
                   ) -> tuple[train_state.TrainState, StepOutput]:
    """One GRPO step: rollouts (with `rl.dynamic_sampling` or `rl.group_selection`, more rounds of questions from
    `draw` until enough groups are kept; with `hints`, rl.rubric_hints' scaffolded prompts) -> rubric reward ->
    group advantages -> rollout log-probs (reference; behaviour if `rl.recompute_old_logprobs`, else the
    sampler's) -> `rl.updates_per_batch` updates, dispatched; `grpo_row` reads the returned StepOutput's metrics. `refresh` (rl.rubric_refresh_every) reads the
    scored rollout and the step's host metrics once the advantages are computed, and returns metrics to add.

    `logprob_gap/mean` is the mean |teacher-forced − sampler| log-prob of the response tokens under the
    params that sampled (the first update's, or the recomputation's): float error on CPU float32, the
    decode drift to watch on accelerators in bf16.
    """
    out, extra_row = _rollout(exp, state.model_params(), questions, key, draw, hints)
    if hints is not None:
        extra_row = {**extra_row, **scaffold.hint_metrics(hints, *out.hint_counts_Nx3.T)}
    return train_on_rollout(exp, programs, state, ref_params, out, extra_row, refresh)


def train_on_rollout(exp: Experiment, programs: run_programs.GRPOPrograms, state: train_state.TrainState,
                     ref_params: Any | None, out: collect.Rollout, extra_row: dict[str, float],
                     refresh: Refresh | None = None) -> tuple[train_state.TrainState, StepOutput]:
    """`grpo_iteration` once the rollout `out` is scored: advantages, rollout log-probs (`old_logp` recomputed
    from `state.params` when `rl.recompute_old_logprobs`) and the updates, dispatched; `extra_row` joins the
    host metrics."""
    settings = exp.settings
    scored = out.scored
    signal = rollout.rollout_advantages(scored, programs.cfg, settings.config.rl.missing_scores, settings.shaping,
                                        **_advantage_context(exp, scored), lengths_N=out.lengths_N,
                                        truncated_N=out.truncated_N)
    (longest,) = distributed.max_over_processes(int(max(out.result.lengths.max(), 1)))
    batch = rollout.training_batch(out.sampled, out.groups, programs.cfg.group_size,
                                   padding.bucket_length(longest, settings.train_rollout.response_buckets),
                                   signal.advantages_N[out.rows], signal.trainable_N[out.rows], exp.mesh)
    batch, logprob_stats = run_programs.rollout_logprobs(programs, batch, state.model_params(), ref_params,
                                                         settings.config.rl.recompute_old_logprobs)
    updates = []
    for _ in range(settings.config.rl.updates_per_batch):
        state, update_metrics = programs.update(state, batch)
        updates.append(update_metrics)
    host_row = {**_reward_row(out, signal), **extra_row, **(out.timing.metrics() if out.timing else {})}
    host_row.update(monitors.step_monitors([s["response"] for s in out.samples], out.lengths_N, scored))
    host_row.update(exp.watch.redundancy(scored.dimension_ids, scored.scores, scored.valid))
    if exp.dynamic_weights is not None:
        host_row.update(exp.dynamic_weights.update(scored.dimension_ids, scored.scores, scored.valid))
    if refresh is not None:
        host_row.update(refresh(out, host_row))
    return state, StepOutput((updates, logprob_stats), host_row, out.samples[: settings.config.log.samples_per_step])


def _rollout(exp: Experiment, params: Any, questions: list[data.Question], key: jax.Array,
             draw: Callable[[], list[data.Question]] | None, hints: scaffold.StepHints | None = None
             ) -> tuple[collect.Rollout, dict[str, float]]:
    """The step's scored rollout (its groups selected with refill rounds when rl.dynamic_sampling or
    rl.group_selection is on; scaffolded with `hints`) and the selection's counts."""
    spec, rule = exp.settings.train_rollout, exp.settings.dynamic_sampling
    chunks = exp.settings.config.rl.rollout_chunks
    if rule is None:
        return collect.rollout_and_score(exp, params, questions, spec, key, chunks, hints), {}
    if draw is None:
        raise ValueError("grpo_iteration: rl.dynamic_sampling and rl.group_selection need `draw` (more questions "
                         "from the iterator)")
    return collect.dynamic_rollout(exp, params, questions, spec, key, draw, rule, _group_statistic(exp, rule), chunks,
                                   hints)


def _group_statistic(exp: Experiment, rule: dynamic.DynamicSampling
                     ) -> Callable[[collect.LocalRollout], np.ndarray]:
    """Per group of a sampled round, what `rule` selects on (train/dynamic.py): the reward spread for
    rl.dynamic_sampling, else the std of what the round's advantages would normalise."""
    settings, n = exp.settings, exp.settings.train_rollout.n
    if rule.rule == "spread":
        return lambda local: dynamic.group_spreads(local.scored.reward, local.scored.details["reward_ok"], n)

    def statistic(local: collect.LocalRollout) -> np.ndarray:
        inputs = rollout.advantage_inputs(local.scored, settings.config.rl.missing_scores, settings.shaping,
                                          **_advantage_context(exp, local.scored), lengths_N=local.result.lengths,
                                          truncated_N=local.result.finish_reason == sampling.FINISH_LENGTH)
        return dynamic.group_std(inputs.values_NxC, inputs.counted_NxC(), inputs.weights_NxC, n)

    return statistic


def _advantage_context(exp: Experiment, scored: RewardOutput) -> dict[str, Any]:
    """The rows' rubrics (per-dimension advantages only) and the run's dimension weights, as the advantages read
    them."""
    per_dimension = exp.settings.shaping.advantage == "per_dimension"
    return {"rubrics": _row_rubrics(exp, scored) if per_dimension else (), "weights": exp.weights}


def _reward_row(out: collect.Rollout, signal: rollout.Advantages) -> dict[str, float]:
    """A step's reward, advantage and length metrics (host values)."""
    summary = rollout.summarize_rewards(out.scored)
    return {"reward/mean": summary.reward_mean, **rollout.reward_metrics(summary, ""),
            "zero_std_frac": signal.zero_std_frac, "response_len/mean": float(out.lengths_N.mean()),
            "truncated_frac": float(out.truncated_N.mean()), **signal.metrics}


def grpo_row(out: StepOutput) -> dict[str, Any]:
    """A GRPO step's metrics: the updates' means read from the device, the first update's `logprob_gap/mean`
    unless the recomputation's, and the host metrics."""
    device_rows, stats = distributed.host_tree(out.device)
    row = {k: float(np.mean([u[k] for u in device_rows])) for k in device_rows[0]}
    row["logprob_gap/mean"] = float(device_rows[0]["abs_log_ratio"])  # the first update's, unless recomputed
    row.update({k: float(v) for k, v in stats.items()})
    return {**row, **out.host}


def _row_rubrics(exp: Experiment, scored: RewardOutput) -> list[Rubric]:
    """Each scored row's rubric (every process's rows, from the hashes the reward recorded)."""
    by_hash = {rubric.content_hash: rubric for rubric in exp.rubric_of.values()}
    return [by_hash[h] for h in scored.details["rubric_hashes"]]


def evaluate(exp: Experiment, state: train_state.TrainState, step: int) -> dict[str, float]:
    """Held-out rubric reward of one response per eval (and golden) question with the eval sampler (greedy
    by default); alerts on the golden set's agreement."""
    key = jax.random.fold_in(exp.key, _EVAL_KEY)
    out = collect.rollout_and_score(exp, state.model_params(), distributed.process_block(exp.eval_questions),
                                    exp.settings.eval_rollout, key)
    summary = rollout.summarize_rewards(out.scored)
    row = {"stage": "eval", "eval/reward_mean": summary.reward_mean, **rollout.reward_metrics(summary, "eval/"),
           "eval/response_len/mean": float(out.lengths_N.mean())}
    if exp.golden is not None:
        golden_scored = collect.rollout_and_score(exp, state.model_params(),
                                                  distributed.process_block(exp.golden.questions),
                                                  exp.settings.eval_rollout, key).scored
        with exp.base_judging(state.model_params())():  # the references are judged by the same judge
            row.update(exp.golden.metrics(golden_scored, OwnBlockScorer(exp.reward),
                                          key=jax.random.fold_in(key, _GOLDEN_REFERENCE_KEY), weights=exp.weights,
                                          store=exp.judge_store))
    if exp.audit is not None:
        row.update(exp.audit(step, out.samples, [exp.rubric_of[q.id] for q in exp.eval_questions], out.scored,
                             jax.random.fold_in(key, _AUDIT_KEY), exp.log.rows()))
    row = exp.watch.observe(step, row)
    exp.log.write(step, row)
    exp.log.write_samples(step, [{"stage": "eval", **s} for s in out.samples[:EVAL_SAMPLES]])
    return {k: v for k, v in row.items() if k != "stage"}


@dataclasses.dataclass(frozen=True)
class OwnBlockScorer:
    """`reward` of all rows, each process scoring its own block of them (every process must call it)."""

    reward: Reward

    def __call__(self, questions: Sequence[str], responses: Sequence[str], rubrics: Sequence[Rubric],
                 **kwargs: Any) -> RewardOutput:
        start, stop = distributed.block_bounds(len(responses))
        return gather_outputs(self.reward(questions[start:stop], responses[start:stop], rubrics[start:stop],
                                          **kwargs))


class GRPOStage(Stage):
    """GRPO from `params` (the SFT result's model params): the KL reference and the SFT baseline eval before the first
    step, evals every `eval.every_steps`, the learning-rate drop on oscillation, the NaN-streak stop. With LoRA
    (config.lora naming "grpo") fresh adapters on the SFT result are trained, and the reference is the state's frozen
    base (the SFT result itself: no reference checkpoint, no second copy)."""

    name = "grpo"

    def __init__(self, exp: Experiment, params: dict[str, Any]):
        rl, settings = exp.settings.rl, exp.settings
        self.exp, self.programs = exp, exp.programs.grpo
        self.total, self.rows, self.batch_size = rl.steps, exp.train_questions, rl.questions_per_step
        state_layout = exp.programs.grpo_state
        params = exp.layouts.stage_params(params, rl.lora is not None, jax.random.fold_in(exp.key, ADAPTER_KEY))
        self.state, self.shardings = state_layout.init(params), state_layout.shardings
        self.base_identity = exp.base_identity(self.name)
        self.updates_per_step = settings.config.rl.updates_per_batch
        self.keep_best = settings.config.checkpoint.keep_best
        self.nan_streak = NanStreak(rl.max_nan_streak)
        self.lr_drop = oscillation.LearningRateDrop(settings.oscillation) if settings.oscillation is not None else None
        self.ref_params: Any | None = None
        self.baseline: float | None = None
        self.ahead = one_step_ahead.OneStepAhead(exp, rl.steps, self.updates_per_step, self._key) if \
            settings.off_policy.steps else None  # rl.off_policy_steps=1: each batch sampled while the last updates
        self.hints = scaffold.schedule(settings.config.rl)  # rl.rubric_hints (None: off)
        self.refresher = _refresher(exp) if settings.config.rl.rubric_refresh_every else None

    def _key(self, step: int) -> jax.Array:
        """Step `step`'s rollout key."""
        return jax.random.fold_in(self.exp.key, 1000 + step)

    def start(self, restored: checkpointing.Restored | None, state: train_state.TrainState, start: int,
              progress: metrics.Progress) -> None:
        """Restores the dynamic weights and the monitors' window, loads the reference (none to load with LoRA: the
        frozen base) and the baseline eval (run now at step 0; else read back from the log, which process 0 wrote
        before the restart)."""
        exp = self.exp
        one_step_ahead.check_resume(restored, exp.settings.off_policy.steps)
        if self.ahead is not None:
            self.ahead.start(restored, start, exp.settings.config.seed)
        if restored is not None and exp.dynamic_weights is not None:
            exp.dynamic_weights.load_json(restored.extra["dynamic_weights"])
        if restored is not None:
            exp.watch.load_scores_json(restored.extra.get("redundancy_window", []))
        _restore_rubric(self.refresher, restored)
        iterator_state = data.IteratorState.from_dict(restored.data_state) if restored else data.IteratorState(
            seed=exp.settings.config.seed)
        if exp.settings.rl.beta > 0 and state.frozen is None:  # LoRA: the frozen base, read from each step's state
            self.ref_params = load_reference(exp, state, iterator_state).params
        if self.lr_drop is not None:
            self.lr_drop.restore(exp.log.rows(), float(train_state.lr_factor(state.opt_state)))
        if start == 0:
            row = evaluate(exp, state, 0)
            self.baseline = row["eval/reward_mean"]
            progress.write(metrics.format_eval_summary(0, row, reward_key="eval/reward_mean"))
        else:
            self.baseline = next(r["eval/reward_mean"] for r in exp.log.rows()
                                 if r.get("stage") == "eval" and r["step"] == 0)

    def step(self, state: train_state.TrainState, rows: list[Any], step: int, runner: Runner
             ) -> tuple[train_state.TrainState, StepOutput]:
        if self.lr_drop is not None:  # rl.lr_on_oscillation: the factor the logged rewards decide for this update
            state = state.replace(opt_state=self.lr_drop.before_step(state.opt_state, step))
        if self.ahead is not None:
            return self.ahead.step(state, rows, step, runner, lambda s, out, row: train_on_rollout(
                self.exp, self.programs, s, self._reference(s), out, row))
        hints = None if self.hints is None else scaffold.StepHints.at(self.hints, step, self.programs.cfg.group_size)
        return grpo_iteration(self.exp, self.programs, state, self._reference(state), rows, self._key(step),
                              runner.next_rows, hints, self._refresh(step))

    def _refresh(self, step: int) -> Refresh | None:
        """Step `step`'s rubric hook (rl.rubric_refresh_every): a refresh when due, else the version in use."""
        refresher = self.refresher
        if refresher is None:
            return None
        if not refresher.due(step):
            return lambda out, row: refresher.state.row()
        n = self.exp.settings.train_rollout.n
        return lambda out, row: refresher.refresh(
            step, [s["question"] for s in out.samples], [s["response"] for s in out.samples], out.scored.reward,
            np.asarray(out.scored.details["reward_ok"], bool), n, row)

    def _reference(self, state: train_state.TrainState) -> Any | None:
        """The reference's params: with LoRA the state's frozen base (no second copy; the state is donated each
        step, so taken from the current one), else the loaded reference (None when β = 0)."""
        return state.frozen if self.exp.settings.rl.beta > 0 and state.frozen is not None else self.ref_params

    def read_row(self, out: StepOutput) -> dict[str, Any]:
        return grpo_row(out)

    def observe(self, step: int, row: dict[str, Any]) -> dict[str, Any]:
        return self.exp.watch.observe(step, row if self.lr_drop is None else self.lr_drop.observe(step, row))

    def after_row(self, step: int, row: dict[str, Any], ckpt: checkpointing.Checkpointer) -> None:
        self.nan_streak.record(row["skipped"], step, f"{ckpt.directory} step {ckpt.latest_step()}")

    def eval_due(self, step: int) -> bool:
        return step % self.exp.settings.config.eval.every_steps == 0 or step == self.total

    def evaluate(self, step: int, state: train_state.TrainState, progress: metrics.Progress) -> float:
        if self.ahead is not None:
            self.ahead.settle()
        row = evaluate(self.exp, state, step)
        progress.write(metrics.format_eval_summary(step, row, self.baseline, reward_key="eval/reward_mean"))
        return row["eval/reward_mean"]

    def checkpoint_extra(self) -> dict[str, Any]:
        exp = self.exp
        weights = {} if exp.dynamic_weights is None else {"dynamic_weights": exp.dynamic_weights.to_json()}
        ahead = {} if self.ahead is None else self.ahead.checkpoint_extra()  # saves the pending batch's source first
        return {"updates_per_batch": exp.settings.config.rl.updates_per_batch, "judge_hash": exp.judge_hash,
                "reward_model_hash": exp.reward_model_hash, **weights,
                "redundancy_window": exp.watch.scores_to_json(), **ahead,
                **({} if self.refresher is None else {"rubric_evolution": self.refresher.state.to_json()})}


def _refresher(exp: Experiment) -> evolving.Refresher:
    """The run's rubric refresher: the first judge's LLM writes the proposals (rl.rubric_refresh_every)."""
    config = exp.settings.config
    return evolving.build_refresher(config.rl, config.qurl, judge_generator(exp.reward.judges[0], config.qurl.sampler),
                                    exp.reward, exp.train_questions, exp.rubric_of, exp.shared_rubric, exp.workdir,
                                    exp.key)


def _restore_rubric(refresher: evolving.Refresher | None, restored: checkpointing.Restored | None) -> None:
    """The evolved rubric a GRPO checkpoint saved; a checkpoint with one resumes only with rl.rubric_refresh_every on
    (its training questions were scored with that rubric, not the starting one)."""
    saved = restored.extra.get("rubric_evolution") if restored is not None else None
    if refresher is not None:
        refresher.restore(saved)
    elif saved is not None:
        raise TrainingError(f"config.rl.rubric_refresh_every=0: the GRPO checkpoint was written by a run whose rubric "
                            f"evolved to version {saved['versions'][-1]['version']}; resume it with "
                            "rl.rubric_refresh_every > 0")

"""Ahead-of-time proof of a config's per-device memory and communication, without weights or accelerators.

`dry_run(config, target)` builds every program a run of `config` compiles, from the config alone, with
abstract inputs (ShapeDtypeStructs in their shardings), compiles each one for the configured meshes and
reads what the compiler planned: per-device memory (`compiled.memory_analysis()`) and collectives
(`rubric_jax.hlo_stats`). The programs, at the largest length bucket (the worst case):
  SFT step · GRPO update · rollout log-probs (reference, or recomputed behaviour) · rollout (prefill +
  decode) · eval rollout · judge call (one per LLM judge) · reward-model forward (reward.source=reward_model).
Model shapes come from the checkpoint's config.json, or, when that directory does not exist on this
machine, from a bundled copy of the public config of the same name (rubric_jax/assets/model_shapes).

Targets: "cpu" compiles for the local CPU devices: a smoke check, not a proof, because the CPU backend
upcasts bfloat16 dots to float32 and does not bound memory as the GPU compiler does. A GPU name from
rubric_jax.aot_targets compiles with XLA's GPU compiler on this CPU machine (jax[cuda12-local], see
requirements-aot.txt) for a topology of that GPU: that is the proof.

`programs` (`--dry_run_programs`) compiles a subset, named by PROGRAMS' keys (e.g. "grpo_update,logprobs" while
working on the training step: the 7B decode programs take minutes of CPU each).

Per-device memory of a phase = the program's peak (arguments + outputs + temporaries - aliased
buffers, as the compiler reports it) + the long-lived arrays that live beside it and are not among its
arguments (policy params and AdamW moments, reference, judges), summed from their shard shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies

from rubric_jax import aot_targets, config_boundary, hlo_stats, loader, sampling, sharding
from rubric_jax.assets import MODEL_SHAPES_DIR
from rubric_jax.judges import reward_model
from rubric_jax.judges.loading import check_tensor_divides
from rubric_jax.judges.spec import JudgeSpec, prompt_budget
from rubric_jax.models.config import ModelConfig
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.train import blocks, micro_batching, programs as run_programs, settings as run_settings, step as train_step

CPU = "cpu"
TARGETS = (CPU, *aot_targets.TARGETS)
GIB = 1 << 30
MIB = 1 << 20
# The programs a dry run can compile, by the key `--dry_run_programs` names them with (the judge and reward-model
# keys stand for every LLM judge's call and the reward model's forward).
PROGRAMS = {"sft": "SFT step", "grpo_update": "GRPO update", "logprobs": "rollout log-probs", "rollout": "rollout",
            "eval_rollout": "eval rollout", "judge": "judge calls", "reward_model": "reward-model forward"}
_PAD_ID = 0  # any id: the programs take the pad id as data
# The cpu target only reads what the compiler planned and never runs the programs: skip LLVM's
# optimisation of the machine code (buffer assignment and collectives are decided before it).
_CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@dataclasses.dataclass(frozen=True)
class ProgramReport:
    """What the compiler planned for one program, per device."""

    name: str
    shapes: str  # the inputs in words, e.g. "256 rows x 3072 tokens, 8 micro-batches"
    arguments: int  # bytes
    outputs: int
    temporaries: int
    aliased: int  # outputs written into donated arguments
    peak: int  # the compiler's peak (arguments + outputs + temporaries - aliased)
    collectives: dict[str, hlo_stats.KindSummary]
    compile_seconds: float
    beside: tuple[str, ...]  # long-lived arrays (keys of DryRunReport.resident) alive beside it
    tokens_per_iteration: int  # a decode loop: the tokens one iteration generates (0 for other programs)
    ops: tuple[hlo_stats.Collective, ...] = ()  # every collective op, for questions by shape or dtype


@dataclasses.dataclass(frozen=True)
class DryRunReport:
    """Every program of a config compiled for one target."""

    target: str
    device_kind: str
    device_memory: int | None  # bytes per device; None on the cpu target
    num_devices: int
    meshes: str
    resident: dict[str, int]  # long-lived array group -> bytes per device
    programs: list[ProgramReport]
    micro_batches: micro_batching.Choice | None = None  # rl.micro_batches=0: the count chosen by memory

    def phase_bytes(self, program: ProgramReport) -> int:
        """Per-device bytes while `program` runs: its peak plus the long-lived arrays beside it."""
        return program.peak + sum(self.resident[name] for name in program.beside)


# ----------------------------------------------------------------------------------------- devices
def target_devices(target: str, num_devices: int) -> list[jax.Device]:
    """`num_devices` devices to compile for: local CPU devices, or a topology of GPUs of `target`
    (8 per host) described to XLA's GPU compiler by rubric_jax.aot_targets."""
    if target not in TARGETS:
        raise ValueError(f"--dry_run_target={target!r}: expected one of {TARGETS}")
    if num_devices < 1:
        raise ValueError(f"--dry_run_devices={num_devices}: must be >= 1")
    if target == CPU:
        devices = jax.devices("cpu")
        if len(devices) < num_devices:
            raise ValueError(f"the cpu dry run needs {num_devices} CPU devices and jax has {len(devices)}: set "
                             f"XLA_FLAGS=--xla_force_host_platform_device_count={num_devices} before jax starts")
        return devices[:num_devices]
    per_host = min(num_devices, 8)
    if num_devices % per_host:
        raise ValueError(f"--dry_run_devices={num_devices}: a GPU topology has up to 8 devices per host; use a "
                         "multiple of 8 above 8")
    text = aot_targets.target_config_text(aot_targets.get_target(target))
    try:
        topology = topologies.get_topology_desc(platform="cuda", target_config=text,
                                                topology=f"1x{num_devices // per_host}x{per_host}")
    except Exception as e:  # no CUDA plugin: jax raises RuntimeError / JaxRuntimeError / ValueError by version
        raise ValueError(f"--dry_run_target={target} needs XLA's GPU compiler, which this Python environment "
                         f"lacks ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}); run it through "
                         "./launch.sh, which makes .venv-aot from requirements-aot.txt") from e
    return list(topology.devices)


# ------------------------------------------------------------------------------------------ shapes
@contextlib.contextmanager
def cudnn_of_this_build() -> Iterator[None]:
    """Lets cuDNN attention lower on a machine without the cuDNN library. jax asks the library its version
    before it lowers `jax.nn.dot_product_attention(implementation="cudnn")` (jax 0.10.2,
    jax/_src/cudnn/fused_attention_stablehlo.py: `check_cudnn_version` -> `cuda_versions.cudnn_get_version()`,
    which raises "cuDNN not found."), although XLA's GPU compiler compiles the custom call without it. The
    version only gates checks that do not apply to our shapes (fp8, MLA, compute capability 10.3), so
    inside this block jax is answered with the version this jaxlib was built against
    (`cudnn_build_version`, 9.8.0 for 0.10.2), the one a GPU install of it ships. A no-op where cuDNN loads,
    and where these private modules are not where jax 0.10.2 keeps them (imported here, not at the top, so
    that a GPU machine's other jax still imports this module)."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo
        from jax._src.lib import cuda_versions
    except ImportError:
        cuda_versions = None
    if cuda_versions is None or _cudnn_loads(cuda_versions):  # no CUDA plugin (no GPU target), or a real cuDNN
        yield
        return
    check = fused_attention_stablehlo.check_cudnn_version
    fused_attention_stablehlo.check_cudnn_version = cuda_versions.cudnn_build_version
    try:
        yield
    finally:
        fused_attention_stablehlo.check_cudnn_version = check


def _cudnn_loads(cuda_versions: Any) -> bool:
    try:
        cuda_versions.cudnn_get_version()
    except RuntimeError:
        return False
    return True


def shapes_file(directory: str, key: str) -> Path:
    """The HF config.json of `directory`, or the bundled public config named like its last part when the
    directory does not exist here (weights are never needed for a dry run)."""
    path = Path(directory)
    if (path / "config.json").is_file():
        return path / "config.json"
    bundled = MODEL_SHAPES_DIR / f"{path.name}.json"
    if not bundled.is_file():
        known = sorted(p.stem for p in MODEL_SHAPES_DIR.glob("*.json"))
        raise ValueError(f"config.{key}={directory}: no config.json there and no bundled shapes named "
                         f"{path.name!r} (bundled: {known}); point it at a directory with a config.json")
    return bundled


def policy_config(model: blocks.ModelBlock, target: str = CPU) -> ModelConfig:
    """The policy's ModelConfig as the run builds it on `target` (`settings.model_config`), reading the shapes
    from `shapes_file` when the checkpoint directory is not on this machine."""
    backend = "cpu" if target == CPU else "gpu"
    if not model.checkpoint:
        return run_settings.model_config(model, backend)
    shapes = dataclasses.replace(model, config_json=str(shapes_file(model.checkpoint, "model.checkpoint")),
                                 checkpoint="")
    return run_settings.model_config(shapes, backend)


def judge_configs(judge: JudgeSpec, target: str) -> list[tuple[str, ModelConfig]]:
    """(name, ModelConfig) of every LLM judge loaded into the run's devices, in the dtypes it is loaded in on
    `target` (none with judge.backend=openai: the endpoint judges, its checkpoint is only a tokenizer)."""
    if judge.backend == "openai":
        return []
    backend = "cpu" if target == CPU else "gpu"
    dtypes = {field: loader.resolve_dtype(getattr(judge, field), f"config.judge.{field}", backend=backend)
              for field in ("param_dtype", "compute_dtype")}
    judges = []
    for directory in judge.checkpoints:
        hf = json.loads(shapes_file(directory, "judge.checkpoint").read_text())
        judges.append((Path(directory).name, ModelConfig.from_hf_dict(hf, **dtypes)))
    return judges


def _judge_layout(mesh: jax.sharding.Mesh, tensor: int, judges: Sequence[tuple[str, ModelConfig]]
                  ) -> sharding.Layout:
    """The judges' decode layout (config.judge.tensor), checked as judges/loading.load_judges checks it."""
    try:
        layout = sharding.decode_layout(mesh, tensor)
    except ValueError as e:
        raise ValueError(f"config.judge.tensor={tensor}: {e}") from None
    for name, cfg in judges:
        try:
            check_tensor_divides(tensor, cfg, "config.judge")
        except ValueError as e:
            raise ValueError(f"judge {name}: {e}") from None
    return layout


def reward_model_shapes(reward: blocks.RewardBlock, settings: reward_model.RewardModelConfig
                        ) -> tuple[str, ModelConfig]:
    """(name, ModelConfig) of the reward model in `reward.model_dtype`, as the run loads it, checked as the
    run checks it (one label, `reward.model_max_len` within its context)."""
    directory = reward.model_checkpoint
    dtype = loader.resolve_dtype(reward.model_dtype, "reward.model_dtype")
    hf = json.loads(shapes_file(directory, "reward.model_checkpoint").read_text())
    cfg = ModelConfig.from_hf_dict(hf, param_dtype=dtype, compute_dtype=dtype)
    if cfg.num_labels != 1:
        raise ValueError(f"config.reward.model_checkpoint={directory}: a reward model is a "
                         f"*ForSequenceClassification config with one label, not num_labels={cfg.num_labels}")
    reward_model.check_context(settings, cfg, directory)
    return Path(directory).name, cfg


# ---------------------------------------------------------------------------------------- compiling
def _compile(name: str, shapes: str, lower: Callable[[], jax.stages.Lowered], beside: Sequence[str],
             tokens_per_iteration: int, options: dict[str, Any], progress: Callable[[str], None],
             done: tuple[jax.stages.Compiled, float] | None = None) -> ProgramReport:
    """Lowers and compiles one program (or takes the `done` compile and its seconds) and reads its memory plan
    (`micro_batching.peak_bytes`) and collectives."""
    if done is None:
        progress(f"compiling {name} ({shapes}) ...")
        start = time.perf_counter()
        compiled = lower().compile(compiler_options=options)
        seconds = time.perf_counter() - start
    else:
        progress(f"{name} ({shapes}): compiled choosing rl.micro_batches")
        compiled, seconds = done
    memory = compiled.memory_analysis()
    peak = micro_batching.peak_bytes(memory)
    text = compiled.as_text()
    found = hlo_stats.collectives(text)
    fused = sum(n for target, n in hlo_stats.custom_calls(text).items() if target.startswith(hlo_stats.CUDNN_ATTENTION))
    progress(f"  {name}: peak {peak / GIB:.2f} GiB per device, compiled in {seconds:.1f} s"
             + (f", {fused} cuDNN attention calls" if fused else ""))
    return ProgramReport(name, shapes, memory.argument_size_in_bytes, memory.output_size_in_bytes,
                         memory.temp_size_in_bytes, memory.alias_size_in_bytes, peak,
                         hlo_stats.summarize(found), seconds, tuple(beside), tokens_per_iteration,
                         tuple(found))


def _lower_generate(weights: loader.Weights, layout: sharding.Layout, *, prompts: int, prompt_len: int, n: int,
                    max_new_tokens: int, sampler: str, response_buckets: Sequence[int] | None = None
                    ) -> jax.stages.Lowered:
    """The sampler's program for `prompts` full-length prompts (`sampling.lower_generate`; a rollout's output
    rows as wide as its `response_buckets`)."""
    prompt_ids = np.ones((prompts, prompt_len), np.int32)
    return sampling.lower_generate(weights, prompt_ids, prompt_mask=np.ones_like(prompt_ids, bool), n=n,
                                   max_new_tokens=max_new_tokens, sampler=sampler, stop_tokens=[1], pad_id=_PAD_ID,
                                   layout=layout, response_buckets=response_buckets)


def _lower_reward_model(weights: loader.Weights, layout: sharding.Layout, rows: int, length: int
                        ) -> jax.stages.Lowered:
    """The reward model's forward (`reward_model.forward_program`) for `rows` chats of `length` tokens."""
    batch = sharding.batch_sharding(layout.mesh, (rows, length))
    tokens = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=batch)
    mask = jax.ShapeDtypeStruct((rows, length), jnp.bool_, sharding=batch)
    return reward_model.forward_program(weights.graphdef, layout.mesh).lower(weights.params, tokens, mask)


def judge_prompts_per_call(config: blocks.ExperimentConfig) -> int:
    """The most prompts one judge `generate` call gets: every (response, criteria prompt, sample) of the
    larger of a rollout and an eval, capped by `judge.batch_size` (0: no cap). Per-dimension prompts are
    counted from the LLM dimensions of `data.rubric` when the cap does not already bind."""
    cap = config.judge.batch_size
    responses = max(config.rl.questions_per_step * config.rl.group_size, config.eval.max_questions)
    at_least = responses * config.judge.samples  # one prompt per response and sample
    if config.judge.mode == "all_criteria" or (cap and at_least >= cap):
        return min(at_least, cap) if cap else at_least
    if not config.data.rubric:
        raise ValueError(f"config.judge.mode=per_dimension: the dry run counts the LLM dimensions of "
                         f"config.data.rubric, which is empty; set it, or config.judge.batch_size <= {at_least}")
    prompts = at_least * max(1, sum(d.judged for d in load_rubric(config.data.rubric).dimensions))
    return min(prompts, cap) if cap else prompts


def parse_programs(text: str) -> frozenset[str]:
    """The PROGRAMS keys of a comma-separated `--dry_run_programs` value ("" or "all": every program)."""
    keys = frozenset(k.strip() for k in text.split(",") if k.strip())
    if not keys or keys == {"all"}:
        return frozenset(PROGRAMS)
    unknown = sorted(keys - set(PROGRAMS))
    if unknown:
        raise ValueError(f"--dry_run_programs={text!r}: unknown {unknown}; expected comma-separated keys of "
                         f"{list(PROGRAMS)} (or all)")
    return keys


def dry_run(resolved: config_boundary.ConfigDict, target: str = CPU, num_devices: int = 8,
            progress: Callable[[str], None] = print, programs: frozenset[str] = frozenset(PROGRAMS),
            memory_limit: int | None = None) -> DryRunReport:
    """Compiles the `programs` (PROGRAMS keys; default all) that a run of the `resolved` config compiles, for
    `num_devices` devices of `target`; see the module docstring. `progress` gets a line per program. With
    rl.micro_batches=0 the count is chosen as the run chooses it, against `memory_limit` bytes per device if given,
    else what the GPU target's allocator would get (the cpu target has no limit: 1)."""
    if not programs or not programs <= set(PROGRAMS):
        raise ValueError(f"programs={sorted(programs)}: expected a non-empty subset of {list(PROGRAMS)}")
    config = config_boundary.experiment(resolved)  # the boundary: blocks from here on
    settings = run_settings.validate(config)  # every value checked as the run checks it, before compiling
    devices = target_devices(target, num_devices)
    model_cfg = policy_config(config.model, target)
    judges = judge_configs(config.judge, target)
    scorer = reward_model_shapes(config.reward, settings.reward_model) if settings.reward_model is not None else None
    lay = run_programs.layouts(settings.mesh, model_cfg, devices, settings.lora)
    mesh, decode_layout = lay.mesh, lay.decode
    rl = config.rl
    prompt_len = max(settings.train_rollout.prompt_buckets)
    response_len = max(settings.train_rollout.response_buckets)
    sft_len = prompt_len + max(settings.sft_response_buckets)
    rollouts = rl.questions_per_step * rl.group_size
    shared = config.judge.share_policy_base  # the judge reads the policy's base: no judge weights of its own
    judge_rows = (judge_prompts_per_call(config) if (judges or shared) and "grpo" in config.stages
                  else 0)  # fails before compiling

    others: dict[str, int] = {}  # long-lived arrays beside the training state
    lora_grpo = settings.rl is not None and settings.rl.lora is not None
    if rl.beta > 0 and not lora_grpo:  # the policy's layout and dtype (grpo_stage.load_reference); with LoRA the
        others["reference params"] = micro_batching.per_device_bytes(  # reference is the frozen base: no copy
            loader.abstract_weights(model_cfg, lay.training).params)
    train_arrays: tuple[str, ...] = ("policy params", "AdamW moments")
    judge_layout = _judge_layout(mesh, settings.config.judge.tensor, judges)
    judge_weights = {f"judge {name}": loader.abstract_weights(cfg, judge_layout, per_layer=True)  # as load_judges
                     for name, cfg in judges}
    scorer_weights = dict(judge_weights)  # every model that scores rollouts: it lives beside every program
    if scorer is not None:
        scorer_weights[f"reward model {scorer[0]}"] = loader.abstract_weights(scorer[1], decode_layout)
    others.update({name: micro_batching.per_device_bytes(w.params) for name, w in scorer_weights.items()})
    scorer_names, reference = tuple(scorer_weights), tuple(k for k in others if k == "reference params")
    options = _CPU_COMPILER_OPTIONS if target == CPU else {}
    # The run's own layouts and programs (train/programs.py, as `experiment.build` makes them); the SFT schedule's
    # length comes from the data and changes constants only, not memory or collectives.
    with cudnn_of_this_build():
        built = run_programs.build(settings, lay, config.sft.warmup_steps + 1,
                                   _memory(target, memory_limit, sum(others.values())), tuple(options.items()))
    if built.auto is not None:
        progress(built.auto.line())
    state = (built.grpo_state or built.sft_state).abstract_state
    resident = {"policy params": micro_batching.per_device_bytes(state.params),
                "AdamW moments": micro_batching.per_device_bytes(state.opt_state)}
    if state.frozen is not None:  # LoRA: the params are the adapters; the base is frozen in the compute dtype
        resident["frozen base"] = micro_batching.per_device_bytes(state.frozen)
        train_arrays += ("frozen base",)
    resident.update(others)

    reports: list[ProgramReport] = []

    def add(key: str, name: str, shapes: str, lower: Callable[[], jax.stages.Lowered], beside: Sequence[str],
            tokens_per_iteration: int = 0, done: tuple[jax.stages.Compiled, float] | None = None) -> None:
        if key in programs:
            with cudnn_of_this_build():
                reports.append(_compile(name, shapes, lower, beside, tokens_per_iteration, options, progress, done))

    if built.sft_step is not None:
        sft_batch = run_programs.abstract_batch(train_step.SFT_BATCH_KEYS, config.sft.batch_size, sft_len, mesh)
        add("sft", "SFT step", f"{config.sft.batch_size} x {sft_len} tokens",
            lambda: built.sft_step.lower(built.sft_state.abstract_state, sft_batch), scorer_names)
    if built.grpo is not None:
        grpo, grpo_state = built.grpo, built.grpo_state.abstract_state
        batch = run_programs.abstract_batch(train_step.grpo_batch_keys(grpo.cfg), rollouts, response_len, mesh,
                                            prompt_len, rl.questions_per_step)
        micro = (f"{rl.questions_per_step} x ({prompt_len} + {rl.group_size} x {response_len}) tokens, "
                 f"{built.micro_batches} micro-batches")
        chosen = built.auto if built.auto is not None and built.auto.compiled is not None else None
        add("grpo_update", "GRPO update", micro, lambda: grpo.update.lower(grpo_state, batch),
            reference + scorer_names, done=None if chosen is None else (chosen.compiled, chosen.compile_seconds))
        if rl.beta > 0 or rl.recompute_old_logprobs:
            add("logprobs", "rollout log-probs", micro,
                lambda: grpo.logprobs.lower(grpo_state.model_params(), *train_step.logprob_inputs(batch)),
                train_arrays + scorer_names)
        if rl.beta > 0 and grpo.ref_logprobs is not None:  # LoRA: the reference reads the frozen base alone
            add("logprobs", "reference log-probs (frozen base)", micro,
                lambda: grpo.ref_logprobs.lower(grpo_state.frozen, *train_step.logprob_inputs(batch)),
                train_arrays + scorer_names)
        rollout_policy = lay.abstract_rollout_weights()  # what the stages sample with (Layouts.rollout_weights)
        beside = train_arrays + reference + scorer_names
        for key, prompts, spec in (("rollout", rl.questions_per_step, settings.train_rollout),
                                   ("eval_rollout", config.eval.max_questions, settings.eval_rollout)):
            add(key, PROGRAMS[key], f"{prompts} x {spec.n} x ({prompt_len} + {spec.max_new_tokens}) tokens",
                lambda prompts=prompts, spec=spec: _lower_generate(
                    rollout_policy, decode_layout, prompts=prompts, prompt_len=prompt_len, n=spec.n,
                    max_new_tokens=spec.max_new_tokens, sampler=spec.sampler, response_buckets=spec.response_buckets),
                beside, sampling.layout_steps_per_check(decode_layout, spec.max_new_tokens))
        # judge.share_policy_base: the base's decode copy, made per rollout as the policy's (an argument of the call,
        # not a long-lived array: the base itself is the frozen base beside it).
        calls = [(name, weights, judge_layout) for name, weights in judge_weights.items()]
        calls += [("judge policy base", lay.abstract_rollout_weights(), decode_layout)] if shared else []
        for name, weights, layout in calls:
            others = train_arrays + reference + tuple(n for n in scorer_names if n != name)
            # The longest prompt load_judge lets through (the sampler pads it to its bucket).
            judge_len = prompt_budget(weights.cfg.max_position_embeddings, config.judge.max_new_tokens)
            add("judge", f"{name} call", f"{judge_rows} x ({judge_len} + {config.judge.max_new_tokens}) tokens",
                lambda w=weights, p=judge_len, lay_=layout: _lower_generate(
                    w, lay_, prompts=judge_rows, prompt_len=p, n=1, max_new_tokens=config.judge.max_new_tokens,
                    sampler=config.judge.sampler),
                others, sampling.layout_steps_per_check(layout, config.judge.max_new_tokens))
        if scorer is not None:  # the reward model's largest call: the most rows at the longest bucket
            name = f"reward model {scorer[0]}"
            rows = reward_model.rows_per_call(settings.reward_model, max(rollouts, config.eval.max_questions),
                                              decode_layout.mesh)
            length = reward_model.longest_bucket(settings.reward_model)
            add("reward_model", f"{name} forward", f"{rows} x {length} tokens",
                lambda: _lower_reward_model(scorer_weights[name], decode_layout, rows, length),
                train_arrays + reference)
    kind = devices[0].device_kind
    device_memory = None if target == CPU else aot_targets.get_target(target).memory_bytes
    meshes = (f"training mesh {_mesh_words(mesh)}; decode mesh {_mesh_words(decode_layout.mesh)} "
              f"(policy decode copy in {lay.decode_dtype})")
    return DryRunReport(target, kind, device_memory, len(devices), meshes, resident, reports, built.auto)


def _memory(target: str, limit: int | None, beside: int) -> micro_batching.Memory:
    """What rl.micro_batches=0 chooses against in a dry run: `limit` bytes per device if given, else the GPU
    target's as its allocator would get it; the cpu target reports none."""
    if limit is not None:
        return micro_batching.Memory(limit, beside, "the given limit")
    if target == CPU:
        return micro_batching.Memory(None, source="the cpu target reports no memory limit")
    gpu = aot_targets.get_target(target)
    return micro_batching.target_memory(gpu.memory_bytes, beside, gpu.description)


def _mesh_words(mesh: jax.sharding.Mesh) -> str:
    return " x ".join(f"{axis} {size}" for axis, size in mesh.shape.items())


# ---------------------------------------------------------------------------------------- the table
def _unit(report: DryRunReport) -> tuple[str, int]:
    """GiB, or MiB when every phase is under 1 GiB (the tiny default), so that no cell reads 0.00."""
    largest = max((report.phase_bytes(p) for p in report.programs), default=GIB)
    return ("GiB", GIB) if largest >= GIB else ("MiB", MIB)


def _collective_cell(summary: hlo_stats.KindSummary, tokens_per_iteration: int = 0, unit: int = GIB) -> str:
    """Ops / size per run, or per generated token of a decode loop (its per-iteration figures over the tokens one
    iteration generates: 8 on a GPU, `sampling.STEPS_PER_CHECK`)."""
    count, size = ((summary.per_iteration_count / tokens_per_iteration, summary.per_iteration_bytes / tokens_per_iteration)
                   if tokens_per_iteration else (summary.count, summary.bytes))
    return "-" if count == 0 else f"{count:.4g} / {size / unit:.3g}"


def format_report(report: DryRunReport, config_name: str = "") -> str:
    """The dry run as plain-text tables: long-lived arrays, per-program memory, collectives."""
    compiler = ("the CPU backend (a smoke check, not a GPU proof: it upcasts bf16 dots and does not bound "
                "memory like the GPU compiler)" if report.target == CPU else "XLA's GPU compiler")
    name, unit = _unit(report)

    def amount(x: int) -> str:
        return f"{x / unit:.2f}"

    lines = [f"Dry run{' of ' + config_name if config_name else ''}: {report.num_devices} x {report.device_kind}, "
             f"compiled by {compiler}, jax {jax.__version__}",
             report.meshes, "", f"Long-lived arrays, {name} per device"]
    lines += [f"  {group:<44}{amount(size):>8}" for group, size in report.resident.items()]
    header = (f"{'program':<36}{'inputs':<46}{'args':>7}{'out':>7}{'temp':>7}{'alias':>7}{'peak':>7}"
              f"{'beside':>8}{'total':>8}{'compile s':>10}")
    lines += ["", f"Per-program memory, {name} per device (total = peak + the long-lived arrays beside it)", header]
    for p in report.programs:
        beside = report.phase_bytes(p) - p.peak
        lines.append(f"{p.name:<36}{p.shapes:<46}{amount(p.arguments):>7}{amount(p.outputs):>7}"
                     f"{amount(p.temporaries):>7}{amount(p.aliased):>7}{amount(p.peak):>7}{amount(beside):>8}"
                     f"{amount(report.phase_bytes(p)):>8}{p.compile_seconds:>10.1f}")
    if report.programs:
        worst = max(report.programs, key=report.phase_bytes)
        limit = "" if report.device_memory is None else f" of {report.device_memory / GIB:.2f} GiB"
        lines.append(f"largest: {worst.name}, {report.phase_bytes(worst) / GIB:.2f} GiB{limit} per device")
    if report.micro_batches is not None:
        lines.append(report.micro_batches.line())
    kinds = hlo_stats.KINDS
    lines += ["", f"Collectives per device: ops / {name} per run (decode loops: per generated token)",
              f"{'program':<44}" + "".join(f"{k:>20}" for k in kinds)]
    for p in report.programs:
        rows = [("", 0)] + ([(" per token", p.tokens_per_iteration)] if p.tokens_per_iteration else [])
        for suffix, tokens in rows:
            lines.append(f"{p.name + suffix:<44}"
                         + "".join(f"{_collective_cell(p.collectives[k], tokens, unit):>20}" for k in kinds))
    return "\n".join(lines)

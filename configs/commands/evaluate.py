"""experiments.evaluate's settings: the benchmark, the policy's mesh and generation. The judge is --judge (default:
configs/judges/<benchmark>.py).

  ./launch.sh experiments.evaluate --config.benchmark=hellobench --data_dir=DIR --workdir=RUN --out=DIR
"""

import ml_collections

from configs.common import mesh_block, sampler_block
from rubric_jax import counts


# Every integer setting: (smallest, largest), checked by experiments/cli.py before any work (rubric_jax/counts.py).
COUNT_BOUNDS = {"seed": (0, counts.SEED), "limit": (0, 10**7), "policy.max_new_tokens": (1, counts.TOKENS),
                "policy.batch_size": (1, 1 << 16), "mesh.data": (-1, counts.DEVICES), "mesh.fsdp": (-1, counts.DEVICES),
                "mesh.tensor": (-1, counts.DEVICES)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant)."""
    del arg
    c = ml_collections.ConfigDict()
    c.benchmark = ""  # hellobench, longbench_write, healthbench, biggen or rubric_set (required).
    c.limit = 0  # Evaluate only the first N cases (HelloBench: of each task); 0 = all.
    c.models = ""  # With --judgements: comma-separated models to score (each must be complete); "" = every one.
    c.which = "latest"  # With --workdir: latest, or best (highest logged eval/reward_mean).
    c.seed = 0  # PRNG seed of policy and judge sampling.
    c.mesh = mesh_block()  # The policy's mesh (data, fsdp, tensor; -1: the remaining devices).
    c.policy = sampler_block(sampler="greedy", max_new_tokens=2048)  # How the policy answers.
    c.policy.batch_size = 16  # Prompts per sampler call.
    c.policy.prompt_format = "plain"  # plain, or think_answer (rubric_jax's training format).
    return c

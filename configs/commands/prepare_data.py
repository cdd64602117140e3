"""experiments.prepare_data's settings: the splits, the difficulty mix and deduplication.

  ./launch.sh experiments.prepare_data --input=questions:Q.jsonl --out=runs/tfds --name=NAME --config.eval_size=16
"""

import ml_collections

from rubric_jax import counts

# Every integer setting: (smallest, largest), checked by experiments/cli.py before any work (rubric_jax/counts.py).
COUNT_BOUNDS = {"seed": (0, counts.SEED), "eval_size": (0, 10**7), "golden_size": (0, 10**7), "train_size": (0, 10**8),
                "dedup.ngram": (1, 64), "dedup.num_perm": (1, 1024)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` is unused (one variant). The fields are rubric_jax/prepare/pipeline.py PrepareConfig's."""
    del arg
    c = ml_collections.ConfigDict()
    c.seed = 0  # Seed of the MinHash functions and the split and mix sampling.
    c.overwrite = False  # Replace an existing OUT/NAME.
    c.eval_size = 0  # Held-out eval questions (split 'eval').
    c.golden_size = 0  # Golden questions (split 'golden').
    c.train_size = 0  # Training questions; 0 = as many as the ratio allows.
    c.difficulty_ratio = "3:5:2"  # easy:medium:hard of the training split (RubricRL §5.1), or none.
    c.dedup = ml_collections.ConfigDict()
    c.dedup.threshold = 0.7  # Character n-gram Jaccard at which questions are duplicates.
    c.dedup.ngram = 3  # Character n-gram size.
    c.dedup.num_perm = 128  # MinHash signature length.
    c.dedup.semantic_words = 0.7  # Content-word Jaccard at which questions are paraphrases (docs/data.md); 0 = off.
    c.dedup.semantic_cosine = 0.95  # Embedding cosine at which questions are paraphrases (with --semantic_model).
    return c

"""QuRL's ablation table as configs: one variant per row, for Qwen2.5 (7b, 1.5b, 0.5b) and as a tiny CPU run.

  --config=configs/qurl_ablation.py:variant=VARIANT,size=SIZE      (defaults: variant=full, size=7b)

| variant       | QuRL row (Qwen2.5-7B, avg) | what differs from `full`                                       |
|---------------|----------------------------|----------------------------------------------------------------|
| full          | Full (QuRL)          59.3  | case-wise R*(q): retrieval + meta-descriptions + K=4 + filter  |
| no_filter     | w/o rubrics filter   52.2  | qurl.num_candidates=1, min_support=1, min_std=min_spread=0     |
| no_references | w/o web information  48.9  | qurl.top_k=0: rubrics written from the question alone          |
| checklist     | w/o rubrics          44.0  | no R*(q): configs/rubrics/qurl_checklist.yaml (5 generic dims)  |
| reward_model  | w/ rlhf reward model 47.7  | reward.source=reward_model (QuRL: internlm2-7b-reward)         |

One config serves every step of a row: its `qurl.*` block is what `experiments.build_rubrics` reads, the rest
what `experiments.run` trains with. QuRL's filter has two halves, dropping candidate sets that do not tell
answers apart and merging criteria that recur across the K samples; `no_filter` removes both (one candidate,
kept as written). The rubric rows train on their own build's output (`data.train`); `checklist` and
`reward_model` train on the same questions without R*(q) and build nothing.

Commands per row, 7B on 8xA100-80GB (other sizes: replace 7b; the /models and data/qurl paths are yours:
train_questions.jsonl and corpus.jsonl as in README "Building case-wise rubrics", test.jsonl a QuRL-Test
style set with R*(q) per row, cold_start.jsonl QuRL's 64 SFT pairs):
  V=full   # or no_filter, no_references
  1. ./launch.sh experiments.build_rubrics --config=configs/qurl_ablation.py:variant=$V,size=7b \
         --questions=data/qurl/train_questions.jsonl --corpus=data/qurl/corpus.jsonl \
         --out=runs/qurl_ablation/7b/$V/rubrics
  2. ./launch.sh experiments.run --config=configs/qurl_ablation.py:variant=$V,size=7b \
         --workdir=runs/qurl_ablation/7b/$V/train
  3. ./launch.sh experiments.evaluate --config.benchmark=hellobench --data_dir=../shared/data/hellobench \
         --workdir=runs/qurl_ablation/7b/$V/train --config.which=best --config.policy.prompt_format=think_answer \
         --judge.checkpoint=/models/Llama-3.1-8B-Instruct --out=runs/qurl_ablation/7b/$V/eval/hellobench
     and the same with --config.benchmark=longbench_write --data_dir=../shared/data/longbench_write
     --data_file=longbench_write.jsonl, and --config.benchmark=rubric_set --data_dir=data/qurl
     --data_file=test.jsonl
     (QuRL-Test), each into its own --out. QuRL's average is the mean of the three benchmarks.
  V=checklist or V=reward_model: steps 2 and 3 only.

Tiny (CPU, the shipped assets; README "QuRL ablations" runs these): the random tiny model writes no usable
rubric, so the three rubric rows train on the tiny default's case-wise criteria (rubric_jax/assets/tiny)
and differ only in what their build step would do (`experiments.build_rubrics` with `size=tiny` runs the
plumbing). `checklist` needs `--config.judge.checkpoint=DIR` and `reward_model`
`--config.reward.model_checkpoint=DIR`: local HF directories (tests/random_model.py's `tiny_hf_dir` writes
random ones).
"""

from configs import qwen7b, tiny

VARIANTS = ("full", "no_filter", "no_references", "checklist", "reward_model")
SIZES = ("7b", "1.5b", "0.5b", "tiny")
CHECKLIST = "configs/rubrics/qurl_checklist.yaml"
_DATA = "data/qurl"  # Replace with your directory of QuRL-style data (see the docstring).
_QURL_ASSETS = "rubric_jax/assets/qurl"
_JUDGE = "/models/Llama-3.1-8B-Instruct"  # Replace: a local judge, not the policy's base (RubricRL §6.2).
# Replace: a local one-label *ForSequenceClassification model. QuRL's internlm2-7b-reward is an InternLM2
# model, which rubric_jax does not load; Skywork-Reward-Llama-3.1-8B-v0.2 is a LlamaForSequenceClassification.
_REWARD_MODEL = "/models/Skywork-Reward-Llama-3.1-8B-v0.2"


def _options(arg: str | None) -> tuple[str, str]:
    """(variant, size) from "variant=...,size=..."; anything else is an error naming this file."""
    options = {}
    for part in (arg or "").split(","):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or name not in ("variant", "size"):
            raise ValueError(f"configs/qurl_ablation.py: bad argument {part!r}; expected variant=...,size=...")
        options[name] = value
    variant, size = options.get("variant", "full"), options.get("size", "7b")
    if variant not in VARIANTS:
        raise ValueError(f"configs/qurl_ablation.py: variant={variant!r} is not one of {VARIANTS}")
    if size not in SIZES:
        raise ValueError(f"configs/qurl_ablation.py: size={size!r} is not one of {SIZES}")
    return variant, size


def _set_qurl(c, variant: str) -> None:
    """The rubric-construction half of a row (experiments.build_rubrics reads config.qurl)."""
    if variant == "no_filter":
        c.qurl.num_candidates = 1  # one sampled rubric set: nothing to compare or merge across samples
        c.qurl.min_support = 1
        c.qurl.min_std = 0.0  # and no discriminativeness test
        c.qurl.min_spread = 0.0
    elif variant == "no_references":
        c.qurl.top_k = 0  # no retrieved documents, no meta-descriptions: rubrics from the question alone


def _qwen(variant: str, size: str):
    c = qwen7b.get_config(f"size={size}")
    c.judge.checkpoint = _JUDGE
    c.judge.mode = "all_criteria"  # QuRL: one evaluation of all criteria per answer, parsed and summed
    c.judge.max_new_tokens = 512
    c.data.sft = f"{_DATA}/cold_start.jsonl"
    c.data.eval = f"{_DATA}/test.jsonl"
    c.data.rubric = CHECKLIST  # scores only rows without R*(q) of their own (none in a build's output)
    c.data.train = f"runs/qurl_ablation/{size}/{variant}/rubrics/questions.jsonl"  # build_rubrics --out
    if variant in ("checklist", "reward_model"):
        c.data.train = f"{_DATA}/train_questions.jsonl"  # the questions the rubric rows build from
    if variant == "reward_model":
        c.judge.checkpoint = ""
        c.reward.source = "reward_model"
        c.reward.model_checkpoint = _REWARD_MODEL
        c.reward.model_dtype = "bfloat16"
        c.reward.model_max_len = 4096  # prompt 512 + response 2048 tokens, in the reward model's template
        c.reward.model_batch_size = 16  # 2 rows per GPU a call: 8B attention scores stay a few GB
    return c


def _tiny(variant: str):
    c = tiny.get_config()
    if variant in ("checklist", "reward_model"):
        c.data.train = c.data.eval = f"{_QURL_ASSETS}/questions.jsonl"  # 8 questions without rubrics (plumbing)
        c.judge.checkpoint = ""  # not the tiny default's politeness judge: checklist names its own, reward_model none
        c.data.golden = ""  # the tiny golden set is labelled on the tiny rubric's dimensions, which these rows lack
    if variant == "checklist":
        c.data.rubric = CHECKLIST
        c.judge.mode = "per_dimension"  # one dimension per prompt: fits the tiny judge's 512-token context
        c.judge.samples = 1
        c.judge.max_retries = 0
        c.judge.max_new_tokens = 16
    if variant == "reward_model":
        c.reward.source = "reward_model"
        c.reward.model_max_len = 512  # the tiny context
    return c


def get_config(arg: str | None = None):
    """`arg` is "variant=full|no_filter|no_references|checklist|reward_model,size=7b|1.5b|0.5b|tiny"."""
    variant, size = _options(arg)
    c = _tiny(variant) if size == "tiny" else _qwen(variant, size)
    _set_qurl(c, variant)
    return c

"""Judges: rule judges, LLM judge (nonce-fenced prompts, strict parser, batched scoring) and the reward."""

from rubric_jax.judges.features import FEATURES, response_features
from rubric_jax.judges.llm_judge import Judge, JudgeOutput, combine_judges, judge_rows, load_judge
from rubric_jax.judges.parser import Verdict, parse_single, parse_verdict
from rubric_jax.judges.prompts import JudgePrompt, fence, multi_prompt, single_prompt
from rubric_jax.judges.reward import RewardOutput, RubricReward
from rubric_jax.judges.rules import Rule, RuleError, make_rule, rule_names, rule_scores
from rubric_jax.judges.spec import JudgeSpec, judge_hash, load_judges

__all__ = [
    "FEATURES", "Judge", "JudgeOutput", "JudgePrompt", "JudgeSpec", "RewardOutput", "Rule", "RuleError",
    "RubricReward", "Verdict", "combine_judges", "fence", "judge_hash", "judge_rows", "load_judge", "load_judges",
    "make_rule", "multi_prompt", "parse_single", "parse_verdict", "response_features", "rule_names", "rule_scores",
    "single_prompt",
]

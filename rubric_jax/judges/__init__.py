"""Judges: rule judges, LLM judge (nonce-fenced prompts, strict parser, batched scoring) and the reward."""

import importlib

# Where each public name lives. Loaded on first use (PEP 562): importing a light module of this package (spec,
# rules, features) must not import jax, because `experiments.run --dry_run` sets JAX_PLATFORMS only after its flags
# (and with them the judge spec) are read, and jax's GPU plugin initialises at import.
_HOMES = {
    "FEATURES": "features", "response_features": "features",
    "Judge": "llm_judge", "JudgeOutput": "llm_judge", "combine_judges": "llm_judge", "judge_rows": "llm_judge",
    "load_judge": "llm_judge",
    "Verdict": "parser", "parse_single": "parser", "parse_verdict": "parser",
    "JudgePrompt": "prompts", "fence": "prompts", "multi_prompt": "prompts", "single_prompt": "prompts",
    "RewardOutput": "reward", "RubricReward": "reward",
    "Rule": "rules", "RuleError": "rules", "make_rule": "rules", "rule_names": "rules", "rule_scores": "rules",
    "JudgeSpec": "spec", "judge_hash": "spec", "load_judges": "loading",
}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


__all__ = [
    "FEATURES", "Judge", "JudgeOutput", "JudgePrompt", "JudgeSpec", "RewardOutput", "Rule", "RuleError",
    "RubricReward", "Verdict", "combine_judges", "fence", "judge_hash", "judge_rows", "load_judge", "load_judges",
    "make_rule", "multi_prompt", "parse_single", "parse_verdict", "response_features", "rule_names", "rule_scores",
    "single_prompt",
]

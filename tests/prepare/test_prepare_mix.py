"""Difficulty ratio parsing, largest-remainder counts, the 3:5:2 mix, labels from rewards, stratified splits."""

import collections

import pytest

from rubric_jax.prepare import mix


def test_parse_ratio():
    assert mix.parse_ratio("3:5:2") == {"easy": 3.0, "medium": 5.0, "hard": 2.0}
    assert mix.parse_ratio("0.3:0.5:0.2") == {"easy": 0.3, "medium": 0.5, "hard": 0.2}
    assert mix.parse_ratio("1:1:0") == {"easy": 1.0, "medium": 1.0, "hard": 0.0}
    for bad in ("3:5", "3:5:2:1", "a:b:c", "3:-1:2", "0:0:0", "3:nan:2", "3;5;2", "",
                "1e308:1e308:1e308", "inf:1:1"):  # the sum overflowed: "cannot convert float NaN to integer"
        with pytest.raises(mix.MixError, match="expected easy:medium:hard"):
            mix.parse_ratio(bad)


def test_largest_remainder_hand_computed():
    assert mix.largest_remainder(10, mix.DIFFICULTY_RATIOS) == {"easy": 3, "medium": 5, "hard": 2}
    assert mix.largest_remainder(7, mix.DIFFICULTY_RATIOS) == {"easy": 2, "medium": 4, "hard": 1}  # 2.1 3.5 1.4
    assert mix.largest_remainder(11, mix.DIFFICULTY_RATIOS) == {"easy": 3, "medium": 6, "hard": 2}  # 3.3 5.5 2.2
    assert mix.largest_remainder(3, {"a": 1, "b": 1, "c": 1, "d": 1}) == {"a": 1, "b": 1, "c": 1, "d": 0}
    for total in range(50):
        assert sum(mix.largest_remainder(total, {"x": 0.37, "y": 2.1, "z": 0.0}).values()) == total


def test_difficulty_mix_follows_3_5_2():
    difficulties = ["easy"] * 10 + ["medium"] * 10 + ["hard"] * 10
    picked = mix.difficulty_mix(difficulties, 10, seed=0)
    counts = collections.Counter(difficulties[i] for i in picked)
    assert counts == {"easy": 3, "medium": 5, "hard": 2} and len(set(picked)) == 10
    assert mix.difficulty_mix(difficulties, 10, seed=0) == picked
    assert mix.difficulty_mix(difficulties, 10, seed=1) != picked
    seven = collections.Counter(difficulties[i] for i in mix.difficulty_mix(difficulties, 7, seed=1))
    assert seven == {"easy": 2, "medium": 4, "hard": 1}
    with pytest.raises(mix.MixError, match="needs 4 'hard' rows but only 3 exist"):
        mix.difficulty_mix(["easy"] * 9 + ["medium"] * 10 + ["hard"] * 3, 20, seed=0)
    with pytest.raises(mix.MixError, match="row 1: difficulty None"):
        mix.difficulty_mix(["easy", None], 1, seed=0)


def test_difficulty_mix_proportions_on_a_large_pool():
    difficulties = ["easy"] * 400 + ["medium"] * 700 + ["hard"] * 300
    size = mix.max_mix_size(collections.Counter(difficulties), mix.DIFFICULTY_RATIOS)
    assert size == 1334  # easy limits it: 1334 -> 400.2, 667, 266.8 -> 400:667:267; 1335 would need 401 easy
    picked = collections.Counter(difficulties[i] for i in mix.difficulty_mix(difficulties, size, seed=0))
    assert picked == mix.largest_remainder(size, mix.DIFFICULTY_RATIOS)


def test_max_mix_size():
    ratio = mix.DIFFICULTY_RATIOS
    assert mix.max_mix_size({"easy": 3, "medium": 8, "hard": 7}, ratio) == 11  # 12 would need 4 easy
    assert mix.max_mix_size({"easy": 30, "medium": 50, "hard": 20}, ratio) == 100
    assert mix.max_mix_size({"easy": 5, "medium": 0, "hard": 5}, ratio) == 0  # every total needs a medium row
    assert mix.max_mix_size({"easy": 5}, ratio) == 0
    assert mix.max_mix_size({"easy": 5, "medium": 5}, {"easy": 1, "medium": 1, "hard": 0}) == 10


def test_difficulty_from_rewards_terciles_with_ties():
    rewards = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4, "e": 0.5, "f": 0.6}  # mid-rank percentiles 1/12, 3/12, ...
    assert mix.difficulty_from_rewards(rewards) == {"a": "hard", "b": "hard", "c": "medium", "d": "medium",
                                                    "e": "easy", "f": "easy"}
    tied = {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.9, "e": 0.5, "f": 1.0}  # three zeros share percentile 0.25
    assert mix.difficulty_from_rewards(tied) == {"a": "hard", "b": "hard", "c": "hard", "d": "easy", "e": "medium",
                                                 "f": "easy"}
    with pytest.raises(mix.MixError, match="'x': mean reward nan"):
        mix.difficulty_from_rewards({"y": 0.1, "x": float("nan")})


def test_stratified_sample_is_proportional_and_seeded():
    categories = ["a"] * 50 + ["b"] * 30 + ["c"] * 20
    picked = mix.stratified_sample(categories, 10, seed=0)
    assert picked == sorted(picked) and len(set(picked)) == 10
    assert collections.Counter(categories[i] for i in picked) == {"a": 5, "b": 3, "c": 2}
    assert mix.stratified_sample(categories, 10, seed=0) == picked != mix.stratified_sample(categories, 10, seed=1)
    assert mix.stratified_sample(categories, 0, seed=0) == []
    with pytest.raises(mix.MixError, match="cannot take 101 rows out of 100"):
        mix.stratified_sample(categories, 101, seed=0)

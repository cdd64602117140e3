"""rubric_jax/schema.py: a block checks its types, bounds and choices when made, names the key of any error, and
round-trips through mappings (a ConfigDict's to_dict, a run's config.json)."""

from __future__ import annotations

import dataclasses

import pytest

from rubric_jax import schema
from rubric_jax.schema import Block, BlockError, setting


@dataclasses.dataclass(frozen=True)
class Inner(Block):
    tensor: int = setting(1, "Devices per group.", bounds=(1, 64))
    dtype: str = setting("compute", "Weights dtype.", choices=("compute", "float32"))


@dataclasses.dataclass(frozen=True)
class Outer(Block):
    lr: float = setting(1e-6, "Learning rate.", bounds=(0.0, 1.0))
    steps: int = setting(10, "Steps.", bounds=(1, 100))
    on: bool = setting(False, "A switch.")
    stages: tuple[str, ...] = setting(("sft", "grpo"), "Stages.", choices=("sft", "grpo"))
    files: str = setting("", "A path.", key="file")
    inner: Inner = setting(Inner, "The inner block.")
    derived: int = 0  # not a config key

    def validate(self) -> None:
        if self.on and self.steps < 2:
            self.fail("steps", "at least 2 with on=True")


def test_defaults_round_trip_through_a_mapping():
    values = schema.defaults(Outer)
    assert values == {"lr": 1e-6, "steps": 10, "on": False, "stages": ("sft", "grpo"), "file": "",
                      "inner": {"tensor": 1, "dtype": "compute"}}
    listed = {**values, "stages": ["grpo"]}  # JSON and ConfigDict.to_dict() give lists
    block = schema.from_mapping(Outer, listed, "config")
    assert block.stages == ("grpo",) and block.inner == Inner() and schema.to_mapping(block)["stages"] == ("grpo",)


@pytest.mark.parametrize("change, message", [
    ({"steps": 0}, "config.steps=0: expected an integer >= 1"),
    ({"steps": 101}, "config.steps=101: expected an integer <= 100"),
    ({"steps": True}, "config.steps=True: expected an integer >= 1"),
    ({"lr": float("nan")}, "config.lr=nan: expected a number in [0, 1]"),
    ({"lr": "1e-6"}, "config.lr='1e-6': expected a number"),
    ({"on": 1}, "config.on=1: expected True or False"),
    ({"stages": ["rl"]}, "config.stages=('rl',): expected items of ('sft', 'grpo')"),
    ({"file": 3}, "config.file=3: expected a string"),
    ({"inner": {"tensor": 0, "dtype": "compute"}}, "config.inner.tensor=0: expected an integer >= 1"),
    ({"inner": {"tensor": 1, "dtype": "int8"}}, "config.inner.dtype='int8': expected one of ('compute', 'float32')"),
    ({"on": True, "steps": 1}, "config.steps=1: at least 2 with on=True"),
])
def test_a_bad_value_names_its_key(change, message):
    with pytest.raises(BlockError) as e:
        schema.from_mapping(Outer, {**schema.defaults(Outer), **change}, "config")
    assert str(e.value) == message


def test_unknown_and_missing_keys_are_named():
    values = {**schema.defaults(Outer), "stepz": 3}
    del values["steps"]
    with pytest.raises(BlockError, match=r"config=.*unknown keys \['stepz'\], missing keys \['steps'\]"):
        schema.from_mapping(Outer, values, "config")
    inner = {**schema.defaults(Outer), "inner": {"tensor": 1}}
    with pytest.raises(BlockError, match=r"config\.inner=.*missing keys \['dtype'\]"):
        schema.from_mapping(Outer, inner, "config")


def test_a_block_made_in_code_is_checked_too():
    with pytest.raises(BlockError, match=r"^tensor=65: expected an integer <= 64$"):
        Inner(tensor=65)


def test_rows_document_every_key_flattened():
    rows = {row.key: row for row in schema.rows(Outer)}
    assert list(rows) == ["lr", "steps", "on", "stages", "file", "inner.tensor", "inner.dtype"]
    assert rows["inner.dtype"].allowed == "compute | float32" and rows["steps"].allowed == "[1, 100]"
    assert rows["file"].doc == "A path." and rows["stages"].kind == "tuple of str"


@dataclasses.dataclass(frozen=True)
class Spec:
    """A type of its own made from a block of keys (as a judge spec is), checking them itself."""

    samples: int = 3

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"samples={self.samples}: expected >= 1")


def _spec(values, where):
    try:
        return Spec(**values)
    except ValueError as e:
        raise ValueError(f"{where}.{e}") from None


@dataclasses.dataclass(frozen=True)
class WithSpec(Block):
    seed: int = setting(0, "A seed.", bounds=(0, 9))
    judge: Spec = setting(Spec, "A judge.", parse=_spec)


def test_a_key_parsed_by_its_own_type_is_made_by_it_and_named_in_its_errors():
    block = schema.from_mapping(WithSpec, {"seed": 1, "judge": {"samples": 5}}, "config")
    assert block.judge == Spec(5) and WithSpec().judge == Spec()
    with pytest.raises(ValueError, match=r"^config\.judge\.samples=0: expected >= 1$"):
        schema.from_mapping(WithSpec, {"seed": 1, "judge": {"samples": 0}}, "config")
    with pytest.raises(BlockError, match=r"^judge='x': expected a Spec$"):
        WithSpec(judge="x")
    assert [(row.key, row.allowed) for row in schema.rows(WithSpec)] == [
        ("seed", "[0, 9]"), ("judge", "a block of its own keys")]


def test_config_dict_gives_the_defaults_and_takes_a_parsed_keys_config_dict():
    from rubric_jax import config_boundary

    made = config_boundary.config_dict(WithSpec, judge=config_boundary.ConfigDict({"samples": 3}))
    assert made.to_dict() == {"seed": 0, "judge": {"samples": 3}}
    assert config_boundary.to_block(made, WithSpec, "config") == WithSpec()
    with pytest.raises(ValueError, match="give the ConfigDict of 'judge'"):
        config_boundary.config_dict(WithSpec)
    assert config_boundary.config_dict(Outer).to_dict() == schema.defaults(Outer)

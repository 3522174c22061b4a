"""Run configs hold only what JSON and the databases can: every float is finite, every integer
fits in 64 bits, the name fits its column; a recipe with bad YAML is a ConfigError naming the file
and the line. Walks every field, so a field added later is covered too."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from thundersync.config import ConfigError, RunConfig, load_run_config

INT64_MAX = 2**63 - 1


def _fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, type, Any]]:
    """(dotted name, annotation, default) of every scalar field of the config, sections included."""
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _fields(ann, f"{prefix}{name}.")
        else:
            default = info.get_default(call_default_factory=True)
            yield f"{prefix}{name}", ann, default  # type: ignore[misc]


# optional numbers (None: derived) are walked too, with a normal value in place of None
_NORMAL = {
    "mfu_peak_flops": 1e11,
    "model.tiny_hidden": 128,
    "rollout.vllm.max_model_len": 2048,
    "teacher.vllm.max_model_len": 2048,
}
FLOATS = [
    (k, d if d is not None else _NORMAL.get(k, 1.0))
    for k, a, d in _fields(RunConfig)
    if a is float or a == (float | None)
]
INTS = [
    (k, d if d is not None else _NORMAL.get(k, 1))
    for k, a, d in _fields(RunConfig)
    if a is int or a == (int | None)
]


# fields whose other values only make sense beside another setting (rules across sections)
_NEEDS = {"rollout.replicas": {"rollout.engine": "vllm"}}


def _load(key: str, value: Any) -> RunConfig:
    return load_run_config(overrides={**_NEEDS.get(key, {}), key: value})


def _get(cfg: BaseModel, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_the_walk_sees_the_numeric_fields() -> None:
    assert {"optim.lr", "rollout.temperature", "mfu_peak_flops"} <= {k for k, _ in FLOATS}
    assert {"seed", "updates", "model.tiny_seed", "teacher.retries"} <= {k for k, _ in INTS}


@pytest.mark.parametrize(("key", "default"), FLOATS, ids=[k for k, _ in FLOATS])
def test_every_float_is_finite_and_normal_values_pass(key: str, default: float) -> None:
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(ConfigError, match=rf"{key}: Input should be a finite number"):
            _load(key, bad)
    for good in (default, default * 0.5, 1e300, int(default)):
        if good <= 0 and default > 0:
            continue  # some fields must be positive (lr, eps, ...)
        if key.startswith("optim.beta") and good >= 1:
            continue  # betas are below 1
        if key.endswith("memory_utilization") and good > 1:
            continue  # a fraction
        assert _get(_load(key, good), key) == good
    cfg = RunConfig()
    section, _, leaf = key.rpartition(".")
    owner = _get(cfg, section) if section else cfg
    with pytest.raises(ValueError, match="finite"):
        setattr(owner, leaf, math.nan)  # assignments are checked as well


@pytest.mark.parametrize(("key", "default"), INTS, ids=[k for k, _ in INTS])
def test_every_int_fits_in_64_bits(key: str, default: int) -> None:
    for bad in (INT64_MAX + 1, 2**70):
        with pytest.raises(ConfigError, match=rf"{key}: out of range"):
            _load(key, bad)
    with pytest.raises(ConfigError, match=rf"{key}: (out of range|Input should be greater)"):
        _load(key, -(2**63) - 1)  # a field with a lower bound reports that one first
    assert _get(_load(key, default), key) == default
    assert _get(_load(key, INT64_MAX), key) == INT64_MAX  # the largest 64-bit value is fine


def test_run_name_fits_its_column() -> None:
    assert load_run_config(overrides={"name": "n" * 200}).name == "n" * 200
    with pytest.raises(ConfigError, match="name: String should have at most 200"):
        load_run_config(overrides={"name": "n" * 201})


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("name: ok\nupdates: 2\nrollout: {group_size: 4\n", "line 4, column 1"),
        ("name: ok\nupdates: 2: 3\n", "line 2, column 11"),
        ("name: ok\n\tupdates: 2\n", "line 2, column 1"),
        ("name: [ok\nupdates: 2\n", "line 2, column 8"),
    ],
)
def test_bad_yaml_is_a_config_error_naming_file_and_line(
    tmp_path: Path, text: str, line: str
) -> None:
    recipe = tmp_path / "broken.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_run_config(str(recipe))
    msg = str(err.value)
    assert msg.startswith(f"recipe {recipe}: invalid YAML at {line}: "), msg


def test_unreadable_recipe_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(ConfigError, match="cannot read it"):
        load_run_config(str(tmp_path / "dir.yaml"))
    (tmp_path / "bin.yaml").write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ConfigError, match="cannot read it"):
        load_run_config(str(tmp_path / "bin.yaml"))

"""`env.name` is an enum: unknown names fail validation, aliases resolve to the canonical name."""

from __future__ import annotations

import json

import pytest

from thundersync.config import ConfigError, EnvName, load_run_config


def test_unknown_env_name_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError) as ei:
        load_run_config(overrides={"env.name": "nope"})
    msg = str(ei.value)
    assert msg.startswith("env.name:")
    assert all(f"'{n.value}'" in msg for n in EnvName)


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("toy", "toy"),
        ("digits", "toy"),
        ("swe-smith", "swe-smith"),
        ("swesmith", "swe-smith"),
        ("terminal", "terminal"),
        ("seta", "terminal"),
        ("harbor", "terminal"),
    ],
)
def test_aliases_resolve_to_the_canonical_name(given: str, canonical: str) -> None:
    cfg = load_run_config(overrides={"env.name": given})
    assert cfg.env.name is EnvName(canonical)
    assert json.loads(cfg.model_dump_json())["env"]["name"] == canonical


def test_recipes_keep_their_env_names() -> None:
    assert load_run_config("grpo-toy").env.name is EnvName.TOY
    assert load_run_config("grpo-swe-smith-tiny").env.name is EnvName.SWE_SMITH
    assert load_run_config("opd-seta-tiny").env.name is EnvName.TERMINAL

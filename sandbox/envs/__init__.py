"""ThunderSync environments as skyrl-gym 0.4.0 `BaseTextEnv`s, registered on import.

`skyrl_gym.make(EnvId.X.value, extras={...})` gives an env the agent loop drives like any SkyRL
env: `tsrl-swesmith` (`swesmith_env`), `tsrl-terminal` (`terminal_env`),
`tsrl-digits` (`digits_env`, the toy recipes' task) and `tsrl-toy-calc` (`calc_env`, `tsrl eval`
and the tests). The shared env shape and the session pools are in `sandbox.envs.base`, the
action format of the sandbox envs in `sandbox.envs.tools`, and which tasks a run's `env.name`
means in `sandbox.envs.catalogue`.
"""

from __future__ import annotations

from enum import StrEnum

import skyrl_gym
from skyrl_gym.envs.registration import registry


class EnvId(StrEnum):
    """The registered skyrl-gym ids (eval task files name them: keep them stable)."""

    SWESMITH = "tsrl-swesmith"
    TERMINAL = "tsrl-terminal"
    DIGITS = "tsrl-digits"
    CALC = "tsrl-toy-calc"


# ids before the one `tsrl-` prefix: a task file naming one is refused with its new id (see
# `renamed_id`), never silently mapped, so an old file is fixed once rather than carried along
RENAMED_IDS = {"thundersync-swesmith": EnvId.SWESMITH, "thundersync-terminal": EnvId.TERMINAL}


def renamed_id(env_id: str) -> EnvId | None:
    """The current id of a retired `env_id`, or None when `env_id` is not a retired one."""
    return RENAMED_IDS.get(env_id)


_ENTRY = {
    EnvId.SWESMITH: "thundersync.sandbox.envs.swesmith_env:SWESmithEnv",
    EnvId.TERMINAL: "thundersync.sandbox.envs.terminal_env:TerminalEnv",
    EnvId.DIGITS: "thundersync.sandbox.envs.digits_env:DigitsEnv",
    EnvId.CALC: "thundersync.sandbox.envs.calc_env:ToyCalcEnv",
}


def register() -> None:
    """Register every env id not registered yet (importing this package already did)."""
    for env_id, entry in _ENTRY.items():
        if env_id.value not in registry:
            skyrl_gym.register(id=env_id.value, entry_point=entry)


register()

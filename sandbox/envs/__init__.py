"""ThunderSync environments as skyrl-gym 0.4.0 `BaseTextEnv`s, registered on import.

`skyrl_gym.make("thundersync-swesmith", extras={...})` and `skyrl_gym.make("thundersync-terminal",
extras={...})` give envs the agent loop drives like any SkyRL env. The action format is
documented in `sandbox.envs.tools`.
"""

from __future__ import annotations

from enum import StrEnum

import skyrl_gym
from skyrl_gym.envs.registration import registry


class EnvId(StrEnum):
    SWESMITH = "thundersync-swesmith"
    TERMINAL = "thundersync-terminal"


_ENTRY = {
    EnvId.SWESMITH: "sandbox.envs.swesmith_env:SWESmithEnv",
    EnvId.TERMINAL: "sandbox.envs.terminal_env:TerminalEnv",
}

for _id, _entry in _ENTRY.items():
    if _id.value not in registry:
        skyrl_gym.register(id=_id.value, entry_point=_entry)

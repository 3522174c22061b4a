"""ThunderSync: lossless streaming GRPO / OPD training for agentic LLMs (shared core: config, models, CLI)."""

from thundersync.env_compat import adopt_legacy_env

__version__ = "0.1.0"

adopt_legacy_env()

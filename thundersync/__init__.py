"""ThunderSync: lossless streaming GRPO / OPD training for agentic LLMs (shared core: config, models, CLI)."""

__version__ = "0.1.0"

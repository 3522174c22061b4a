"""The switch: a SkyRL run trained by ThunderSync's streaming learner, from SkyRL's entry point.

SkyRL's `main_base.main()` hands the whole command line to the module named by
`trainer.override_entrypoint=` before it parses anything, so a SkyRL user switches a run with
that one value:

    python -m skyrl.train.entrypoints.main_base trainer.override_entrypoint=thundersync.skyrl.entrypoint <their overrides>

On Python 3.11, where skyrl 0.4.0 needs `compat` before its first import, run the same command
line as `python -m thundersync.skyrl.entrypoint ...`: it prepares the interpreter and calls
SkyRL's own `main()`. `tsrl.*=` arguments (e.g. `tsrl.rollout.engine=vllm`) are ThunderSync
settings for the run, which SkyRL's config has no field for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import thundersync.skyrl  # noqa: F401  (prepares the interpreter before skyrl is imported)

SWITCH = "trainer.override_entrypoint="
OURS = "tsrl."


def split_args(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """(SkyRL's overrides, ThunderSync's `tsrl.section.field=value` settings, dotted)."""
    from thundersync.config import parse_set_overrides

    skyrl = [a for a in argv if not a.startswith((SWITCH, OURS))]
    ours = parse_set_overrides([a[len(OURS) :] for a in argv if a.startswith(OURS)])
    return skyrl, ours


def main() -> None:
    """Called by SkyRL's `main_base.main()` when the switch is set."""
    from skyrl.train.config import SkyRLTrainConfig

    from thundersync.driver.run import RunDriver
    from thundersync.sandbox.envs.taskset_check import check_before_start
    from thundersync.skyrl.translate import run_config_from_skyrl

    skyrl_args, ours = split_args(sys.argv[1:])
    cfg = run_config_from_skyrl(SkyRLTrainConfig.from_cli_overrides(skyrl_args), ours)
    check_before_start(cfg)
    run_dir = Path(cfg.output_dir if cfg.output_dir != "runs/default" else f"runs/{cfg.name}")
    code = RunDriver(cfg, run_dir).run()
    print(json.dumps({"run_dir": str(run_dir), "updates": cfg.updates, "exit": code}))
    raise SystemExit(code)


if __name__ == "__main__":
    from skyrl.train.entrypoints.main_base import main as skyrl_main

    skyrl_main()

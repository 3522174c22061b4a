"""Run launcher: starts the run driver (`tsrl train CONFIG --run-dir DIR`) as a supervised
subprocess (embedded) or a Ray job (cluster), ingests DIR/metrics.jsonl and DIR/spans.jsonl into the
database as they grow, maps the driver's exit to succeeded / failed / cancelled with a reason, and
reconciles runs left active by a previous service process. See docs/CONTRACTS.md.
"""

from thundersync.service.launcher.supervisor import Launcher

__all__ = ["Launcher"]

"""A stand-in driver on the Redis bus for the broker-cleanup tests: it opens its run's bus the way
`driver.run.RunDriver` does (`bus.factory.open_run_bus`), under both key forms the service cleans
(the service's run id, TSRL_RUN_ID, and the driver's own `<name>-<pid>-<second>`), publishes on
every topic, subscribes (consumer groups), writes DIR/bus.json and then waits to be killed."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from thundersync.bus.events import GroupRegistered
from thundersync.bus.factory import BusKind, open_run_bus


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    run_dir = Path(sys.argv[sys.argv.index("--run-dir") + 1])
    own_id = f"{config['name']}-{os.getpid()}-{int(time.time())}"
    prefixes = []
    for run_id in (os.environ["TSRL_RUN_ID"], own_id):
        bus, _ = open_run_bus(BusKind.REDIS, run_id=run_id, learner_ranks=1)
        for topic in ("learner", "control", "spans"):
            bus.subscribe(topic, "driver", "driver-0")
            bus.publish(
                GroupRegistered(run_id=run_id, update=0, group_id="g", size=1, prompt_ids=[1]),
                topic,
            )
        prefixes.append(bus.prefix)  # type: ignore[attr-defined]
    (run_dir / "bus.json").write_text(json.dumps({"pid": os.getpid(), "prefixes": prefixes}))
    print("driver on the Redis bus, waiting", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())

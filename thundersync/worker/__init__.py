"""The learner worker process: its loop (`learner_proc`), its inputs from the bus (`work_items`),
its per-update stats (`learner_stats`) and where it writes each new policy (`policy_writer`)."""

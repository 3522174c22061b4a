"""The streaming gradient engine: sources, ready queue, objectives, accumulators, boundary adjoints,
barrier + optimizer, FSDP2 plumbing and checkpoints."""

"""The run driver process: opens updates, runs rollouts, feeds ready sources to the learner worker
(`thundersync.worker`) over the bus, waits at the barrier for the new policy to be published and
acknowledged. Where the processes run is `thundersync.cluster`'s job."""

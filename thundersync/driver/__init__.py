"""The run driver: opens updates, runs rollouts, feeds ready sources to the learner process over
the bus, waits at the barrier for the new policy to be published and acknowledged."""

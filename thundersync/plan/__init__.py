"""The learner's memory plan: what each part of the learner allocates, per GPU, host and
/dev/shm, for a run config and a model shape (`tsrl plan`), checked against real allocations
(`tsrl bench plan-check`) and against the machine when a run starts (`plan.guard`)."""

"""Where a run's processes are placed: local learner ranks (`placement`), the Ray plan
(`ray_plan`), its placement group (`ray_pg`), and the actors placed in it (`ray_learners`,
`ray_actors`, `ray_servers`)."""

"""The paper's GPU splits of one 8-GPU node, written out (what `placement.preset` must fill)."""

GRPO_PAPER = {  # 4 learner + 4 rollout GPUs
    "learner.ranks": 4,
    "placement.learner_gpus": 4,
    "rollout.engine": "vllm",
    "rollout.replicas": 4,
    "placement.rollout_gpus": 4,
}
OPD_PAPER = {  # 4 learner + 2 rollout + 2 teacher GPUs
    "learner.ranks": 4,
    "placement.learner_gpus": 4,
    "rollout.engine": "vllm",
    "rollout.replicas": 2,
    "placement.rollout_gpus": 2,
    "teacher.backend": "vllm",
    "placement.teacher_gpus": 2,
}

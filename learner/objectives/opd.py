"""On-policy distillation: per-token reverse-KL advantages against a frozen teacher.

A_t = stopgrad(log pi_T(a_t|h_t) - log pi_theta_k(a_t|h_t)); a turn contributes
sum_t A_t grad log pi(a_t|h_t), and the batch gradient divides by N_k (all scored tokens of the
update) once, at the barrier, because N_k is only known when the batch closes.
"""

from __future__ import annotations

import torch


def opd_advantages(teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor) -> torch.Tensor:
    if teacher_logprobs.shape != student_logprobs.shape:
        raise ValueError(
            f"teacher log-probs have shape {tuple(teacher_logprobs.shape)} but the turn has "
            f"{tuple(student_logprobs.shape)} scored tokens: score exactly the action tokens"
        )
    return (teacher_logprobs.to(student_logprobs.dtype) - student_logprobs).detach()


class DistillStats:
    """One update's distillation signal over the scored tokens of its closed trajectories, in
    float64: the sampled reverse KL sum_t (log pi_theta - log pi_T) = -sum_t A_t, and the value
    of the surrogate loss -sum_t A_t log pi_theta whose gradient the update takes. A metric
    only: computed from detached copies, it never touches a gradient."""

    def __init__(self) -> None:
        self.kl_sum = 0.0
        self.loss_sum = 0.0
        self.tokens = 0

    @staticmethod
    def of_turn(adv: torch.Tensor, student: torch.Tensor) -> tuple[float, float]:
        """(KL sum, surrogate loss sum) of one turn's scored tokens."""
        if not adv.numel():
            return 0.0, 0.0
        with torch.no_grad():
            a, s = adv.detach().double(), student.detach().double()
            return float(-a.sum()), float(-(a * s).sum())

    def add(self, kl_sum: float, loss_sum: float, tokens: int) -> None:
        self.kl_sum += kl_sum
        self.loss_sum += loss_sum
        self.tokens += tokens

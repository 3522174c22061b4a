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

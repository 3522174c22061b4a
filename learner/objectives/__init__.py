"""Objectives as small pure functions plus the advantage-estimator registry."""

from thundersync.learner.objectives.grpo import (
    ESTIMATORS,
    GroupCoefficients,
    advantages,
    group_coefficients,
    min_group_size,
)
from thundersync.learner.objectives.opd import opd_advantages

__all__ = [
    "ESTIMATORS",
    "GroupCoefficients",
    "advantages",
    "group_coefficients",
    "min_group_size",
    "opd_advantages",
]

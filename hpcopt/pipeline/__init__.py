"""Pipeline (model) parallelism: stage splits, schedules as data, and the p2p executor."""

from .executor import Pipeline, StageTiming
from .schedules import BACKWARD, FORWARD, KINDS, ideal_bubble, max_in_flight, schedule, schedules, simulate
from .split import StagePlan

__all__ = ["Pipeline", "StageTiming", "StagePlan", "schedule", "schedules", "simulate",
           "max_in_flight", "ideal_bubble", "FORWARD", "BACKWARD", "KINDS"]

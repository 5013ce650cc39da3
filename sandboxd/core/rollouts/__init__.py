"""The rollout queue between generator and trainer (issue 7): admission by
staleness budget, reward scoring with masked infrastructure failures,
zero-advantage filtering, over-sampling with straggler cancellation or
parking, batches with acknowledgement, throughput figures and a
throughput-matching controller.

May import: the control plane's face and the snapshot manager
(``sandboxd.core``, ``sandboxd.core.snapshots``), the port's data types,
``sandboxd.clock``, the settings modules and ``sandboxd.errors``; never
``sandboxd.api`` (its servicer, ``sandboxd.api.rollouts``, sits above it).
"""

from sandboxd.core.rollouts.controller import ControllerInput, Decision, plan
from sandboxd.core.rollouts.figures import Figures
from sandboxd.core.rollouts.model import (
    Batch,
    FilterMode,
    Group,
    InfraFailure,
    Outcome,
    RunConfig,
    Segment,
    StalenessMode,
    StepReward,
    Trajectory,
)
from sandboxd.core.rollouts.queue import Cancellation, RolloutQueue

__all__ = [
    "Batch",
    "Cancellation",
    "ControllerInput",
    "Decision",
    "Figures",
    "FilterMode",
    "Group",
    "InfraFailure",
    "Outcome",
    "RolloutQueue",
    "RunConfig",
    "Segment",
    "StalenessMode",
    "StepReward",
    "Trajectory",
    "plan",
]

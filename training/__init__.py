"""Training: trajectories, rollout collection, rewards and Flow-GRPO batches.

Importing this package stays light (no torch or trl); the trainer loads them itself.
"""

from flowlearn.nodes.schema import Transition
from flowlearn.training.collect import collect, format_penalty, rollout_id
from flowlearn.training.flow_grpo import (
    FlowGRPOBatch,
    FlowGRPORow,
    StepCredit,
    build_flow_grpo_rows,
)
from flowlearn.training.store import (
    TrajectoryStore,
    export_parquet,
    from_dataset,
    load_trajectories,
    read_parquet,
    to_dataset,
)
from flowlearn.training.trajectory import SCHEMA_VERSION, Trajectory

__all__ = [
    "SCHEMA_VERSION",
    "FlowGRPOBatch",
    "FlowGRPORow",
    "StepCredit",
    "Trajectory",
    "TrajectoryStore",
    "Transition",
    "build_flow_grpo_rows",
    "collect",
    "export_parquet",
    "format_penalty",
    "from_dataset",
    "load_trajectories",
    "read_parquet",
    "rollout_id",
    "to_dataset",
]

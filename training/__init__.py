"""Training: trajectories, rollout collection, rewards and Flow-GRPO batches.

One module per hop of the data flow, each importing only those before it:
`trajectories` (records, the JSONL store, export) -> `rollouts` (collected through the flow,
rewarded; the trainer's sources) -> `rows` (Flow-GRPO rows: provenance checks, advantages,
weights) -> `batches` (padded tensors) and `loop` (TRL's pieces, the loss in chunks) -> `model`
(the trained model under TRL, its no-grad forwards) -> `vllm` (generation on vLLM, importance
correction) -> `config` -> `producer` (asynchronous rollouts) -> `trainer` (`FlowGRPOTrainer`,
its metrics) -> `run` (a training job, its run record and checkpoints).

Importing this package stays light (no torch or trl); the trainer loads them itself.
"""

from flowlearn.nodes.schema import Transition
from flowlearn.training.rollouts import collect, format_penalty, rollout_id
from flowlearn.training.rows import FlowGRPOBatch, FlowGRPORow, StepCredit, build_flow_grpo_rows
from flowlearn.training.trajectories import (
    SCHEMA_VERSION,
    Trajectory,
    TrajectoryStore,
    export_parquet,
    from_dataset,
    load_trajectories,
    read_parquet,
    to_dataset,
)

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

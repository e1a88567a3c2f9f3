"""The schema: graph state, run context, records and sampling settings (plain data, no logic).

The bottom layer of the package: it imports nothing else of flowlearn but the engine's own
input and output types (`flowlearn.engine.sampling`), re-exported here, and every other module
may import it at top level.
"""

from flowlearn.engine.sampling import Generation, Messages, Sampling, token_faithful
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.records import ParseStatus, Plan, StepRecord, Transition
from flowlearn.nodes.schema.state import InputState, OutputState, State, Termination

__all__ = [
    "Context",
    "Generation",
    "InputState",
    "Messages",
    "OutputState",
    "ParseStatus",
    "Plan",
    "Sampling",
    "State",
    "StepRecord",
    "Termination",
    "Transition",
    "token_faithful",
]

"""The composition root: names (flags, YAML, environment, Studio) in, models, tools, graphs out.

The one place that reads `FLOWLEARN_*` environment variables (`names`), and that checks every
name (tools, models, benchmark, corpus) before any model loads, so a typo fails in a second
with a message that says what to fix, not as every rollout failing. The CLI, the Studio graph
and training all build their parts here: the names (`names`), the models, local or served
(`models`), the tools, graph and work of a flow (`flows`), a training job's parts
(`training`), and a training result back in a user's app (`trained`).
"""

from flowlearn.compose.flows import (
    Flow,
    build_flow,
    build_tools,
    load_work,
    model_sizes,
    run_settings,
)
from flowlearn.compose.models import (
    LocalModels,
    ServedNameError,
    load_chat_model,
    load_local_models,
    load_parts,
    served_tokenizer,
    server_engine,
    server_planner,
)
from flowlearn.compose.names import (
    ENV,
    MODEL_FILES,
    STUDIO_PYTHON_ENV,
    FlowSpec,
    check_model_name,
    check_names,
)
from flowlearn.compose.trained import TrainedApp, load_trained
from flowlearn.compose.training import build_training_parts, training_engine, training_spec
from flowlearn.errors import UsageError
from flowlearn.nodes.presets import PROMPT_SETS

__all__ = [
    "ENV",
    "MODEL_FILES",
    "PROMPT_SETS",
    "STUDIO_PYTHON_ENV",
    "Flow",
    "FlowSpec",
    "LocalModels",
    "ServedNameError",
    "TrainedApp",
    "UsageError",
    "build_flow",
    "build_tools",
    "build_training_parts",
    "check_model_name",
    "check_names",
    "load_chat_model",
    "load_local_models",
    "load_parts",
    "load_trained",
    "load_work",
    "model_sizes",
    "run_settings",
    "served_tokenizer",
    "server_engine",
    "server_planner",
    "training_engine",
    "training_spec",
]

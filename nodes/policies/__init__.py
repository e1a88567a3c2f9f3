"""Model backends: the planner's policy protocol and its local, batched, served and scripted kinds.

Importing this package stays light (no torch or transformers): those load when a model does.
"""

from flowlearn.errors import ModelNotFoundError, ServerError
from flowlearn.nodes.policies.batching import BatchingPolicy
from flowlearn.nodes.policies.frozen_base import FrozenBasePolicy
from flowlearn.nodes.policies.handle import ModelHandle
from flowlearn.nodes.policies.hf import HFPolicy
from flowlearn.nodes.policies.hf_chat import HFChatModel
from flowlearn.nodes.policies.loading import (
    BASE_SOURCE,
    DEFAULT_SOURCES,
    load_model_and_tokenizer,
    untrained_twin,
)
from flowlearn.nodes.policies.protocol import ChatModelPolicy, Policy
from flowlearn.nodes.policies.scripted import ScriptedPolicy
from flowlearn.nodes.policies.server import ServerPolicy
from flowlearn.nodes.policies.server_chat import ServerChatModel

__all__ = [
    "BASE_SOURCE",
    "DEFAULT_SOURCES",
    "BatchingPolicy",
    "ChatModelPolicy",
    "FrozenBasePolicy",
    "HFChatModel",
    "HFPolicy",
    "ModelHandle",
    "ModelNotFoundError",
    "Policy",
    "ScriptedPolicy",
    "ServerChatModel",
    "ServerError",
    "ServerPolicy",
    "load_model_and_tokenizer",
    "untrained_twin",
]

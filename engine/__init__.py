"""The inference engine: a token-in/token-out core, the policies over it, thin chat adapters.

Layers, each importing only those below it: the sampling types (`Sampling`, `Generation`);
the token core (`tokens`: prompt ids in, completion ids and logprobs out, single and
continuously batched); the local policies over it (`local`: chat template -> ids -> core;
`batching`: concurrent calls decoded together) and the served one (`server`); the LangChain
adapters (`chat`). Importing this package costs nothing: each name imports its module on first
use (PEP 562), so the schema's `Sampling` does not pull in LangChain, and torch and transformers
load only when a model does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowlearn.errors import ModelNotFoundError, ServerError
from flowlearn.lazy import lazy_attribute, lazy_dir

if TYPE_CHECKING:
    from flowlearn.engine.adapters import PolicyRef, by_node
    from flowlearn.engine.batching import BatchingPolicy
    from flowlearn.engine.chat import ChatModelPolicy, HFChatModel, ServerChatModel
    from flowlearn.engine.loading import (
        BASE_SOURCE,
        DEFAULT_SOURCES,
        load_model_and_tokenizer,
        untrained_twin,
    )
    from flowlearn.engine.local import FrozenBasePolicy, HFPolicy, LocalPolicy
    from flowlearn.engine.protocol import (
        ChoosingModel,
        NodeBinding,
        Policy,
        PrefillPolicy,
        ServedPolicy,
    )
    from flowlearn.engine.sampling import Generation, Messages, Sampling
    from flowlearn.engine.scripted import ScriptedChatModel, ScriptedPolicy
    from flowlearn.engine.server import ServerPolicy
    from flowlearn.engine.tokens import BatchDecoder, DecodeStats, ModelHandle, TokenModel, sample

_LAZY = {
    **dict.fromkeys(("PolicyRef", "by_node"), "flowlearn.engine.adapters"),
    "BatchingPolicy": "flowlearn.engine.batching",
    **dict.fromkeys(("ChatModelPolicy", "HFChatModel", "ServerChatModel"), "flowlearn.engine.chat"),
    **dict.fromkeys(
        ("BASE_SOURCE", "DEFAULT_SOURCES", "load_model_and_tokenizer", "untrained_twin"),
        "flowlearn.engine.loading",
    ),
    **dict.fromkeys(("FrozenBasePolicy", "HFPolicy", "LocalPolicy"), "flowlearn.engine.local"),
    **dict.fromkeys(
        ("ChoosingModel", "NodeBinding", "Policy", "PrefillPolicy", "ServedPolicy"),
        "flowlearn.engine.protocol",
    ),
    **dict.fromkeys(("Generation", "Messages", "Sampling"), "flowlearn.engine.sampling"),
    **dict.fromkeys(("ScriptedChatModel", "ScriptedPolicy"), "flowlearn.engine.scripted"),
    "ServerPolicy": "flowlearn.engine.server",
    **dict.fromkeys(
        ("BatchDecoder", "DecodeStats", "ModelHandle", "TokenModel", "sample"),
        "flowlearn.engine.tokens",
    ),
}
"""Each public name and the module that defines it, imported on first use."""


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use, and keep it."""
    return lazy_attribute(name, _LAZY, globals())


def __dir__() -> list[str]:
    """List the public names beside the module's own."""
    return lazy_dir(_LAZY, globals())


__all__ = [
    "BASE_SOURCE",
    "DEFAULT_SOURCES",
    "BatchDecoder",
    "BatchingPolicy",
    "ChatModelPolicy",
    "ChoosingModel",
    "DecodeStats",
    "FrozenBasePolicy",
    "Generation",
    "HFChatModel",
    "HFPolicy",
    "LocalPolicy",
    "Messages",
    "ModelHandle",
    "ModelNotFoundError",
    "NodeBinding",
    "Policy",
    "PolicyRef",
    "PrefillPolicy",
    "Sampling",
    "ScriptedChatModel",
    "ScriptedPolicy",
    "ServedPolicy",
    "ServerChatModel",
    "ServerError",
    "ServerPolicy",
    "TokenModel",
    "by_node",
    "load_model_and_tokenizer",
    "sample",
    "untrained_twin",
]

"""The inference engine: a token-in/token-out core, the policies over it, thin chat adapters.

Layers, each importing only those below it: the sampling types (`Sampling`, `Generation`);
the token core (`tokens`: prompt ids in, completion ids and logprobs out, single and
continuously batched); the local policies over it (`local`: chat template -> ids -> core;
`batching`: concurrent calls decoded together) and the served one (`server`); the LangChain
adapters (`chat`). Importing this package stays light (no torch or transformers): those load
when a model does.
"""

from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.chat import ChatModelPolicy, HFChatModel, ServerChatModel
from flowlearn.engine.loading import (
    BASE_SOURCE,
    DEFAULT_SOURCES,
    load_model_and_tokenizer,
    untrained_twin,
)
from flowlearn.engine.local import FrozenBasePolicy, HFPolicy, LocalPolicy
from flowlearn.engine.protocol import ChoosingModel, Policy, PrefillPolicy
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.engine.scripted import ScriptedChatModel, ScriptedPolicy
from flowlearn.engine.server import ServerPolicy
from flowlearn.engine.tokens import BatchDecoder, DecodeStats, ModelHandle, TokenModel, sample
from flowlearn.errors import ModelNotFoundError, ServerError

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
    "Policy",
    "PrefillPolicy",
    "Sampling",
    "ScriptedChatModel",
    "ScriptedPolicy",
    "ServerChatModel",
    "ServerError",
    "ServerPolicy",
    "TokenModel",
    "load_model_and_tokenizer",
    "sample",
    "untrained_twin",
]

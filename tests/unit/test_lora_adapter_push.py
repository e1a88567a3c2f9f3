"""Adapters pushed to a vLLM server (load/unload, errors) and the importance correction of rows
an older adapter sampled."""

from __future__ import annotations

import math
import socket
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

import torch
from peft import LoraConfig, get_peft_model
from stand_in_server import Reply, stand_in_server
from transformers import AutoModelForCausalLM

from flowlearn.training.batches import rows_to_tensors
from flowlearn.training.rows import FlowGRPORow
from flowlearn.training.vllm.correction import correct_stale_rows, importance_weights
from flowlearn.training.vllm.lora_server import (
    AdapterError,
    AdapterServer,
    ServerGeneration,
)


def lora(model: Any) -> Any:
    adapter = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, adapter)


class ScriptedForward:
    """Stands in for the trainer in `correct_stale_rows`: its forward returns fixed logprobs."""

    def __init__(self, logps: list[list[float]], **settings: Any) -> None:
        self.logps = torch.tensor(logps)
        self._metrics: dict[str, Any] = {"train": defaultdict(list)}
        self.args = SimpleNamespace(per_device_train_batch_size=8, **settings)
        self.accelerator = SimpleNamespace(unwrap_model=lambda model: model, device="cpu")
        self.model = "the unwrapped model"
        self.processing_class = SimpleNamespace(pad_token_id=0)
        self.scored: list[list[int]] = []

    def _get_per_token_logps_and_entropies(
        self, model: Any, ids: Any, mask: Any, keep: int, *, batch_size: int
    ) -> tuple[Any, None, None]:
        self.scored += ids[:, -keep:].tolist()
        return self.logps[:, :keep], None, None


def row(version: str, completion: list[int], sampled: list[float]) -> FlowGRPORow:
    return FlowGRPORow(
        "t", "g", 1, [1, 2], completion, sampled, 2.0, 1.0, 1.0, policy_version=version
    )


def test_vllm_importance_weights_match_a_hand_computation() -> None:
    ours, sampled = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    # log-ratios 0.5, -1, 0: exp 1.6487, 0.3679, 1; their sum -0.5: exp 0.6065
    cases = {
        ("token_truncate", 0.5, 1.5): [1.5, 0.5, 1.0],
        ("token_mask", 0.5, 1.5): [0.0, 0.0, 1.0],
        ("sequence_truncate", 0.7, 1.5): [0.7] * 3,
        ("sequence_truncate", None, 1.5): [math.exp(-0.5)] * 3,
        ("sequence_mask", 0.7, 3.0): [0.0] * 3,
        ("sequence_mask", None, 3.0): [math.exp(-0.5)] * 3,
    }
    for (mode, low, high), expected in cases.items():
        weights = importance_weights(ours, sampled, mode, low, high).tolist()
        assert weights == pytest.approx(expected, rel=1e-6), mode
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode must be one of"):
        importance_weights(ours, sampled, "token")


def test_vllm_stale_rows_get_the_trainers_logprobs_and_capped_weights() -> None:
    rows = [
        row("step1", [5, 6], [-0.3, -0.4]),  # sampled by the weights trained: untouched
        row("step0", [5, 6], [-1.0, -2.0]),  # log-ratios 0.5, -0.5: sum 0, weight 1
        row("step0", [7], [-1.0]),  # log-ratio 0.8: weight e^0.8 = 2.2255
        row("step0", [8], [-3.0]),  # log-ratio 2: e^2 = 7.39 above the cap 3: masked
    ]
    trainer = ScriptedForward(
        [[-0.5, -2.5], [-0.2, 0.0], [-1.0, 0.0]],
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="sequence_mask",
        vllm_importance_sampling_clip_min=None,
        vllm_importance_sampling_clip_max=3.0,
    )
    assert correct_stale_rows(trainer, rows, "step1") == 3
    assert trainer.scored == [[5, 6], [7, 0], [8, 0]]  # only the stale rows, right-padded
    assert rows[0].old_logprobs == [-0.3, -0.4] and rows[0].token_scales is None
    assert [r.old_logprobs for r in rows[1:]] == [
        pytest.approx([-0.5, -2.5]),
        pytest.approx([-0.2]),
        pytest.approx([-1.0]),
    ]
    scales = [r.token_scales for r in rows[1:]]
    assert scales == [pytest.approx([1.0, 1.0]), pytest.approx([math.exp(0.8)]), [0.0]]
    metrics = trainer._metrics["train"]
    assert metrics["flow/stale_rows"] == [3.0]
    assert metrics["flow/stale_is_ratio"] == [pytest.approx((2 + math.exp(0.8)) / 4)]
    # The weights ride on the advantages TRL reads: A x weight per token.
    advantages = rows_to_tensors(rows, 0, "cpu", [1.0] * 4)["advantages"]
    expected = [[2.0, 2.0], [2.0, 2.0], [2 * math.exp(0.8), 0.0], [0.0, 0.0]]
    assert torch.allclose(advantages[:, :2], torch.tensor(expected))
    off = ScriptedForward([[0.0]], vllm_importance_sampling_correction=False)
    stale = [row("step0", [5], [-1.0])]
    assert correct_stale_rows(off, stale, "step1") == 1  # counted, trained as sampled
    assert off.scored == [] and stale[0].token_scales is None


def test_lora_adapter_pushes_keep_two_and_unload_older(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    unloads: list[str] = []

    def respond(request: Any) -> Reply:
        if request.path.endswith("unload_lora_adapter"):
            unloads.append(request.body["lora_name"])
        return Reply(200, "Success")

    with stand_in_server(respond) as server:
        adapters = AdapterServer(f"{server.url}/v1", tmp_path / "adapters", api_key_env=None)
        for step in range(3):
            adapters.push(model, f"a{step}")
        adapters.close()
    assert unloads == ["a0"] and adapters.loaded == ["a1", "a2"]
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["a1", "a2"]
    bodies = [r.body for r in server.requests if r.path == "/v1/load_lora_adapter"]
    assert bodies[2] == {"lora_name": "a2", "lora_path": str((tmp_path / "adapters/a2").resolve())}


def test_lora_adapter_errors_say_what_to_change(tiny_model_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "not-shared"
    with stand_in_server(lambda r: Reply(400, {"message": "No adapter found for x"})) as server:
        adapters = AdapterServer(f"{server.url}/v1", tmp_path, api_key_env=None)
        with pytest.raises(AdapterError, match=r"HTTP 400.*No adapter found.*same path"):
            adapters.load("a0", missing)
    replies = iter([Reply(400, {"message": "The lora adapter 'a0' has already been loaded."})])
    with stand_in_server(lambda r: next(replies, Reply(200, "Success"))) as server:
        adapters = AdapterServer(f"{server.url}/v1", tmp_path, api_key_env=None)
        adapters.load("a0", missing)  # a crashed run's adapter of that name: reloaded
        routes = [r.path.rsplit("/", 1)[1] for r in server.requests]
    assert routes == ["load_lora_adapter", "unload_lora_adapter", "load_lora_adapter"]
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    adapters = AdapterServer(f"http://127.0.0.1:{port}/v1", tmp_path, api_key_env=None)
    with pytest.raises(AdapterError, match=r"cannot reach the planner server.*vllm serve"):
        adapters.load("a0", missing)
    plain = SimpleNamespace(state=SimpleNamespace(global_step=0))
    with pytest.raises(ValueError, match=r"the model has none.*use_vllm"):
        ServerGeneration(adapters).live_policy(
            plain, AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        )

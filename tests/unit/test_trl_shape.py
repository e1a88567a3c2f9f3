"""FlowGRPOTrainer in TRL's shape: a model path, reward functions and a datasets.Dataset."""

from __future__ import annotations

import json
import math
import re
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("trl")

import datasets
import torch

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import SCORERS
from flowlearn.training.config import FlowGRPOConfig
from flowlearn.training.model import check_kernel, init_kwargs
from flowlearn.training.rewards import RewardFunctions, dataset_cases, reward_function
from flowlearn.training.trainer import FlowGRPOTrainer, read_metrics
from flowlearn.training.trajectories import Trajectory


def flow_config(out: Path, **overrides: Any) -> FlowGRPOConfig:
    values: dict[str, Any] = dict(
        output_dir=str(out),
        report_to="none",
        max_steps=1,
        questions_per_step=2,
        num_generations=2,
        max_turns=1,
        max_completion_length=8,
        engine_max_new_tokens=8,
        learning_rate=1e-3,
        save_strategy="no",
        bf16=False,
        seed=3,
    )
    return FlowGRPOConfig(**{**values, **overrides})


def test_one_step_from_a_model_path_reward_funcs_and_a_dataset(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[dict[str, Any]] = []

    def answer_length(completions: list[str], **kwargs: Any) -> list[float]:
        seen.append(kwargs)
        return [len(c) % 3 / 2 for c in completions]  # varies, so the groups train

    dataset = datasets.Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
                "solution": str(2 * i),
                "level": i,
            }
            for i in range(4)
        ]
    )
    trainer = FlowGRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=[answer_length, "exact_match"],
        args=flow_config(tmp_path / "out", reward_weights=[1.0, 2.0]),
        train_dataset=dataset,
    )
    assert trainer.flow_parts is not None and trainer.flow_parts.prompts.name == "agentflow"
    assert trainer.flow_parts.engine_name == str(tiny_model_dir)  # a frozen copy of the base
    trainer.train()
    assert trainer.state.global_step == 1
    printed = capsys.readouterr()
    assert "rollouts: 100%" in printed.err  # the step's rollouts show progress
    # one line a step, not TRL's dict of metrics (those go to metrics.jsonl)
    assert re.search(r"^step 1/1  reward -?\d.*  loss -?\d.*\d s$", printed.out, re.MULTILINE)
    assert "'loss'" not in printed.out + printed.err
    records = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1] and math.isfinite(records[0]["loss"])
    assert len(seen) == 4  # 2 questions x G=2, one call per rollout
    call = seen[0]
    assert isinstance(call["trajectories"][0], Trajectory)
    assert call["reference"][0] in {"0", "2", "4", "6"} and call["level"][0] in range(4)
    assert call["prompts"][0].startswith("What is ")
    trainer.save_model(str(tmp_path / "final"))  # named as trained, for `flowlearn run`
    record = json.loads((tmp_path / "final" / "flowlearn_prompts.json").read_text())
    assert record == {"prompts": "agentflow", "engine": str(tiny_model_dir)}


def test_reward_functions_sum_by_weight_and_skip_none() -> None:
    case = Case("q", "Capital?", "Paris", {"level": 2})
    trajectory = Trajectory("t", "q", "Capital?", "Paris", "paris", "<answer>paris</answer>", 0.0)

    def by_level(completions: list[str], level: list[int], **kwargs: Any) -> list[float]:
        return [float(level[0])]

    def not_mine(completions: list[str], **kwargs: Any) -> list[float | None]:
        return [None]

    score = RewardFunctions.of([by_level, "exact_match", not_mine], [0.5, 3.0, 1.0])
    assert score.score_rollout(trajectory, case) == (
        0.5 * 2 + 3.0 * 1.0,
        "by_level=2, exact_match_reward=1",
    )
    with pytest.raises(ValueError, match="every reward function returned None"):
        RewardFunctions.of(not_mine, None).score_rollout(trajectory, case)
    with pytest.raises(ValueError, match="non-finite reward"):
        RewardFunctions.of(lambda completions, **kw: [math.nan], None).score_rollout(
            trajectory, case
        )
    with pytest.raises(ValueError, match="returned 2 rewards for 1 completion"):
        RewardFunctions.of(lambda completions, **kw: [1.0, 1.0], None).score_rollout(
            trajectory, case
        )
    with pytest.raises(ValueError, match="2 values for 1 reward functions"):
        RewardFunctions.of(by_level, [1.0, 2.0])
    with pytest.raises(ValueError, match="reward models by hub id are not supported"):
        RewardFunctions.of("Qwen/reward-model", None)


def test_every_scorer_is_a_trl_reward_function_with_the_same_values() -> None:
    exact = reward_function("exact_match")
    assert exact(["Paris", "Rome"], reference=["paris", "paris"]) == [1.0, 0.0]
    game = reward_function("game24")
    assert game(["(1+2+3)*4"], reference=["x"], numbers=[[1, 2, 3, 4]]) == [1.0]
    for name, scorer in SCORERS.items():
        case = Case("0", "Q?", "4", {"numbers": [1, 1, 2, 2], "options": ["A) 4", "B) 5"]})
        func = reward_function(name)
        assert func(
            ["4"],
            reference=["4"],
            numbers=[case.metadata["numbers"]],
            options=[case.metadata["options"]],
        ) == [scorer("4", case).value]


def test_dataset_columns_in_trls_and_our_spellings() -> None:
    cases = dataset_cases(
        [
            {"question": "A?", "answer": "a", "id": "x"},
            {"prompt": "B?", "ground_truth": "b"},
            {
                "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "C?"}],
                "reference": "c",
            },
        ]
    )
    assert [c.id for c in cases] == ["x", "1", "2"]
    assert [c.query.split("\n")[0] for c in cases] == ["A?", "B?", "C?"]
    assert [c.reference for c in cases] == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"row 0: the record needs a text 'query'.*\['text'\]"):
        dataset_cases([{"text": "no question"}])
    with pytest.raises(ValueError, match="row 0: its prompt has no user message"):
        dataset_cases([{"prompt": [{"role": "system", "content": "s"}], "answer": "a"}])
    with pytest.raises(ValueError, match="train_dataset has no rows"):
        dataset_cases([])


def test_contradictory_shapes_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = [{"question": "A?", "answer": "a"}, {"question": "B?", "answer": "b"}]
    with pytest.raises(ValueError, match="drop benchmark/data from args"):
        FlowGRPOTrainer(
            str(tiny_model_dir),
            "exact_match",
            flow_config(tmp_path, benchmark="gameof24"),
            rows,
        )
    with pytest.raises(ValueError, match="train_dataset is required"):
        FlowGRPOTrainer(str(tiny_model_dir), "exact_match", flow_config(tmp_path))
    with pytest.raises(ValueError, match="reward_funcs is required"):
        FlowGRPOTrainer(str(tiny_model_dir), None, flow_config(tmp_path), rows)
    served = flow_config(tmp_path, planner_url="http://127.0.0.1:9/v1", lora=True)
    with pytest.raises(ValueError, match="TRL's shape samples the AgentFlow graph locally"):
        FlowGRPOTrainer(str(tiny_model_dir), "exact_match", served, rows)
    from trl import GRPOConfig

    with pytest.raises(ValueError, match="takes a FlowGRPOConfig"):
        FlowGRPOTrainer(
            str(tiny_model_dir), "exact_match", GRPOConfig(str(tmp_path), use_cpu=True), rows
        )
    with pytest.raises(ValueError, match="name two planners"):
        FlowGRPOTrainer(
            str(tiny_model_dir), "exact_match", flow_config(tmp_path, planner="other"), rows
        )
    from flowlearn.training.rollouts import Replay

    with pytest.raises(ValueError, match="a source takes args and no reward_funcs"):
        FlowGRPOTrainer(str(tiny_model_dir), "exact_match", flow_config(tmp_path), source=Replay())


def test_several_trained_nodes_from_a_model_name_in_trls_shape(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    dataset = datasets.Dataset.from_list(
        [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(2)]
    )
    trainer = FlowGRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=["exact_match"],
        args=flow_config(tmp_path / "out", train_nodes=["planner", "verifier"]),
        train_dataset=dataset,
    )
    assert trainer.roles is not None and trainer.roles.nodes == ("planner", "verifier")
    assert sorted(trainer.model.peft_config) == ["planner", "verifier"]
    trainer.train()
    final = tmp_path / "final"
    trainer.save_model(str(final))
    assert (final / "planner" / "adapter_config.json").is_file()
    assert (final / "verifier" / "adapter_config.json").is_file()
    record = json.loads((final / "flowlearn_adapters.json").read_text())
    assert (record["base"], record["nodes"]) == (str(tiny_model_dir), ["planner", "verifier"])
    assert record["base_kind"] == "folder" and record["base_fingerprint"]["vocab_size"] == 400


@pytest.mark.slow
def test_trls_shape_resumes_from_its_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import TrainerCallback

    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(2)]
    out = tmp_path / "out"

    def varied(completions: list[str], **kwargs: Any) -> list[float]:
        ids = [t.trajectory_id.split(":")[-1] for t in kwargs["trajectories"]]
        return [float(i.split("@")[0].endswith("/0")) for i in ids]  # differ: the steps train

    class AtStart(TrainerCallback):  # type: ignore[misc]
        weights: ClassVar[dict[str, Any]] = {}

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            AtStart.weights = {k: v.clone() for k, v in kwargs["model"].state_dict().items()}

    def trainer(steps: int) -> FlowGRPOTrainer:
        config = flow_config(out, max_steps=steps, save_strategy="steps", save_steps=1)
        return FlowGRPOTrainer(str(tiny_model_dir), [varied], config, rows, callbacks=[AtStart()])

    first = trainer(1)
    first.train()
    checkpoint = out / "checkpoint-1"
    assert (checkpoint / "trainer_state.json").is_file()
    after_one = {k: v.clone() for k, v in first.model.state_dict().items()}
    assert any(not torch.equal(AtStart.weights[k], v) for k, v in after_one.items())
    again = trainer(2)
    again.train(resume_from_checkpoint=str(checkpoint))
    for key, value in after_one.items():  # it started from the checkpoint's weights
        assert torch.allclose(AtStart.weights[key], value), key
    assert again.state.global_step == 2 and (out / "checkpoint-2").is_dir()
    log = [h for h in again.state.log_history if "flow/rows" in h]
    assert [h["step"] for h in log] == [1, 2]  # step 1's log came back with the checkpoint


def test_model_init_kwargs_load_the_planner_by_name_as_trl_does(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TRL's `model_init_kwargs` reach `from_pretrained` (an attention kernel, a dtype)."""
    dataset = datasets.Dataset.from_list(
        [{"prompt": f"What is {i} + 1?", "solution": "1"} for i in range(2)]
    )
    init = {"attn_implementation": "eager", "dtype": "bfloat16"}
    args = flow_config(tmp_path / "out", model_init_kwargs=init, lora=True)
    with caplog.at_level("WARNING"):
        trainer = FlowGRPOTrainer(
            model=str(tiny_model_dir), reward_funcs="exact_match", args=args, train_dataset=dataset
        )
    base = trainer.model.get_base_model()
    assert base.config._attn_implementation == "eager"
    frozen = [p.dtype for n, p in base.named_parameters() if "lora_" not in n]
    assert set(frozen) == {torch.bfloat16}  # the base as asked; the adapter trains in fp32
    assert {p.dtype for p in base.parameters() if p.requires_grad} == {torch.float32}
    assert args.model_init_kwargs == init  # given back after TRL's constructor
    assert "model_init_kwargs" not in caplog.text  # TRL was not told they went unused


@pytest.mark.parametrize(
    ("init", "message"),
    [
        ({"device_map": "auto"}, "device_map: flowlearn places the planner"),
        ({"quantization_config": {"load_in_4bit": True}}, "quantization_config is not supported"),
        ({"trust_remote_code": True}, "trust_remote_code: not supported"),
        ({"dtype": "bfloat16", "torch_dtype": "float16"}, "names two dtypes"),
        ({"dtype": "float8"}, "model_init_kwargs.dtype 'float8' is not one the planner loads"),
        # TRL's dtypes only, named by the key given
        ({"torch_dtype": "int8"}, "model_init_kwargs.torch_dtype 'int8' is not one"),
        # every load of the run would have to honour these, not the planner's alone
        ({"cache_dir": "elsewhere"}, r"model_init_kwargs.cache_dir: every load .* \$HF_HUB_CACHE"),
        ({"revision": "v1"}, "model_init_kwargs.revision: the untrained engine and a saved"),
        ({"gguf_file": "m.gguf"}, "model_init_kwargs.gguf_file: the planner is the model named"),
        # a secret in the config would be saved with every checkpoint (training_args.bin)
        ({"token": "hf_SECRETVALUE"}, r"model_init_kwargs.token: .* \$HF_TOKEN"),
        ({"use_auth_token": "hf_SECRETVALUE"}, "model_init_kwargs.use_auth_token: the training"),
        # full fine-tuning trains and samples fp32 weights, which flash attention cannot take
        ({"attn_implementation": "flash_attention_2"}, "runs in fp16 or bf16 only"),
        # a misspelt keyword reaches the model's constructor: a ValueError naming them, not a
        # TypeError from deep in transformers
        ({"attn_implemntation": "eager"}, r"model keywords \['attn_implemntation'\] failed"),
    ],
)
def test_model_init_kwargs_flowlearn_cannot_honour_are_refused(
    tiny_model_dir: Path, tmp_path: Path, init: dict[str, Any], message: str
) -> None:
    dataset = datasets.Dataset.from_list(
        [{"prompt": f"What is {i} + 1?", "solution": "1"} for i in range(2)]
    )
    with pytest.raises(ValueError, match=message) as err:
        FlowGRPOTrainer(
            model=str(tiny_model_dir),
            reward_funcs="exact_match",
            args=flow_config(tmp_path / "out", model_init_kwargs=init),
            train_dataset=dataset,
        )
    assert "SECRETVALUE" not in str(err.value)  # the error never echoes a token
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert not any("SECRETVALUE" in p.read_text(errors="replace") for p in written), written


def test_model_init_kwargs_in_trls_other_spellings_mean_the_same() -> None:
    """A torch dtype or its name, and TRL's own None for the device map and quantization."""
    given = {
        "dtype": torch.bfloat16,
        "torch_dtype": "bfloat16",
        "device_map": None,
        "quantization_config": None,
        "attn_implementation": "sdpa",
    }
    config = types.SimpleNamespace(model_init_kwargs=given)
    assert init_kwargs(config) == ({"attn_implementation": "sdpa"}, "bfloat16")
    # TRL's default dtype is None: the planner's own choice (fp32 to train, bf16 base on a GPU)
    config = types.SimpleNamespace(model_init_kwargs={"dtype": None, "torch_dtype": None})
    assert init_kwargs(config) == ({}, None)


@pytest.mark.parametrize(
    ("lora", "dtype", "device", "refused"),
    [
        (False, None, "cuda", "fully fine-tuned planner trains and samples with fp32"),
        (False, "bfloat16", "cuda", "fully fine-tuned planner"),  # training upcasts them
        (True, None, "cpu", r"frozen base would be fp32 \(on a CPU"),
        (True, "float32", "cuda", r"frozen base would be fp32 \(dtype float32\)"),
        (True, None, "cuda", None),  # a bf16 base on a GPU: the kernel's case
        (True, "bfloat16", "cuda", None),
        (True, "auto", "cuda", None),  # the checkpoint's dtype: left to the load
    ],
)
def test_flash_attention_is_refused_wherever_the_planner_decodes_fp32_weights(
    lora: bool, dtype: str | None, device: str, refused: str | None
) -> None:
    init = {"attn_implementation": "flash_attention_2"}
    if refused is None:
        check_kernel(init, lora, dtype, device)
        check_kernel({"attn_implementation": "sdpa"}, lora, dtype, device)
        return
    with pytest.raises(ValueError, match=refused):
        check_kernel(init, lora, dtype, device)
    check_kernel({"attn_implementation": "sdpa"}, lora, dtype, device)  # any other kernel


def test_model_init_kwargs_beside_a_loaded_model_are_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    dataset = datasets.Dataset.from_list(
        [{"prompt": f"What is {i} + 1?", "solution": "1"} for i in range(2)]
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    args = flow_config(tmp_path / "out", model_init_kwargs={"attn_implementation": "eager"})
    with pytest.raises(ValueError, match="loads the model by name; this model is loaded"):
        FlowGRPOTrainer(model=model, reward_funcs="exact_match", args=args, train_dataset=dataset)
    # the flow's own shapes too: TRL would only log that it ignores them
    with pytest.raises(ValueError, match="loads the model by name; this model is loaded") as err:
        FlowGRPOTrainer.offline(model, args=args, trajectories=[])
    assert "pass its name" not in str(err.value)  # offline and online take loaded models only
    assert "drop args.model_init_kwargs" in str(err.value)


def test_mask_truncated_completions_leaves_cut_off_turns_out_of_the_step(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    dataset = datasets.Dataset.from_list(
        [{"prompt": f"What is {i} + 1?", "solution": "1"} for i in range(2)]
    )
    args = flow_config(tmp_path / "out", mask_truncated_completions=True)
    trainer = FlowGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs="exact_match", args=args, train_dataset=dataset
    )
    trainer.train()
    (record,) = read_metrics(tmp_path / "out" / "metrics.jsonl")
    # a random tiny planner rambles to its budget of 8 tokens: those turns are not trained on
    assert record["flow/rows_truncated"] > 0
    assert record["flow/rows"] + record["flow/rows_truncated"] == 4  # 2 questions x G=2, 1 turn


@pytest.mark.slow
def test_trls_shape_trains_one_step_off_policy(tiny_model_dir: Path, tmp_path: Path) -> None:
    dataset = datasets.Dataset.from_list(
        [{"prompt": f"What is {i} + {i}?", "solution": str(2 * i)} for i in range(6)]
    )

    def answer_length(completions: list[str], **kwargs: Any) -> list[float]:
        return [len(c) % 3 / 2 for c in completions]  # varies, so the groups train

    trainer = FlowGRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=[answer_length],
        args=flow_config(tmp_path / "out", max_steps=3, max_staleness=1),
        train_dataset=dataset,
    )
    assert trainer.max_staleness == 1 and trainer.rollouts_ahead is not None
    trainer.train()
    records = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[1]["flow/staleness"] == 1 and records[1]["flow/stale_rows"] > 0
    assert all(r["flow/row_staleness_max"] <= 1 for r in records)

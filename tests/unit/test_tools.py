from __future__ import annotations

import os

import pytest
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.graphs import build_agentflow
from flowlearn.nodes.tools import default_tools, generalist_tool, python_tool, run_python
from flowlearn.nodes.tools.python_sandbox import extract_code


def test_python_prints_result() -> None:
    assert run_python("print(17 * 23)") == "391"


def test_python_infinite_loop_is_killed() -> None:
    assert "timed out after 1 s" in run_python("while True:\n    pass", timeout=1)


def test_python_memory_limit() -> None:
    out = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=256)
    assert "MemoryError" in out and "allocated" not in out


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_python_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch, isolation: str) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    monkeypatch.setenv("MY_SECRET", "x")
    out = run_python("import os\nprint(sorted(os.environ))", isolation=isolation)
    assert out.startswith("['HOME',")
    assert not any(word in out for word in ("KEY", "TOKEN", "SECRET"))


def test_python_files_land_in_the_sandbox_folder_only() -> None:
    out = run_python("import os\nopen('f.txt', 'w').write('x')\nos.getcwd(), sorted(os.listdir())")
    assert out == "('/sandbox', ['.shm', 'f.txt', 'main.py'])"
    assert not os.path.exists("/sandbox/f.txt")


def test_python_unisolated_files_land_in_a_removed_temp_dir() -> None:
    code = "import os\nopen('f.txt', 'w').write('x')\nprint(os.getcwd())"
    out = run_python(code, isolation="none")
    assert "flowlearn-py-" in out
    assert not os.path.exists(out.strip())


def test_python_output_is_capped_with_marker() -> None:
    out = run_python("print('x' * 100000)", max_output_chars=100)
    assert out.startswith("x" * 100) and "output truncated" in out
    assert len(out) < 200


def test_python_syntax_error_is_readable() -> None:
    out = run_python("def f(:\n")
    assert "SyntaxError" in out and out.startswith("Error (exit code 1)")


def test_python_tool_accepts_fenced_code() -> None:
    assert python_tool().invoke({"code": "```python\nprint(2 + 2)\n```"}) == "4"
    assert extract_code("no fences") == "no fences"


def test_generalist_calls_engine() -> None:
    assert generalist_tool(FakeChatModel(text="Paris")).invoke({"query": "capital?"}) == "Paris"


def test_user_tool_appears_in_prompt_and_runs() -> None:
    @tool
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    shout.metadata = {"usage_notes": "Only for emphasis."}
    policy = ScriptedPolicy([plan("Shout")])
    engine = FakeChatModel(default_args={"text": "hi"}, text="Conclusion: STOP <answer>HI</answer>")
    state = build_agentflow(policy, engine, [*default_tools(engine), shout]).invoke(
        {"question": "q"}
    )
    prompt = policy.calls[0][-1]["content"]
    assert "- shout: Upper-case the text." in prompt and "Usage notes: Only for emphasis." in prompt
    assert "- python:" in prompt and "- generalist:" in prompt
    assert state["memory"][0]["result"] == "HI"


def test_default_tools_with_scripted_planner_compute_arithmetic() -> None:
    engine = FakeChatModel(
        default_args={"code": "print(17 * 23)"}, text="Conclusion: STOP\n<answer>391</answer>"
    )
    graph = build_agentflow(ScriptedPolicy([plan("python")]), engine, default_tools(engine))
    state = graph.invoke({"question": "What is 17 * 23?"})
    assert state["memory"][0]["tool"] == "python" and state["memory"][0]["result"] == "391"
    generator_prompt = state["transitions"][-1]["messages"][-1]["content"]
    assert "Result: 391" in generator_prompt

"""Red-team attacks on options, configs and terminal output: each ends in a clear refusal."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from flowlearn.cli import main
from flowlearn.nodes.schema.context import Context


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(list(argv))
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_turns": 10**22}, "max_turns must be a whole number in [1, 100]"),
        ({"max_turns": 3.0}, "max_turns must be a whole number"),
        ({"max_result_chars": 10**12}, "max_result_chars must be a whole number in [100, 1000000]"),
        (
            {"tool_timeout_s": 1e9},
            "tool_timeout_s must be > 0 (a finite number of seconds) and at most 3600",
        ),
        (
            {"max_seconds": 1e12},
            "max_seconds must be > 0 (a finite number of seconds) and at most 604800",
        ),
        ({"planner_max_new_tokens": 10**9}, "max_new_tokens must be a whole number in [1, 131072]"),
        ({"planner_temperature": float("nan")}, "temperature must be a finite number in [0, 10]"),
        ({"planner_temperature": 1e6}, "temperature must be a finite number in [0, 10]"),
        ({"planner_top_p": float("nan")}, "top_p must be in (0, 1]"),
        ({"approve_tools": "false"}, "approve_tools must be true or false, got 'false'"),
        ({"query_analysis": "false"}, "query_analysis must be true or false or null"),
        ({"tools": ()}, "tools must name at least one tool"),
        ({"tools": [""]}, "tools must name at least one tool"),
        ({"tools": "python"}, "tools must be a list of tool names"),
    ],
)
def test_context_refuses_values_past_their_bounds_or_of_the_wrong_kind(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Context.from_dict(values)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "q", "--tools", ""], "tools must name at least one tool"),
        (["run", "q", "--tools", " , "], "tools must name at least one tool"),
        (["run", "q", "--temperature", "nan"], "temperature must be a finite number"),
        (["run", "q", "--max-turns", "100000"], "max_turns must be a whole number in [1, 100]"),
        (["run", "\udcff\udcfe"], "the question is not UTF-8 text"),
        (["eval", "--benchmark", "gameof24", "--concurrency", "100000"], "[1, 64]"),
        (["eval", "--benchmark", "gameof24", "--limit", "1000000000"], "[1, 10000000]"),
        (
            ["collect", "--benchmark", "gameof24", "--out", "x.jsonl", "--group-size", "9999"],
            "1024",
        ),
        (
            ["collect", "--benchmark", "gameof24", "--out", "x.jsonl", "--concurrency", "0"],
            "[1, 64]",
        ),
    ],
)
def test_cli_options_past_their_bounds_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, err = cli(capsys, *argv)
    assert status == 2, err
    assert message in err
    assert "Traceback" not in err


def test_a_file_that_is_not_a_corpus_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for corpus in (passwd, Path("/etc/passwd")) if Path("/etc/passwd").is_file() else (passwd,):
        status, err = cli(capsys, "run", "q", "--corpus", str(corpus))
        assert status == 2
        assert f"--corpus {corpus} is not a JSONL corpus" in err and ":1:" in err


def test_a_folder_with_no_model_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = cli(capsys, "run", "q", "--planner", str(tmp_path))
    assert status == 2
    assert "holds no model (no config.json or adapter_config.json)" in err


def test_terminal_control_sequences_never_reach_the_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flowlearn.run_command import print_update, printable

    hostile = "ok\x1b[2J\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x1b\\\x9b31m\x07 done"
    record = {"turn": 1, "tool": "web_search", "arguments": {"q": "\x1b[31mx"}, "result": hostile}
    print_update("executor", {"memory": [record]})
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "ok" in out and "done" in out
    assert printable("line\nnext\ttab") == "line\nnext\ttab"


# Training configs ----------------------------------------------------------------------------


def parse(tmp_path: Path, text: str) -> Any:
    pytest.importorskip("trl")
    from flowlearn.training.config import parse_config

    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return parse_config(["--config", str(path)])


BASE = f"benchmark: gameof24\nreport_to: none\noutput_dir: {'{out}'}\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("max_steps: 1.0e+26\n", "max_steps must be in [1, 10000000]"),
        ("num_generations: 100000\n", "num_generations must be in [1, 1024]"),
        ("max_turns: 1000\n", "max_turns must be in [1, 100]"),
        ("temperature: 1e9\n", "temperature must be in (0, 10]"),
        ("tools: []\n", "tools must name at least one tool"),
        ("max_steps: 3\nmax_steps: 5\n", "gives ['max_steps'] more than once"),
    ],
)
def test_a_training_config_past_its_bounds_or_with_a_repeated_key_is_refused(
    tmp_path: Path, extra: str, message: str
) -> None:
    text = BASE.format(out=tmp_path / "out") + extra
    with pytest.raises(ValueError, match=re.escape(message)):
        parse(tmp_path, text)


def test_a_yaml_alias_bomb_is_refused_before_trls_parser(tmp_path: Path) -> None:
    lines = ['a0: ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    anchored = [
        f"{line.split(':')[0]}: &{line.split(':')[0]} {line.split(': ', 1)[1]}" for line in lines
    ]
    text = BASE.format(out=tmp_path / "out") + "bomb:\n" + "".join(f"  {a}\n" for a in anchored)
    with pytest.raises(ValueError, match="expands to more than 100000 values"):
        parse(tmp_path, text)


def test_a_huge_config_file_is_refused(tmp_path: Path) -> None:
    text = BASE.format(out=tmp_path / "out") + "# " + "x" * (2 << 20) + "\n"
    with pytest.raises(ValueError, match="larger than 1048576 bytes"):
        parse(tmp_path, text)


# Studio: the Host header (DNS rebinding) ----------------------------------------------------


def host_client(**guard: Any) -> Any:
    pytest.importorskip("starlette")
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from flowlearn.studio_http import OriginGuard

    async def thread(request: Request) -> JSONResponse:
        return JSONResponse({"thread": "secret"})

    inner = Starlette(routes=[Route("/threads/t1", thread)])
    app = OriginGuard(inner, allow_origins=["https://smith.langchain.com"], **guard)
    return TestClient(app, base_url="http://127.0.0.1:2024")


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:2024", 200),
        ("localhost:2024", 200),
        ("[::1]:2024", 200),
        ("LOCALHOST", 200),
        ("rebind.evil.example:2024", 421),
        ("127.0.0.1.nip.io:2024", 421),
    ],
)
def test_studio_refuses_a_foreign_host_header_even_on_get(host: str, status: int) -> None:
    response = host_client().get("/threads/t1", headers={"Host": host})
    assert response.status_code == status
    if status == 421:
        assert "DNS rebinding" in response.json()["detail"] and "secret" not in response.text


def test_studio_admits_the_hosts_it_is_told_of() -> None:
    client = host_client(allow_hosts=["localhost", "studio.example.net"])
    assert client.get("/threads/t1", headers={"Host": "studio.example.net"}).status_code == 200

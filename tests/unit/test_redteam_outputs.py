"""Red-team attacks on output folders and stores: each run writes only into what is its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flowlearn.cli import build_parser, main
from flowlearn.compose import run_settings
from flowlearn.errors import UsageError
from flowlearn.flow_setup import context_from_args, spec_from_args
from flowlearn.outputs import MARKER, claim_folder, claim_store, read_marker, store_marker


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(list(argv))
    return status, capsys.readouterr().err


def user_files(folder: Path) -> dict[str, str]:
    """A folder of someone's work that a run must leave untouched."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"README.md": "my notes\n", "final/config.json": "{}\n", "checkpoint-1/x.bin": "w"}
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    return files


def unchanged(folder: Path, files: dict[str, str]) -> bool:
    paths = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    same = all((folder / n).read_text(encoding="utf-8") == t for n, t in files.items())
    return same and paths == set(files)


# Item 3: output folders belong to their run -------------------------------------------------


@pytest.mark.parametrize("command", ["eval", "collect"])
def test_eval_and_collect_refuse_a_folder_or_file_of_unrelated_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    if command == "eval":
        out = tmp_path / "mine"
        files = user_files(out)
    else:
        out = tmp_path / "notes.jsonl"
        out.write_text('{"mine": 1}\n', encoding="utf-8")
    status, err = cli(capsys, command, "--benchmark", "gameof24", "--out", str(out))
    assert status == 2
    assert str(out) in err and "give a new" in err
    if command == "eval":
        assert unchanged(out, files)
    else:
        assert out.read_text(encoding="utf-8") == '{"mine": 1}\n'
        assert not store_marker(out).exists()


def train_config(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    config = tmp_path / "train.yaml"
    config.write_text(f"benchmark: gameof24\noutput_dir: {out}\nreport_to: none\n")
    return ["train", "--config", str(config), *extra]


def test_train_refuses_a_folder_of_unrelated_files_and_touches_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("trl")
    out = tmp_path / "mine"
    files = user_files(out)
    (out / ".final.partial-x").mkdir()  # a staging-like folder of the user's
    files_and_partial = {**files}
    status, err = cli(capsys, *train_config(tmp_path, out))
    assert status == 2
    assert f"output_dir {out} is not empty" in err and "give a new folder" in err
    assert unchanged(out, files_and_partial)
    assert (out / ".final.partial-x").is_dir()


@pytest.mark.parametrize("where", ["root", "home", "project"])
def test_root_home_and_a_project_tree_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\n")
    folder = {"root": Path("/"), "home": tmp_path / "home", "project": project}[where]
    words = {"root": "filesystem root", "home": "home folder", "project": "holds a project"}
    with pytest.raises(UsageError, match=words[where]):
        claim_folder(folder, "eval", {"data": "x"})
    assert (project / "pyproject.toml").read_text() == "[project]\n"


def test_a_run_folder_is_marked_and_reused_by_its_own_command_only(tmp_path: Path) -> None:
    out = tmp_path / "run"
    marker = claim_folder(out, "eval", {"data": "a"})
    assert read_marker(out / MARKER) == marker and marker["command"] == "eval"
    (out / "results.jsonl").write_text("{}\n")
    assert claim_folder(out, "eval", {"data": "a"})["run_id"] == marker["run_id"]
    with pytest.raises(UsageError, match="belongs to a flowlearn eval run"):
        claim_folder(out, "train", flag="output_dir")


def _claim_at_once(folder: str, start: Any, results: Any) -> None:
    start.wait()
    try:
        marker = claim_folder(Path(folder), "train", create=False)
        marker = claim_folder(Path(folder), "train", flag="output_dir")
        results.put(marker["run_id"])
    except UsageError as exc:
        results.put(f"refused: {exc}")


@pytest.mark.slow
def test_processes_of_one_job_claiming_a_folder_at_once_all_get_one_marker(
    tmp_path: Path,
) -> None:
    """Ranks of one `accelerate launch` job check and claim the same folder at the same time."""
    import multiprocessing

    context = multiprocessing.get_context("fork")  # fast to start, so the claims overlap
    for attempt in range(20):
        folder = tmp_path / f"out{attempt}"
        start, results = context.Barrier(6), context.Queue()
        workers = [
            context.Process(target=_claim_at_once, args=(str(folder), start, results))
            for _ in range(6)
        ]
        for worker in workers:
            worker.start()
        ids = {results.get(timeout=60) for _ in workers}
        for worker in workers:
            worker.join(timeout=60)
        assert len(ids) == 1 and not next(iter(ids)).startswith("refused"), ids
        assert sorted(p.name for p in folder.iterdir()) == [MARKER]


def test_another_process_marker_in_the_writing_does_not_make_a_folder_foreign(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / f".{MARKER}.k3j2.tmp").write_text('{"command": "train"}')  # a rank mid-write
    assert claim_folder(out, "train", flag="output_dir", create=False) is None
    assert claim_folder(out, "train", flag="output_dir")["command"] == "train"
    (out / "notes.txt").write_text("mine")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        claim_folder(other, "train", flag="output_dir")


def test_a_fresh_training_run_refuses_an_earlier_runs_checkpoints_and_final(
    tmp_path: Path,
) -> None:
    pytest.importorskip("trl")
    from types import SimpleNamespace

    from flowlearn.training.run import claim_output_dir, refuse_foreign_model

    out = tmp_path / "out"
    config = SimpleNamespace(output_dir=str(out))
    claim_output_dir(config, resuming=False)
    (out / "checkpoint-1").mkdir()
    with pytest.raises(UsageError, match="holds checkpoint-1 of an earlier run; pass --resume"):
        claim_output_dir(config, resuming=False)
    claim_output_dir(config, resuming=True)
    (out / "final").mkdir()
    (out / "final" / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="was not saved by flowlearn train"):
        refuse_foreign_model(out / "final")  # a final/ the user put there is never replaced
    (out / "final" / MARKER).write_text(json.dumps({"command": "train"}))
    refuse_foreign_model(out / "final")


def test_an_older_flowlearn_training_folder_is_adopted(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from types import SimpleNamespace

    from flowlearn.training.run import claim_output_dir

    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"run_id": "r1", "rollout_settings": {}}))
    (out / "checkpoint-2").mkdir()
    claim_output_dir(SimpleNamespace(output_dir=str(out)), resuming=True)
    assert read_marker(out / MARKER)["command"] == "train"  # type: ignore[index]


# Item 4: reuse only what matches -----------------------------------------------------------


def eval_settings(*argv: str) -> dict[str, Any]:
    args = build_parser().parse_args(["eval", *argv])
    return run_settings(
        spec_from_args(args),
        context_from_args(args),
        benchmark=args.benchmark,
        data=args.data,
        scorer=args.scorer,
        limit=args.limit,
        judge=args.judge,
    )


def seed_eval(out: Path, *argv: str) -> None:
    claim_folder(out, "eval", eval_settings(*argv), free_to_change=("limit",))
    (out / "results.jsonl").write_text(json.dumps({"id": "c1", "score": 1.0}) + "\n")


@pytest.mark.parametrize(
    ("first", "then", "named"),
    [
        (["--benchmark", "gameof24"], ["--benchmark", "bamboogle"], "data 'benchmark gameof24'"),
        (
            ["--benchmark", "gameof24"],
            ["--benchmark", "gameof24", "--scorer", "exact_match"],
            "scorer 'game24', now 'exact_match'",
        ),
        (
            ["--benchmark", "gameof24", "--max-turns", "3"],
            ["--benchmark", "gameof24", "--max-turns", "5"],
            "max_turns 3, now 5",
        ),
    ],
)
def test_eval_into_another_runs_results_refuses_and_names_the_difference(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    first: list[str],
    then: list[str],
    named: str,
) -> None:
    out = tmp_path / "eval"
    seed_eval(out, *first)
    before = (out / "results.jsonl").read_text()
    status, err = cli(capsys, "eval", *then, "--out", str(out))
    assert status == 2
    assert named in err and "made with other settings" in err
    assert (out / "results.jsonl").read_text() == before


def test_eval_with_the_same_settings_resumes_and_a_new_limit_is_free(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    seed_eval(out, "--benchmark", "gameof24", "--limit", "2")
    marker = claim_folder(
        out,
        "eval",
        eval_settings("--benchmark", "gameof24", "--limit", "4"),
        free_to_change=("limit",),
    )
    assert marker["settings"]["limit"] == 4
    assert (out / "results.jsonl").read_text().count("\n") == 1  # kept for the resume


def test_an_edited_data_file_counts_as_other_data(tmp_path: Path) -> None:
    data = tmp_path / "cases.jsonl"
    data.write_text('{"id": "1", "query": "q", "reference": "a"}\n')
    out = tmp_path / "eval"
    seed_eval(out, "--data", str(data), "--scorer", "exact_match")
    data.write_text('{"id": "1", "query": "q", "reference": "b"}\n')
    with pytest.raises(UsageError, match=r"data 'file cases.jsonl sha256:"):
        claim_folder(out, "eval", eval_settings("--data", str(data), "--scorer", "exact_match"))


def test_collect_into_a_store_made_with_another_temperature_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "rollouts.jsonl"
    args = build_parser().parse_args(["collect", "--benchmark", "gameof24", "--out", str(store)])
    settings = run_settings(
        spec_from_args(args),
        context_from_args(args),
        benchmark="gameof24",
        data=None,
        scorer=None,
        limit=None,
    )
    claim_store(store, "collect", {**settings, "format_penalty": 0.0})
    store.write_text('{"id": "q/0"}\n')
    status, err = cli(
        capsys, "collect", "--benchmark", "gameof24", "--out", str(store), "--temperature", "1.0"
    )
    assert status == 2
    assert "temperature 0.7, now 1.0" in err
    assert store.read_text() == '{"id": "q/0"}\n'

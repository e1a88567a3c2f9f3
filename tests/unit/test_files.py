"""The durable JSONL appender, the atomic writers and the resumable runner."""

from __future__ import annotations

import gc
import json
import logging
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest

from flowlearn.evals.harness import read_results
from flowlearn.evals.runner import heap_frozen, run_resumable
from flowlearn.files import JsonlFile, read_capped, save_atomically, write_atomically


def test_a_torn_last_line_is_cut_before_the_next_append_and_restarts_stay_intact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "results.jsonl"
    JsonlFile(path).append({"id": "0"})
    with path.open("a") as handle:
        handle.write('{"id": "1", "answer": "par')  # killed mid-write
    JsonlFile(path).append({"id": "2"})  # a restart
    assert "cut off a torn last line" in caplog.text
    assert path.read_text().splitlines() == ['{"id": "0"}', '{"id": "2"}']
    with path.open("a") as handle:
        handle.write('{"id": "3"')  # killed again
    JsonlFile(path).append({"id": "4"})  # a second restart
    assert [r["id"] for r in JsonlFile(path).records()] == ["0", "2", "4"]
    assert path.read_bytes().endswith(b"\n")


def test_a_whole_last_record_missing_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "0"}')  # e.g. written by hand
    JsonlFile(path).append({"id": "1"})
    assert [r["id"] for r in JsonlFile(path).records()] == ["0", "1"]


def test_a_torn_file_with_only_a_partial_line_is_emptied_first(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": ')
    JsonlFile(path).append({"id": "1"})
    assert path.read_text() == '{"id": "1"}\n'


def test_read_skips_an_undecodable_line_with_a_warning_naming_file_and_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b", "x\n\n{"id": "c"}\n{"id": "d"')
    skipped: list[int] = []
    with caplog.at_level(logging.WARNING):
        ids = [data["id"] for _, data in JsonlFile(path).read(skipped=skipped)]
    assert ids == ["a", "c"]
    assert skipped == [2, 5]
    assert f"{path}:2" in caplog.text and f"{path}:5" in caplog.text


def test_eval_results_with_a_torn_line_resume_without_gluing(tmp_path: Path) -> None:
    """The real bug: a torn results.jsonl got the next result glued onto the torn line."""
    path = tmp_path / "results.jsonl"
    row = {"id": "0", "query": "q", "reference": "r", "answer": "a", "score": 1.0}
    JsonlFile(path).append({**row, "reason": "ok", "turns": 1})
    path.write_text(path.read_text() + '{"id": "1", "query": "q')
    JsonlFile(path).append({**row, "id": "2", "reason": "ok", "turns": 1})
    assert [r.id for r in read_results(path)] == ["0", "2"]


def test_concurrent_appends_give_whole_lines(tmp_path: Path) -> None:
    file = JsonlFile(tmp_path / "t.jsonl")
    threads = [
        threading.Thread(target=lambda n=n: [file.append({"n": n, "k": k}) for k in range(25)])
        for n in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = file.path.read_text().splitlines()
    assert len(lines) == 100 and all(json.loads(line) for line in lines)


def test_atomic_write_leaves_the_old_file_when_the_writer_raises(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    write_atomically(target, lambda tmp: tmp.write_text("old"))

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(target, half_then_fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temp file left
    write_atomically(target, lambda tmp: tmp.write_text("new"))
    assert target.read_text() == "new"


def test_atomic_folder_save_replaces_the_whole_folder(tmp_path: Path) -> None:
    final = tmp_path / "final"
    save_atomically(final, lambda d: (d.mkdir(), (d / "a").write_text("1")))
    save_atomically(final, lambda d: (d.mkdir(), (d / "b").write_text("2")))
    assert sorted(p.name for p in final.iterdir()) == ["b"]


def test_runner_skips_done_ids_saves_each_result_and_leaves_failures_for_next_time() -> None:
    saved: list[int] = []

    def square(n: int) -> int:
        if n == 3:
            raise RuntimeError("flaky")
        return n * n

    fresh = run_resumable(
        {str(n): n for n in range(5)},
        square,
        done={"0", "1"},
        save=saved.append,
        concurrency=2,
        progress=False,
    )
    assert fresh == {"2": 4, "4": 16}
    assert sorted(saved) == [4, 16]


def test_the_runner_keeps_older_objects_out_of_the_collector_until_the_last_run_ends() -> None:
    """Objects from before a run are frozen (no full collection walks them) while it runs."""
    inside: list[tuple[bool, bool]] = []

    class Node:
        other: Node

    def look(n: int) -> int:
        frozen = gc.get_freeze_count() > 0
        cycle = Node()  # made inside: cyclic garbage is collected as usual
        cycle.other = cycle
        dead = weakref.ref(cycle)
        del cycle
        gc.collect()
        inside.append((frozen, dead() is None))
        return n

    assert gc.get_freeze_count() == 0
    with heap_frozen():  # an outer run (e.g. an eval around a collect) keeps it frozen
        run_resumable({str(n): n for n in range(4)}, look, concurrency=2, progress=False)
        assert gc.get_freeze_count() > 0
    assert inside == [(True, True)] * 4
    assert gc.get_freeze_count() == 0  # the last scope out unfreezes

    def crash(n: int) -> int:
        raise RuntimeError("a crashed item")

    run_resumable({"a": 1}, crash, progress=False)
    assert gc.get_freeze_count() == 0

    gc.freeze()  # a process that froze its own objects (a pre-fork server) is left as it is
    try:
        before = gc.get_freeze_count()
        younger = [[n] for n in range(50_000)]  # made after its freeze: a run must not pin them
        run_resumable({"a": 1}, look, progress=False)
        # Frozen objects still die by reference count (a finished thread's, an earlier test's),
        # so the count may fall; freezing again would have raised it by the 50,000 above.
        assert 0 < gc.get_freeze_count() < before + len(younger) // 2
    finally:
        gc.unfreeze()


def test_a_concurrent_saver_keeps_the_folder_already_in_place(tmp_path: Path) -> None:
    target = tmp_path / "model"

    def write(text: str) -> Callable[[Path], None]:
        return lambda staging: (staging.mkdir(), (staging / "config.json").write_text(text))

    def first(staging: Path) -> None:
        write("first")(staging)
        save_atomically(target, write("other"), replace=False)

    save_atomically(target, first, replace=False)  # the other saver finished first: it wins
    assert (target / "config.json").read_text() == "other"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no staging left behind


def test_staging_left_by_a_crash_is_cleared_by_the_next_save(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint-1"
    crashed = tmp_path / ".checkpoint-1.partial-abc"
    crashed.mkdir()
    save_atomically(target, lambda s: (s.mkdir(), (s / "f").write_text("x")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]


def test_read_capped_returns_a_small_file_and_refuses_a_large_one(tmp_path: Path) -> None:
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_bytes(b"x" * 10)
    large.write_bytes(b"x" * 11)
    assert read_capped(small, 10) == b"x" * 10
    assert read_capped(large, 10) is None
    with pytest.raises(OSError):
        read_capped(tmp_path / "absent", 10)

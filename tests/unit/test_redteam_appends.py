"""Red-team attack on the durable JSONL appender: several processes appending to one file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowlearn.files import JsonlFile

RECORD_BYTES = 256 * 1024  # large enough that an unlocked repair cuts records (10 of 200)
PER_WRITER = 50

# Each writer waits for the go file, so all of them append at once.
WRITER = """
import sys, time
from pathlib import Path
from flowlearn.files import JsonlFile
path, go = sys.argv[1], Path(sys.argv[5])
writer, count, size = (int(a) for a in sys.argv[2:5])
while not go.exists():
    time.sleep(0.001)
target = JsonlFile(path)
for i in range(count):
    target.append({"writer": writer, "i": i, "pad": chr(97 + (writer + i) % 26) * size})
"""


def append_concurrently(path: Path, writers: int) -> None:
    go = path.with_name("go")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), *map(str, (w, PER_WRITER, RECORD_BYTES, go))]
        )
        for w in range(writers)
    ]
    time.sleep(0.5)  # let every writer start and wait
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=300) == 0


@pytest.mark.slow
@pytest.mark.parametrize("writers", [2, 4])
def test_concurrent_appenders_lose_nothing_and_tear_nothing(tmp_path: Path, writers: int) -> None:
    path = tmp_path / "shared.jsonl"
    append_concurrently(path, writers)
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # the file ends with a newline
    records = [json.loads(line) for line in lines[:-1]]  # every line whole JSON: none torn
    seen = [(r["writer"], r["i"]) for r in records]
    assert sorted(seen) == [(w, i) for w in range(writers) for i in range(PER_WRITER)]  # once
    for r in records:
        assert r["pad"] == chr(97 + (r["writer"] + r["i"]) % 26) * RECORD_BYTES
    for w in range(writers):  # each writer's records in its own order
        assert [i for writer, i in seen if writer == w] == list(range(PER_WRITER))


def test_a_torn_tail_left_by_a_dead_writer_is_still_repaired(tmp_path: Path) -> None:
    target = JsonlFile(tmp_path / "t.jsonl")
    target.append({"a": 1})
    with target.path.open("ab") as handle:
        handle.write(b'{"b": 2, "pad": "xx')  # a writer killed mid-record
    target.append({"c": 3})
    assert target.records() == [{"a": 1}, {"c": 3}]


def test_an_append_racing_a_rewrite_lands_in_the_new_file(tmp_path: Path) -> None:
    """An appender that opened the file before `rewrite` swapped it reopens the new one."""
    target = JsonlFile(tmp_path / "t.jsonl")
    target.append({"old": 1})
    other = JsonlFile(target.path)
    target.rewrite([{"kept": 1}])
    other.append({"new": 2})
    assert target.records() == [{"kept": 1}, {"new": 2}]

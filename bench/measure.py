"""What every bench shares: arms timed in alternating order, the spread of their pair ratios, and
the provenance each result file records (commit, command line, machine, load at the start).

A figure here is always a set of pair ratios: after an untimed warm-up of every arm, repeat `i`
times each arm once, in the listed order on even repeats and reversed on odd ones, so a stretch
when the shared machine is busier slows both arms of a pair rather than one. The figure printed
is the median pair ratio with its min-max range and the count of pairs.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flowlearn.files import write_text_atomically

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MIN_REPEATS = 3


def provenance(script: str, argv: list[str] | None = None) -> dict[str, Any]:
    """The commit, command line, date and machine (cores, load average now) of this run.

    A run from a tree with changes beside the commit is marked `+uncommitted`, and the changed
    files are listed; the results and docs the benches themselves rewrite do not count.
    """
    argv = sys.argv[1:] if argv is None else argv

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        except OSError:
            return ""
        return done.stdout  # unstripped: a status line starts with its two status columns

    commit = git("rev-parse", "HEAD").strip()
    changed = [
        line[3:]
        for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
        if not line[3:].startswith("bench/results/") and not line.endswith(".md")
    ]
    import torch

    cuda = torch.cuda.is_available()
    return {
        "commit": (commit or "unknown") + ("+uncommitted" if changed else ""),
        "uncommitted_files": changed,
        "command": " ".join(["python", f"bench/{script}", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpu_cores": os.cpu_count(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name() if cuda else "cpu",
        },
    }


def check_repeats(repeats: int) -> int:
    """Return `repeats`, or exit with the fix when it is below `MIN_REPEATS`."""
    if repeats < MIN_REPEATS:
        sys.exit(
            f"--repeats {repeats}: a figure needs at least {MIN_REPEATS} timed repeats (the "
            "median and range of its pair ratios); pass --repeats 3 or more"
        )
    return repeats


def alternate(
    arms: Mapping[str, Callable[[], float]],
    repeats: int,
    warm_up: bool = True,
    on_repeat: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, list[float]]:
    """Time each arm `repeats` times, alternating the order; return each arm's values in run order.

    Each arm is a callable returning its measurement (seconds, or a rate). With `warm_up` every
    arm runs once first, untimed. Repeat `i` runs the arms in the listed order when `i` is even
    and in reverse when odd. `on_repeat(i, values)` is called after each repeat (to print or save).
    """
    names = list(arms)
    if warm_up:
        for name in names:
            arms[name]()
    values: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        order = names if repeat % 2 == 0 else names[::-1]
        this: dict[str, float] = {}
        for name in order:
            this[name] = float(arms[name]())
            values[name].append(this[name])
        if on_repeat is not None:
            on_repeat(repeat, this)
    return values


def spread(values: list[float]) -> dict[str, Any]:
    """The median, min, max and count of `values` (the median of an even count: the mean of the
    two middle ones, as `statistics.median`)."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": list(values),
    }


def ratios(numerator: list[float], denominator: list[float]) -> dict[str, Any]:
    """The pair ratios `numerator[i] / denominator[i]` and their spread."""
    return spread([a / b for a, b in zip(numerator, denominator, strict=True)])


def figure_line(key: str, summary: Mapping[str, Any], **extra: Any) -> str:
    """`key=<median> pairs=<n> range=<min>-<max>` and any `name=value` extras after it."""
    line = (
        f"{key}={summary['median']:.3f} pairs={summary['n']} "
        f"range={summary['min']:.3f}-{summary['max']:.3f}"
    )
    return " ".join([line, *(f"{name}={value}" for name, value in extra.items())])


class Report:
    """The figures and printed lines so far, rewritten to JSON and .txt at every `save`, so a
    timeout or kill keeps every figure that finished."""

    def __init__(self, out: Path) -> None:
        self.out, self.data, self.lines = out, {}, []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def save(self) -> None:
        write_result(self.out, self.data)
        write_text_atomically(self.out.with_suffix(".txt"), "\n".join(self.lines) + "\n")


def on_own_thread(work: Any) -> Any:
    """`work()` on a fresh thread that ends with it; its result, or its exception raised here.

    The flow decodes on its batcher's worker thread. A process whose main thread has run a
    parallel torch op on CPU keeps a second OpenMP thread pool alive (one per thread that ever
    led a parallel region); with more pooled threads than cores, libgomp throttles its
    spin-wait, and the flow's tiny-model forwards then ran 25% slower for the rest of the
    process (5,100 against 3,800 tokens/s, after one 512 x 512 matmul on the main thread). So
    TRL's arm runs its model work on a thread of its own too, which takes its pool with it when
    it ends: neither arm slows the other, and both decode as they would alone.
    """
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["value"] = work()
        except BaseException as exc:
            done["error"] = exc

    thread = threading.Thread(target=run, name="trl-arm")
    thread.start()
    thread.join()
    if "error" in done:
        raise done["error"]
    return done.get("value")


class Timer:
    """Seconds and calls summed over threads."""

    def __init__(self) -> None:
        self.seconds, self.calls, self._lock = 0.0, 0, threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds
            self.calls += 1


def middle(runs: list[Any], key: Any) -> Any:
    """The median repeat by `key` (the upper of the two middle ones for an even count)."""
    return sorted(runs, key=key)[len(runs) // 2]


def write_result(path: Path, data: Mapping[str, Any]) -> None:
    """Write `data` as JSON to `path` atomically: a half-written file never replaces a whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(data, indent=2, default=str) + "\n")


def headline(label: str, summary: Mapping[str, Any], unit: str, compared: str) -> dict[str, Any]:
    """One published figure: what it is, what was compared, its median, range and count.

    `unit` is how the docs print it: `x` (a ratio), `s`, `ms`, `GiB` or `per s`. A result file
    lists its figures under `headlines`; bench/publish.py renders the docs' tables from them.
    """
    return {
        "label": label,
        "compared": compared,
        "unit": unit,
        "median": summary["median"],
        "min": summary["min"],
        "max": summary["max"],
        "n": summary["n"],
    }

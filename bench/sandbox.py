"""Latency per `python` tool call: the bubblewrap sandbox vs the unisolated paths, side by side.

Run: `python bench/sandbox.py [--calls 40]` (`--repeats` is another name for `--calls`; at least
3). Three arms run the same snippet, after one untimed call of each, interleaved call by call,
their order reversed every other call, so that load on the machine falls on all of them alike:

1. `old`: the tool before the sandbox (a venv `python -I main.py` with rlimits, output to files);
2. `none`: today's tool with `isolation="none"` (the runner, pipes, no namespaces);
3. `bwrap`: today's default, the sandbox (namespaces, tmpfs, procfs, the tree watchdog).

Then the sandbox's own fixed cost, apart from what each interpreter loads at start: the same
`python -I -S -c pass`, bare and inside the sandbox (`setup` section).

Prints each arm's milliseconds per call (median, p90), and the median and min-max of the per-call
pair ratios of the sandbox to the other arms. Writes every call's milliseconds, the provenance
(commit, command, machine, load) and the `headlines` (the sandboxed call's median ms and its
min-max over the calls) to bench/results/sandbox.json (`--out`), and the printed text beside it
(sandbox.txt). The one-off probe of the sandbox is paid before timing starts. About 1 minute at
the defaults on 2 CPU cores (estimated from the kept per-call times).
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from measure import (
    MIN_REPEATS,
    RESULTS,
    alternate,
    figure_line,
    headline,
    provenance,
    ratios,
    spread,
    write_result,
)

from flowlearn.nodes.tools.python_sandbox import run_python
from flowlearn.nodes.tools.sandbox import bwrap_argv, find_bwrap, interpreter, probe
from flowlearn.nodes.tools.sandbox_run import scrubbed_env

SNIPPETS = {"arithmetic": "print(17 * 23)", "numpy": "import numpy\nprint(numpy.arange(4).sum())"}


def old_limits() -> None:  # as the old tool's preexec_fn did
    memory = 1024 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (11, 11))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 2**20, 64 * 2**20))


def old_path(code: str) -> str:
    """Run `code` the way the tool did before the sandbox."""
    with tempfile.TemporaryDirectory(prefix="flowlearn-py-") as workdir:
        folder = Path(workdir)
        (folder / "main.py").write_text(code, encoding="utf-8")
        with (folder / ".stdout").open("wb") as out, (folder / ".stderr").open("wb") as err:
            subprocess.run(
                [sys.executable, "-I", "main.py"],
                cwd=workdir,
                env=scrubbed_env(workdir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                preexec_fn=old_limits,
                timeout=10,
                check=False,
            )
        return (folder / ".stdout").read_text(encoding="utf-8").strip()


ARMS: dict[str, Callable[[str], str]] = {
    "old": old_path,
    "none": lambda code: run_python(code, isolation="none"),
    "bwrap": run_python,
}


def setup_arms() -> dict[str, Callable[[str], str]]:
    """The sandbox's fixed cost: one interpreter start with no site, bare and sandboxed."""
    bare = [interpreter(), "-I", "-S", "-c", "pass"]
    boxed = bwrap_argv(str(find_bwrap()), disk_bytes=2**20, info_fd=2, code_fd=None) + bare

    def start(argv: list[str]) -> Callable[[str], str]:
        return lambda _: str(subprocess.run(argv, capture_output=True, check=True).returncode)

    return {"bare": start(bare), "boxed": start(boxed)}


def measure(arms: dict[str, Callable[[str], str]], code: str, calls: int) -> dict[str, list[float]]:
    """Each arm's milliseconds per call: one untimed call of each first, then the arms
    interleaved call by call, their order reversed every other call."""

    def timed(arm: Callable[[str], str]) -> Callable[[], float]:
        def once() -> float:
            start = time.perf_counter()
            arm(code)
            return (time.perf_counter() - start) * 1e3

        return once

    return alternate({name: timed(arm) for name, arm in arms.items()}, calls)


def summary(name: str, ms: dict[str, list[float]], base: str, new: str) -> dict[str, Any]:
    """One snippet's calls: each arm's spread and p90, and `new`'s pair ratios to every other."""
    return {
        "calls": len(ms[base]),
        "ms": {arm: spread(values) for arm, values in ms.items()},
        "p90_ms": {arm: statistics.quantiles(values, n=10)[-1] for arm, values in ms.items()},
        "ratios": {f"{new}/{arm}": ratios(ms[new], ms[arm]) for arm in ms if arm != new},
        "added_ms": spread([n - b for n, b in zip(ms[new], ms[base], strict=True)]),
        "base": base,
        "new": new,
    }


def lines_of(name: str, got: dict[str, Any]) -> list[str]:
    """Format one snippet's medians and p90s, and the pair ratios."""
    lines = [f"{name} ({got['calls']} calls per arm, the arms taking turns):"]
    for arm, ms in got["ms"].items():
        lines.append(
            f"  {arm:>5}: median {ms['median']:7.1f} ms   p90 {got['p90_ms'][arm]:7.1f} ms"
        )
    for pair, ratio in got["ratios"].items():
        lines.append("  " + figure_line(pair, ratio))
    added = got["added_ms"]["median"]
    lines.append(f"  {got['new']} - {got['base']} = {added:+.1f} ms per call (median of pairs)")
    return lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls",
        "--repeats",
        dest="calls",
        type=int,
        default=40,
        help="timed calls per arm and snippet (40)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "sandbox.json", help="JSON path (.txt beside it)"
    )
    args = parser.parse_args(argv)
    if args.calls < MIN_REPEATS:
        parser.error(f"--calls {args.calls}: a figure needs at least {MIN_REPEATS} calls an arm")
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure every snippet in every arm; print and save the report."""
    args = parse(argv)
    why_not = probe(find_bwrap())
    if why_not is not None:
        print(f"no sandbox on this host: {why_not}", file=sys.stderr)
        return 1
    result: dict[str, Any] = provenance("sandbox.py", argv) | {"calls": args.calls}
    lines = [f"python tool latency, {platform.platform()}, {platform.python_version()}"]
    for name, code in SNIPPETS.items():
        result[name] = summary(name, measure(ARMS, code, args.calls), "old", "bwrap")
        lines += lines_of(name, result[name])
    result["setup"] = summary("setup", measure(setup_arms(), "", args.calls), "bare", "boxed")
    lines += lines_of("setup", result["setup"])
    result["headlines"] = [
        headline(
            "sandboxed python call",
            result["arithmetic"]["ms"]["bwrap"],
            "ms",
            f"one `python` tool call of {SNIPPETS['arithmetic']} in the bubblewrap sandbox, "
            "timed call by call beside the unsandboxed paths",
        )
    ]
    report = "\n".join(lines)
    print(report)
    write_result(args.out, result)
    args.out.with_suffix(".txt").write_text(report + "\n", encoding="utf-8")
    print(figure_line("bwrap_arithmetic_ms", result["arithmetic"]["ms"]["bwrap"]))
    print(f"wrote {args.out} and {args.out.with_suffix('.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

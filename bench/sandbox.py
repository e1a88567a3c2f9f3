"""Latency per `python` tool call: the bubblewrap sandbox vs the unisolated paths, side by side.

Run: `python bench/sandbox.py [--calls 40]`. Three arms run the same snippet, interleaved call by
call so that load on the machine falls on all of them alike:

1. `old`: the tool before the sandbox (a venv `python -I main.py` with rlimits, output to files);
2. `none`: today's tool with `isolation="none"` (the runner, pipes, no namespaces);
3. `bwrap`: today's default, the sandbox (namespaces, tmpfs, procfs, the tree watchdog).

Then the sandbox's own fixed cost, apart from what each interpreter loads at start: the same
`python -I -S -c pass`, bare and inside the sandbox (`setup` section).

Prints milliseconds per call (median, p90) for each and the ratios, and writes the same text to
bench/results/sandbox.txt. The one-off probe of the sandbox is paid before timing starts.
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

from flowlearn.nodes.tools.python_sandbox import run_python
from flowlearn.nodes.tools.sandbox import bwrap_argv, find_bwrap, interpreter, probe
from flowlearn.nodes.tools.sandbox_run import scrubbed_env

RESULTS = Path(__file__).parent / "results" / "sandbox.txt"
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
    """Return each arm's seconds per call, the arms interleaved call by call."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(calls):
        for name, arm in arms.items():
            start = time.perf_counter()
            arm(code)
            times[name].append(time.perf_counter() - start)
    return times


def summary(name: str, times: dict[str, list[float]], base: str, new: str) -> list[str]:
    """Format one snippet's medians and p90s, and `new` against `base`."""
    median = {arm: statistics.median(t) * 1e3 for arm, t in times.items()}
    p90 = {arm: statistics.quantiles(t, n=10)[-1] * 1e3 for arm, t in times.items()}
    lines = [f"{name} ({len(times[base])} calls per arm):"]
    for arm in times:
        lines.append(f"  {arm:>5}: median {median[arm]:7.1f} ms   p90 {p90[arm]:7.1f} ms")
    added = median[new] - median[base]
    ratios = ", ".join(
        f"{new}/{arm} = {median[new] / median[arm]:.2f}x" for arm in times if arm != new
    )
    lines.append(f"  {ratios}; {new} - {base} = {added:+.1f} ms per call")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure every snippet in every arm; print and save the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40, help="calls per arm and snippet (40)")
    args = parser.parse_args(argv)
    why_not = probe(find_bwrap())
    if why_not is not None:
        print(f"no sandbox on this host: {why_not}", file=sys.stderr)
        return 1
    for code in SNIPPETS.values():  # warm the page cache and the probe, untimed
        for arm in ARMS.values():
            arm(code)
    lines = [f"python tool latency, {platform.platform()}, {platform.python_version()}"]
    for name, code in SNIPPETS.items():
        lines += summary(name, measure(ARMS, code, args.calls), "old", "bwrap")
    lines += summary("setup", measure(setup_arms(), "", args.calls), "bare", "boxed")
    report = "\n".join(lines)
    print(report)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

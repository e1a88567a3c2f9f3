"""One concurrent, resumable runner: `flowlearn eval` and `flowlearn collect` both run on it."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections.abc import Callable, Container, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

from flowlearn.secrets import error_text

logger = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")

_frozen = 0  # scopes inside `heap_frozen` now
_froze = False  # whether the first scope in froze (nothing was frozen before), so the last thaws
_frozen_lock = threading.Lock()


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Keep the objects that exist now out of the cyclic garbage collector while inside.

    A loaded model, torch, transformers and LangChain make about half a million long-lived
    objects; a full (generation 2) collection walks every one, holding the GIL, and stalled
    all rollouts and the batching worker for 236 ms in a 1.2 s batch of 32 tiny-model rollouts
    (bench/rollout_speed.py --tiny, gc callbacks). `gc.freeze` moves them to the permanent
    generation, as vLLM and SGLang do after loading; objects made inside (each rollout's) are
    collected as usual. On leaving, the last of nested or concurrent scopes unfreezes, so
    nothing frozen here outlives its use: cyclic garbage among those objects waits until then
    (no collection first: that would be the very pass this avoids, once a training step). A
    process that froze objects itself (a pre-fork server) is left as it is: `gc` cannot
    unfreeze part of the permanent generation, and freezing again would pin each run's garbage.
    """
    global _frozen, _froze
    with _frozen_lock:
        if _frozen == 0:
            _froze = gc.get_freeze_count() == 0
            if _froze:
                gc.freeze()
        _frozen += 1
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen -= 1
            if _frozen == 0 and _froze:
                gc.unfreeze()


def run_resumable(
    items: Mapping[str, Item],
    run_one: Callable[[Item], Result],
    *,
    done: Container[str] = frozenset(),
    save: Callable[[Result], object] | None = None,
    concurrency: int = 4,
    progress: bool = True,
    label: str = "items",
    unit: str = "it",
) -> dict[str, Result]:
    """Run every item whose id is not in `done`, `concurrency` at a time, saving each result.

    Args:
        items: work items by id; the ids make the run resumable.
        run_one: does one item; runs on a worker thread.
        done: ids finished by an earlier run (e.g. read from the results file); not run again.
        save: called with each result as soon as it is known, on the worker thread, e.g. a
            durable append; a result counts as finished only once saved.
        concurrency: items in flight at once (threads).
        progress: show a tqdm progress bar, counting the finished items too.
        label: the progress bar's and the log messages' name for the items.
        unit: the progress bar's unit.

    Returns the fresh results by id, in completion order. An item whose `run_one` or `save`
    raises is logged and left out, so the next run retries it; it never stops the others.

    """
    from tqdm.auto import tqdm

    todo = [key for key in items if key not in done]

    def finish(key: str) -> Result:
        result = run_one(items[key])
        if save is not None:
            save(result)
        return result

    fresh: dict[str, Result] = {}
    failed: list[str] = []
    with (
        heap_frozen(),
        ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool,
        tqdm(
            total=len(items),
            initial=len(items) - len(todo),
            disable=not progress,
            desc=label,
            unit=unit,
        ) as bar,
    ):
        futures = {pool.submit(finish, key): key for key in todo}
        for future in as_completed(futures):
            key = futures[future]
            try:
                fresh[key] = future.result()
            except Exception as exc:  # a crashed item is retried by the next run
                failed.append(key)
                logger.warning("%s: %s failed: %s", label, key, error_text(exc))
                continue
            bar.update(1)
    if failed:
        logger.warning(
            "%s: %d failed and were not saved; run again to retry them: %s",
            label,
            len(failed),
            ", ".join(sorted(failed)[:10]),
        )
    return fresh

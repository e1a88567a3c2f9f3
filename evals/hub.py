"""The two gated benchmarks, GAIA and GPQA, read from the Hugging Face hub into Cases.

Neither ships with flowlearn (their licences ask for a login), and neither is stored with the
fields the flow reads, so each has an adapter:

- GAIA (`gaia-benchmark/GAIA`, config `2023_all`, split `validation`: the test split's answers
  are hidden): `Question` / `Final answer`. Tasks that come with an attached file (`file_name`)
  are left out, since the flow's tools cannot open them; the count is logged.
- GPQA (`Idavidrein/gpqa`, config `gpqa_diamond`, split `train`, 198 questions): `Question`,
  `Correct Answer` and three `Incorrect Answer N`. The four options are shuffled with a seed
  taken from the record (so the correct one is not always A, and every run shows the same
  order), listed in the query as `A. ...`, and the reference is the correct letter.
"""

from __future__ import annotations

import logging
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowlearn.evals.cases import Case, unique_ids, with_answer_instruction
from flowlearn.secrets import error_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubSet:
    """Where a gated benchmark lives on the hub, and how its records become cases."""

    config: str
    split: str
    adapt: Callable[[dict[str, Any], int], Case | None]
    """Record and index to a Case, or None to leave the record out."""


def gaia_case(record: dict[str, Any], index: int) -> Case | None:
    """Return a GAIA task as a Case, or None when it needs an attached file."""
    if record.get("file_name"):
        return None
    return Case(
        str(record.get("task_id", index)),
        with_answer_instruction(record["Question"]),
        str(record["Final answer"]),
        {"level": record.get("Level")},
    )


def gpqa_case(record: dict[str, Any], index: int) -> Case:
    """Return a GPQA question as a multiple-choice Case with seeded, shuffled options."""
    question = record["Question"].strip()
    correct = record["Correct Answer"].strip()
    answers = [correct] + [record[f"Incorrect Answer {n}"].strip() for n in (1, 2, 3)]
    key = str(record.get("Record ID") or question)
    random.Random(zlib.crc32(key.encode())).shuffle(answers)
    options = [f"{letter}. {text}" for letter, text in zip("ABCD", answers, strict=True)]
    query = f"{question}\n\nOptions:\n" + "\n".join(options)
    return Case(
        str(record.get("Record ID", index)),
        with_answer_instruction(query),
        "ABCD"[answers.index(correct)],
        {"options": options, "domain": record.get("High-level domain")},
    )


HUB_SETS = {
    "gaia-benchmark/GAIA": HubSet("2023_all", "validation", gaia_case),
    "Idavidrein/gpqa": HubSet("gpqa_diamond", "train", gpqa_case),
}


def load_hub_benchmark(hub_id: str, *, limit: int | None = None) -> list[Case]:
    """Load a gated benchmark from the hub through its adapter.

    Raises:
        FileNotFoundError: `datasets` missing, no access, or no network; says what to do.

    """
    hub = HUB_SETS[hub_id]
    try:
        import datasets
    except ImportError as exc:
        raise FileNotFoundError(
            f"{hub_id} loads from the Hugging Face hub, which needs `pip install datasets`"
        ) from exc
    try:
        records = datasets.load_dataset(hub_id, hub.config, split=hub.split)
    except Exception as exc:
        raise FileNotFoundError(
            f"could not load {hub_id} ({hub.config}, {hub.split}) from the Hugging Face hub "
            f"({error_text(exc)}); it is gated: accept its terms on the hub and "
            "`huggingface-cli login`, or save its records as NAME.jsonl (gaia.jsonl, gpqa.jsonl) "
            "in the folder named by $FLOWLEARN_BENCHMARKS"
        ) from exc
    return adapt_records(hub_id, records, limit=limit)


def adapt_records(hub_id: str, records: Any, *, limit: int | None = None) -> list[Case]:
    """Turn a gated benchmark's records (from the hub or a local copy) into Cases.

    Raises:
        ValueError: a record without the benchmark's fields, naming them.

    """
    hub = HUB_SETS[hub_id]
    cases = []
    for i, record in enumerate(records):
        try:
            cases.append(hub.adapt(dict(record), i))
        except KeyError as exc:
            raise ValueError(
                f"{hub_id} record {i} lacks the field {exc}; it has {sorted(record)}"
            ) from exc
    kept = [c for c in cases if c is not None]
    if len(kept) < len(cases):
        skipped = len(cases) - len(kept)
        log.warning("%s: %d records need attached files and were left out", hub_id, skipped)
    kept = unique_ids(kept)
    return kept[:limit] if limit is not None else kept

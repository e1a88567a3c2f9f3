"""Evaluation cases and their loaders: local JSON / JSONL / Parquet files and Hugging Face ids."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ANSWER_INSTRUCTION = (
    "When ready, output the final answer enclosed in <answer> and </answer> tags. "
    "Do not generate any content after the </answer> tag."
)


@dataclass(frozen=True)
class Case:
    """One question with its reference answer."""

    id: str
    query: str
    reference: Any
    """A string, a list of acceptable strings, a number, or (Game of 24) reference expressions."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Extra fields the scorer may need, e.g. `options` (multiple choice) or `numbers` (24)."""


def with_answer_instruction(query: str) -> str:
    """Return the query ending with the `<answer>` instruction, added once if missing."""
    if "<answer>" in query:
        return query
    return f"{query.rstrip()}\n{ANSWER_INSTRUCTION}"


def _literal(value: Any) -> Any:
    """Decode list-like strings ("['a', 'b']") that some benchmark files store."""
    if isinstance(value, str) and value[:1] == "[" and value[-1:] == "]":
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def row_to_case(row: dict[str, Any], index: int) -> Case:
    """Turn one record into a Case; `query`/`question` and `answer`/`reference` are accepted.

    Raises:
        ValueError: a record without a query or an answer, naming the record.

    """
    query = row.get("query") or row.get("question") or row.get("Question")
    reference = next((row[k] for k in ("answer", "reference", "Answer") if k in row), None)
    if not isinstance(query, str) or reference is None:
        raise ValueError(
            f"record {index} needs a text 'query' (or 'question') and an 'answer'; "
            f"it has keys {sorted(row)}"
        )
    case_id = str(row.get("pid", row.get("id", row.get("idx", index))))
    metadata = {
        k: _literal(v)
        for k, v in row.items()
        if k not in {"query", "answer", "reference", "pid", "id", "idx", "gen_text_store"}
    }
    return Case(case_id, with_answer_instruction(query), _literal(reference), metadata)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Read records from a .json (list), .jsonl or .parquet file."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not an error
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
        if not isinstance(data, list):
            raise ValueError(f"{path} must hold a JSON list of records")
        return data
    if suffix == ".jsonl":
        return _jsonl_records(path)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        records: list[dict[str, Any]] = pq.read_table(path).to_pylist()
        return records
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .json, .jsonl or .parquet")


def _jsonl_records(path: Path) -> list[dict[str, Any]]:
    records = []
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}:{number}: expected a JSON object, got {type(record).__name__}"
            )
        records.append(record)
    return records


def load_cases(source: str | Path, *, split: str = "test", limit: int | None = None) -> list[Case]:
    """Load cases from a local file or, when no such file exists, a Hugging Face dataset id.

    Raises:
        FileNotFoundError: neither a file nor a loadable dataset id, with what to do.

    """
    path = Path(source).expanduser()
    records = read_records(path) if path.is_file() else _hub_records(str(source), split)
    cases = unique_ids([row_to_case(row, i) for i, row in enumerate(records)])
    return cases[:limit] if limit is not None else cases


def unique_ids(cases: list[Case]) -> list[Case]:
    """Give repeated ids a `-<position>` suffix, deterministically, keeping the original id.

    Some published files reuse ids for different questions (MedQA's `pid` repeats); results
    files and rollout groups are keyed by id, so ids must be unique.
    """
    seen: set[str] = set()
    out = []
    for position, case in enumerate(cases):
        if case.id in seen:
            metadata = {**case.metadata, "source_id": case.id}
            case = Case(f"{case.id}-{position}", case.query, case.reference, metadata)
        seen.add(case.id)
        out.append(case)
    return out


def _hub_records(name: str, split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as exc:
        raise FileNotFoundError(
            f"{name!r} is not a file, and loading Hugging Face datasets needs "
            "`pip install datasets`"
        ) from exc
    try:
        return list(datasets.load_dataset(name, split=split))
    except Exception as exc:
        raise FileNotFoundError(
            f"{name!r} is not a file and could not be loaded as a Hugging Face dataset "
            f"({type(exc).__name__}: {exc}); gated sets (GAIA, GPQA) need access and a login, "
            "or point --data at a local copy"
        ) from exc

"""Evaluation cases and their loaders: local JSON / JSONL / Parquet files and Hugging Face ids."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowlearn.nodes.prompts import ANSWER_INSTRUCTION as ANSWER_INSTRUCTION
from flowlearn.nodes.schema.context import MAX_QUESTION_CHARS, question_too_long
from flowlearn.secrets import error_text


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


def row_to_case(row: dict[str, Any], index: int, where: str | None = None) -> Case:
    """Turn one record into a Case; `query`/`question` and `answer`/`reference` are accepted.

    Args:
        row: the record.
        index: its position in the source; the id of a record without one.
        where: where it was read (`file:line`), to name in messages.

    Raises:
        ValueError: a record without a query or an answer (or with a null one), or with a
            query longer than `MAX_QUESTION_CHARS`, naming the record.

    """
    # `where` (file:line) names the record; "record {index}" beside it counted from 0 and
    # read as another place ("line 2: record 1")
    named = f"{where}: the record" if where else f"record {index}"
    query = row.get("query") or row.get("question") or row.get("Question")
    answer_key = next((k for k in ("answer", "reference", "Answer") if k in row), None)
    reference = row[answer_key] if answer_key is not None else None
    if not isinstance(query, str) or reference is None:
        null = [
            k for k in ("query", "question", "Question", answer_key) if k in row and row[k] is None
        ]
        why = f"; its {', '.join(repr(k) for k in null)} is null" if null else ""
        raise ValueError(
            f"{named} needs a text 'query' (or 'question') and an 'answer'{why}; it has keys "
            f"{shown_keys(row)}"
        )
    if len(query) > MAX_QUESTION_CHARS:
        raise ValueError(f"{named}: {question_too_long(len(query), MAX_QUESTION_CHARS)}")
    case_id = str(row.get("pid", row.get("id", row.get("idx", index))))
    metadata = {
        k: _literal(v)
        for k, v in row.items()
        if k not in {"query", "answer", "reference", "pid", "id", "idx", "gen_text_store"}
    }
    return Case(case_id, with_answer_instruction(query), _literal(reference), metadata)


def shown_keys(row: dict[str, Any], most: int = 20) -> str:
    """Return a record's keys for a message: sorted, the first `most`, and how many more."""
    keys = sorted(map(str, row))
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return f"{keys[:most]}{more}"


Located = list[tuple[str, dict[str, Any]]]
"""Records, each with where it was read: `file:line` (JSON, JSONL) or `file row N` (Parquet)."""


def read_records(path: Path) -> list[dict[str, Any]]:
    """Read records from a .json (list), .jsonl or .parquet file."""
    return [record for _, record in read_located_records(path)]


def read_located_records(path: Path) -> Located:
    """Read records from a .json (list), .jsonl or .parquet file, each with its location.

    Raises:
        ValueError: invalid JSON or a record that is not an object, naming file and line; an
            unsupported file type.

    """
    suffix = path.suffix.lower()
    if suffix == ".json":
        return _json_records(path)
    if suffix == ".jsonl":
        return _jsonl_records(path)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
        return [(f"{path} row {number}", row) for number, row in enumerate(rows, 1)]
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .json, .jsonl or .parquet")


def _json_records(path: Path) -> Located:
    text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not an error
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
    if not isinstance(data, list):
        raise ValueError(f"{path} must hold a JSON list of records")
    located = list(zip((f"{path}:{n}" for n in _element_lines(text)), data, strict=True))
    for where, record in located:
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return located


def _element_lines(text: str) -> list[int]:
    """Return the line on which each element of a JSON list starts (`text` is known to parse)."""
    decoder = json.JSONDecoder()
    lines: list[int] = []
    line, seen = 1, 0
    index = _skip_space(text, text.index("[") + 1)
    while text[index] != "]":
        line += text.count("\n", seen, index)
        lines.append(line)
        seen = index
        _, index = decoder.raw_decode(text, index)
        index = _skip_space(text, index)
        if text[index] == ",":
            index = _skip_space(text, index + 1)
    return lines


def _skip_space(text: str, index: int) -> int:
    while text[index] in " \t\n\r":
        index += 1
    return index


def _jsonl_records(path: Path) -> Located:
    records = []
    # Lines end at "\n" only: str.splitlines would also split inside a JSON string at U+2028.
    lines = path.read_text(encoding="utf-8-sig").split("\n")
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
        records.append((f"{path}:{number}", record))
    return records


def load_cases(
    source: str | Path,
    *,
    split: str = "test",
    limit: int | None = None,
    suffix_duplicates: bool = False,
) -> list[Case]:
    """Load cases from a local file or, when no such file exists, a Hugging Face dataset id.

    Args:
        source: a .json/.jsonl/.parquet file, or a dataset id on the hub.
        split: the hub dataset's split.
        limit: keep only the first N cases.
        suffix_duplicates: give a repeated id a suffix (`unique_ids`) instead of refusing it;
            for published sets whose ids are not the user's to fix (the registered benchmarks).

    Raises:
        FileNotFoundError: neither a file nor a loadable dataset id, with what to do.
        ValueError: a bad record or, unless `suffix_duplicates`, a repeated id, with file:line.

    """
    path = Path(source).expanduser()
    if path.is_file():
        located = read_located_records(path)
    else:
        located = [
            (f"{source} record {i}", r) for i, r in enumerate(_hub_records(str(source), split))
        ]
    cases = [row_to_case(row, i, where) for i, (where, row) in enumerate(located)]
    if suffix_duplicates:
        cases = unique_ids(cases)
    else:
        refuse_duplicate_ids(cases, [where for where, _ in located])
    return cases[:limit] if limit is not None else cases


def refuse_duplicate_ids(cases: list[Case], where: list[str]) -> None:
    """Raise when two cases share an id, naming where both were read.

    Results files and rollout groups are keyed by case id: a repeated id would make resuming
    skip a case, or pool two questions into one group.

    Raises:
        ValueError: the first repeated id, with both locations and how many others repeat.

    """
    first: dict[str, str] = {}
    repeats: list[tuple[str, str, str]] = []
    for case, location in zip(cases, where, strict=True):
        if case.id in first:
            repeats.append((case.id, first[case.id], location))
        else:
            first[case.id] = location
    if repeats:
        case_id, earlier, later = repeats[0]
        more = f" ({len(repeats) - 1} more repeated ids)" if len(repeats) > 1 else ""
        raise ValueError(
            f"{later}: case id {case_id!r} is already used at {earlier}{more}; give every case "
            "its own id (results and rollout groups are keyed by it)"
        )


def unique_ids(cases: list[Case]) -> list[Case]:
    """Give repeated ids a `-<position>` suffix, deterministically, keeping the original id.

    Some published files reuse ids for different questions (MedQA's `pid` repeats); results
    files and rollout groups are keyed by id, so ids must be unique. Only the registered
    benchmarks are loaded this way; a user's own case file with a repeated id is refused.
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
            f"({error_text(exc)}); gated sets (GAIA, GPQA) need access and a login, "
            "or point --data at a local copy"
        ) from exc

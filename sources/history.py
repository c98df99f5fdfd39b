"""Exported histories of health events, for `faultline analyzer replay`: JSON lines (or one JSON array)
of event documents as `health_events` stores them, e.g. `mongoexport --collection health_events`
(MongoDB's extended JSON: `{"$date": ...}`) or `faultline`'s own JSON, with node labels from a file.

The events become `patterns.cluster.Record`s in the order they were observed (the feed's order is the
order they were stored, which a history no longer has). A line that is not an event is an InputError
naming the file and line.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from faultline.errors import InputError
from patterns.cluster import Record


def read_labels(path: Path) -> dict[str, dict[str, str]]:
    """{node: {label: value}} from a JSON object of that shape or a NodeList (`kubectl get nodes -o json`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read node labels: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        return {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {}) for n in data["items"]}
    if isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()):
        return {str(k): {str(a): str(b) for a, b in v.items()} for k, v in data.items()}
    raise InputError(f"{path}: node labels must be {{node: {{label: value}}}} or a NodeList")


def read_events(paths: Iterable[Path], labels: Mapping[str, Mapping[str, str]]) -> list[Record]:
    """Every event of the files, as records in the order they were observed."""
    docs: list[tuple[float, int, dict[str, Any], str]] = []
    for path in paths:
        for where, doc in _documents(path):
            docs.append((_when(doc.get("observed_at"), where), len(docs), doc, where))
    docs.sort(key=lambda d: (d[0], d[1]))
    out = []
    for i, (t, _, d, where) in enumerate(docs, start=1):
        try:
            entity = (d.get("entities") or [{}])[0]
            node = str(d["node"])
            out.append(Record(
                position=i << 16, kind="events", id=str(d.get("_id") or d.get("id") or f"event-{i}"), t=t,
                node=node, code=str(d["code"]), component=str(d.get("component", "")),
                entity_type=str(entity.get("type", "")), entity_id=str(entity.get("id", "")),
                healthy=bool(d.get("healthy")), fatal=bool(d.get("fatal")),
                metadata={str(k): str(v) for k, v in (d.get("metadata") or {}).items()},
                labels=labels.get(node, {}),
            ))  # fmt: skip
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise InputError(f"{where}: not a health event ({exc!r} missing or malformed)") from exc
    return out


def _documents(path: Path) -> Iterable[tuple[str, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from exc
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise InputError(f"{path}: not a JSON array: {exc}") from exc
        for i, doc in enumerate(items, start=1):
            yield _checked(f"{path}: item {i}", doc)
        return
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path}:{n}: not JSON: {exc}") from exc
        yield _checked(f"{path}:{n}", doc)


def _checked(where: str, doc: object) -> tuple[str, dict[str, Any]]:
    if not isinstance(doc, dict):
        raise InputError(f"{where}: not a health event (a JSON object)")
    return where, doc


def _when(value: object, where: str) -> float:
    """Epoch seconds of a stored date: ISO 8601, or extended JSON's {"$date": ISO | {"$numberLong": ms}}."""
    if isinstance(value, dict) and "$date" in value:
        value = value["$date"]
        if isinstance(value, dict) and "$numberLong" in value:
            return int(value["$numberLong"]) / 1000
        if isinstance(value, int | float):
            return value / 1000
    if isinstance(value, str):
        try:
            t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()
    raise InputError(f"{where}: observed_at is not a date: {value!r}")

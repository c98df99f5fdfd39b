"""The informer's pure parts: a watch stream cut into chunks anywhere gives the same events, the paths of
core and group kinds, namespaced or not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from faultline.errors import ApiError, TransientError
from faultline.kube import client as kube_client
from faultline.kube import watch


class Stream:
    """What urllib3 hands the watch: the body in chunks as they arrive."""

    def __init__(self, body: bytes, size: int) -> None:
        self.body, self.size = body, size

    def stream(self, amt: int | None = None, decode_content: bool = True) -> Iterator[bytes]:
        for i in range(0, len(self.body), self.size):
            yield self.body[i : i + self.size]


EVENTS = [
    {"type": "ADDED", "object": {"kind": "Node", "metadata": {"name": "a", "resourceVersion": "5"}}},
    {"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "9"}}},
    {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "message": "too old resource version: 1 (9)"},
    },
]


@pytest.mark.parametrize("size", [1, 7, 64, 10_000])
def test_events_are_whole_lines_however_the_stream_is_cut(size: int) -> None:
    body = b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS)
    assert list(watch._events(Stream(body, size))) == EVENTS
    assert list(watch._events(Stream(body.rstrip(b"\n"), size))) == EVENTS  # the last line unterminated


def test_a_410_event_means_list_again_and_a_bookmark_moves_the_version() -> None:
    delivered: list[watch.Change] = []
    informer = watch.Informer(None, watch.Target("v1", "Node"), delivered.append)
    assert informer._handle(EVENTS[0], "1") == "5"
    assert informer._handle(EVENTS[1], "5") == "9"
    assert [c.kind for c in delivered] == ["upsert"]
    with pytest.raises(watch.ExpiredError, match="too old resource version"):
        informer._handle(EVENTS[2], "9")


@pytest.mark.parametrize(
    ("target", "namespaced", "path"),
    [
        (watch.Target("v1", "Node"), False, "/api/v1/nodes"),
        (watch.Target("v1", "Pod"), True, "/api/v1/pods"),
        (watch.Target("v1", "Pod", namespace="ml"), True, "/api/v1/namespaces/ml/pods"),
        (watch.Target("apps/v1", "Deployment"), True, "/apis/apps/v1/deployments"),
        (watch.Target("lab.example.com/v1", "Gadget", namespace="lab"), True,
         "/apis/lab.example.com/v1/namespaces/lab/gadgets"),
    ],
)  # fmt: skip
def test_collection_paths(target: watch.Target, namespaced: bool, path: str) -> None:
    plural = target.resource or f"{target.kind.lower()}s"
    assert watch.collection_path(target, plural, namespaced) == path


@pytest.mark.parametrize(
    ("selector", "want"),
    [
        (None, (None, None)),
        ("", (None, "")),
        ("metadata.namespace=team-a", ("team-a", None)),
        ("metadata.namespace==team-a,status.phase=Running", ("team-a", "status.phase=Running")),
        (" metadata.namespace = team-a ,spec.nodeName=n1", ("team-a", "spec.nodeName=n1")),
        ("metadata.namespace!=team-a", (None, "metadata.namespace!=team-a")),
        ("metadata.namespace=a,metadata.namespace=b", (None, "metadata.namespace=a,metadata.namespace=b")),
        ("metadata.name=x", (None, "metadata.name=x")),
        ("metadata.namespace=", (None, "metadata.namespace=")),  # no namespace's objects: left to the server
    ],
)
def test_a_field_selector_pinning_one_namespace_names_it(selector: str | None, want: tuple[Any, Any]) -> None:
    assert kube_client.pinned_namespace(selector) == want


def _pages(
    monkeypatch: pytest.MonkeyPatch, serve: Any
) -> tuple[watch.Informer, list[watch.Change], list[str]]:
    """An informer of Nodes whose list calls `serve(token) -> page` answers (it raises ApiError as a server
    would); the continue tokens asked for, in order."""
    asked: list[str] = []

    def get_json(api: Any, path: str, query: list[tuple[str, str]], what: str) -> dict[str, Any]:
        token = dict(query).get("continue", "")
        asked.append(token)
        page: dict[str, Any] = serve(token)
        return page

    monkeypatch.setattr(watch, "_get_json", get_json)
    delivered: list[watch.Change] = []
    informer = watch.Informer(None, watch.Target("v1", "Node"), delivered.append, page=2)
    informer._path = "/api/v1/nodes"
    return informer, delivered, asked


def _page(names: list[str], token: str = "") -> dict[str, Any]:
    return {
        "items": [{"metadata": {"name": n}} for n in names],
        "metadata": {"continue": token, "resourceVersion": "7"},
    }


def test_an_informers_list_whose_token_expired_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    expired = [True]

    def serve(token: str) -> dict[str, Any]:
        if token == "t1" and expired:
            expired.pop()
            raise ApiError("list", "Node", "the continue token is too old", status=410, reason="Expired")
        return _page(["a", "b"], "t1") if not token else _page(["c"])

    informer, delivered, asked = _pages(monkeypatch, serve)
    assert informer._list() == "7"
    assert asked == ["", "t1", "", "t1"]
    (replace,) = delivered
    assert [o["metadata"]["name"] for o in replace.objects] == ["a", "b", "c"]


def test_an_informers_list_whose_token_keeps_expiring_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def serve(token: str) -> dict[str, Any]:
        if token:
            raise ApiError("list", "Node", "the continue token is too old", status=410, reason="Expired")
        return _page(["a", "b"], "t1")

    informer, delivered, asked = _pages(monkeypatch, serve)
    with pytest.raises(
        TransientError, match=r"list Node \(v1\): its continue token expired 4 times in a row"
    ):
        informer._list()
    assert len(asked) == 2 * (kube_client.LIST_RESTARTS + 1) and delivered == []


def test_an_informers_list_handed_a_token_twice_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    informer, delivered, asked = _pages(monkeypatch, lambda token: _page(["a", "b"], "t1"))
    with pytest.raises(TransientError, match="handed a continue token twice"):
        informer._list()
    assert asked == ["", "t1"] and delivered == []

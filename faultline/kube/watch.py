"""List and watch objects of any served kind, kept in step as client-go's informers keep theirs (the object
monitor's input).

An `Informer` finds its kind's plural and scope by API discovery, lists every object (in pages) and hands
the whole list over (`replace`: what is not in it is gone), then watches from the list's resourceVersion
with bookmarks, handing over each change (`upsert`, `delete`). A watch the server ends (its timeout, a
restart) resumes from the last resourceVersion seen; one whose resourceVersion is too old (410 Gone: the
watch cache or etcd has moved past it, as after a long disconnection or an API server restart) lists
again, so whatever changed meanwhile (objects deleted included) arrives as the next `replace`. A list
whose continue token expires again and again (more than `LIST_RESTARTS` times), or comes back the same, is
a failure like any other. Failures
are retried with back-off (1 s doubling to `retry_max`), forever: a kind that is not served yet (its CRD
comes later) or not allowed yet (RBAC being fixed) starts once it is. Nothing is polled per object.

`Informer.stats` counts lists, relists after 410 (`expired`), watch restarts and errors; `synced` is set
after the first complete list.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from faultline import bounds
from faultline.errors import ApiError, FaultlineError, PermanentError, TransientError
from faultline.kube import translate
from faultline.kube.client import LIST_RESTARTS, ApiClient, pinned_namespace, translated

log = logging.getLogger(__name__)
PAGE = 500  # objects per list page


@dataclass(frozen=True)
class Target:
    """What to watch: a kind of an API version, optionally its plural (`resource`, else found by
    discovery), one namespace and the selectors the API server filters by."""

    api_version: str
    kind: str
    resource: str | None = None
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        narrowed = ", ".join(s for s in (self.label_selector, self.field_selector) if s)
        return f"{self.kind} ({self.api_version}){where}" + (f" [{narrowed}]" if narrowed else "")


@dataclass(frozen=True)
class Change:
    """`replace`: every object (after a list); `upsert`/`delete`: one object."""

    kind: Literal["replace", "upsert", "delete"]
    objects: list[dict[str, Any]]


@dataclass
class Stats:
    lists: int = 0
    expired: int = 0  # lists again because the resourceVersion was gone (410)
    restarts: int = 0  # watches resumed from the last resourceVersion
    errors: int = 0
    last_error: str = ""
    events: int = 0
    paths: list[str] = field(default_factory=list)


class ExpiredError(FaultlineError):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def discover(api: ApiClient, target: Target) -> tuple[str, bool]:
    """(plural, namespaced) of the target's kind, from API discovery; PermanentError when the API
    server does not serve it, or serves it under another plural than the target names."""
    group_path = f"/apis/{target.api_version}" if "/" in target.api_version else f"/api/{target.api_version}"
    found = _get_json(api, group_path, [], f"discovery of {target.api_version}")
    matches = [r for r in found.get("resources", [])
               if r.get("kind") == target.kind and "/" not in str(r.get("name", ""))]  # fmt: skip
    if not matches:
        raise PermanentError(f"the API server serves no kind {target.kind} in {target.api_version}")
    plural, namespaced = str(matches[0]["name"]), bool(matches[0].get("namespaced"))
    if target.resource and target.resource != plural:
        raise PermanentError(f"{target.kind} in {target.api_version} is served as {plural!r}, not "
                             f"{target.resource!r}")  # fmt: skip
    if target.namespace and not namespaced:
        raise PermanentError(f"{target.kind} is cluster-scoped: it has no namespace {target.namespace!r}")
    return plural, namespaced


def collection_path(target: Target, plural: str, namespaced: bool) -> str:
    base = f"/apis/{target.api_version}" if "/" in target.api_version else f"/api/{target.api_version}"
    if namespaced and target.namespace:
        return f"{base}/namespaces/{target.namespace}/{plural}"
    return f"{base}/{plural}"


class Informer:
    """Lists and watches `target`, handing every `Change` to `deliver` (on this informer's thread).
    `beat`: called at every turn and every event read, bookmarks included (its liveness: a watch the
    server keeps open sends one at least every `timeout` + 30 s, when it ends the watch)."""

    def __init__(
        self, api: ApiClient, target: Target, deliver: Callable[[Change], None], *,
        timeout: float = 300.0, retry_max: float = 30.0, page: int = PAGE,
        beat: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        namespace, fields = pinned_namespace(target.field_selector)
        if target.namespace is None and namespace is not None:  # listed in pages: its namespace's path
            target = dataclasses.replace(target, namespace=namespace, field_selector=fields)
        self.api, self.target, self.deliver = api, target, deliver
        self.beat = beat or (lambda: None)
        self.timeout, self.retry_max, self.page = timeout, retry_max, page
        self.stats = Stats()
        self.synced = threading.Event()
        self.stop = threading.Event()
        self._path: str | None = None
        self._response: Any = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> Informer:
        self._thread = threading.Thread(target=self.run, name=f"watch-{self.target.kind}", daemon=True)
        self._thread.start()
        return self

    def halt(self, timeout: float = 5.0) -> None:
        self.stop.set()
        response = self._response
        if response is not None:
            # wakes the read blocked in the watch; urllib3 refuses once the watch gave the connection back
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                response.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        version: str | None = None
        delay = 1.0
        while not self.stop.is_set():
            self.beat()
            try:
                if self._path is None:
                    self._path = collection_path(self.target, *discover(self.api, self.target))
                    self.stats.paths.append(self._path)
                if version is None:
                    version = self._list()
                else:
                    self.stats.restarts += 1
                version = self._watch(version)
                delay = 1.0
            except ExpiredError:
                self.stats.expired += 1
                log.info("watch expired; listing again", extra={"watch": str(self.target)})
                version = None
            except (TransientError, PermanentError, ValueError) as exc:  # ValueError: a line cut short
                self._failed(exc, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, self.retry_max)
            except Exception as exc:  # the thread must outlive any one failure
                log.exception("watch failed unexpectedly", extra={"watch": str(self.target)})
                self._failed(exc, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, self.retry_max)

    def _failed(self, exc: Exception, delay: float) -> None:
        self.stats.errors += 1
        self.stats.last_error = bounds.clip(str(exc), bounds.STORED_TEXT)
        level = logging.INFO if isinstance(exc, TransientError) and self.stats.errors < 3 else logging.WARNING
        fields = {"watch": str(self.target), "delay": delay, "error": self.stats.last_error}
        log.log(level, "watch failed; trying again", extra=fields)

    # -- list and watch --------------------------------------------------------------------------------
    def _list(self) -> str:
        """Every object, page by page, handed over as one `replace`; the list's resourceVersion."""
        assert self._path is not None
        items: list[dict[str, Any]] = []
        token, restarts = "", 0
        tokens: set[str] = set()
        while True:
            query = [*self._selectors(), ("limit", str(self.page))] + ([("continue", token)] if token else [])
            try:
                page = _get_json(self.api, self._path, query, f"list {self.target}")
            except ApiError as exc:
                if exc.status == 410 and token:  # the continue token expired: start the list again
                    if restarts >= LIST_RESTARTS:  # as `read_items`: then back off, as after any failure
                        raise TransientError(
                            f"list {self.target}: its continue token expired {restarts + 1} times in a row"
                        ) from exc
                    items, token, tokens, restarts = [], "", set(), restarts + 1
                    continue
                raise
            kind, api_version = self.target.kind, self.target.api_version
            items += [{"kind": kind, "apiVersion": api_version, **item} for item in page.get("items") or []]
            meta = page.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                break
            if token in tokens:  # a server that hands the same page again would be read forever
                raise TransientError(f"list {self.target}: the API server handed a continue token twice")
            tokens.add(token)
        self.deliver(Change("replace", items))
        self.stats.lists += 1
        self.synced.set()
        return str(meta.get("resourceVersion", ""))

    def _watch(self, version: str) -> str:
        """Watch from `version` until the server ends the watch; the last resourceVersion seen."""
        assert self._path is not None
        seconds = int(self.timeout * random.uniform(0.5, 1.0)) or 1  # noqa: S311 - spreads reconnects
        query = [*self._selectors(), ("watch", "true"), ("resourceVersion", version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(seconds))]  # fmt: skip
        what = f"watch {self.target}"
        with translated("watch", str(self.target)):
            try:
                response = _request(self.api, self._path, query, what, timeout=(10.0, seconds + 30.0))
            except ApiError as exc:
                if exc.status == 410:  # said at once rather than as the stream's first event
                    raise ExpiredError(str(exc)) from exc
                raise
            self._response = response
            try:
                for event in _events(response):
                    self.beat()
                    version = self._handle(event, version)
                    if self.stop.is_set():
                        break
            finally:
                self._response = None
                response.release_conn()
        return version

    def _handle(self, event: dict[str, Any], version: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise ExpiredError(str(obj.get("message", "resource version too old")))
            raise translate.error(int(code or 500), "watch", str(self.target), body=json.dumps(obj))
        meta = obj.get("metadata") or {}
        version = str(meta.get("resourceVersion") or version)
        if kind in ("ADDED", "MODIFIED"):
            self.stats.events += 1
            self.deliver(Change("upsert", [obj]))
        elif kind == "DELETED":
            self.stats.events += 1
            self.deliver(Change("delete", [obj]))
        return version  # BOOKMARK: only its resourceVersion

    def _selectors(self) -> list[tuple[str, str]]:
        out = []
        if self.target.label_selector:
            out.append(("labelSelector", self.target.label_selector))
        if self.target.field_selector:
            out.append(("fieldSelector", self.target.field_selector))
        return out


def _request(api: ApiClient, path: str, query: list[tuple[str, str]], what: str, *,
             timeout: tuple[float, float]) -> Any:  # fmt: skip
    """A GET whose answer is streamed (the urllib3 response); a failed status raised as translated."""
    headers = {"Accept": "application/json"}
    request = api.param_serialize("GET", path, query_params=query, header_params=headers,
                                  auth_settings=["BearerToken"])  # fmt: skip
    answer = api.call_api(*request, _request_timeout=timeout)
    response = answer.response
    if not 200 <= answer.status <= 299:
        body = response.data
        response.release_conn()
        raise translate.error(answer.status, "get", what, body=body, headers=dict(response.headers))
    return response


def _get_json(api: ApiClient, path: str, query: list[tuple[str, str]], what: str) -> dict[str, Any]:
    with translated("get", what):
        response = _request(api, path, query, what, timeout=(10.0, 60.0))
        try:
            result: dict[str, Any] = json.loads(response.data)
        finally:
            response.release_conn()
    return result


def _events(response: Any) -> Iterator[dict[str, Any]]:
    """The watch's events, one JSON object per line, as they arrive."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)

"""The one table from a Kubernetes API answer to faultline's error tree, for both transports."""

from __future__ import annotations

import email.utils
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from faultline import kube
from faultline.errors import (
    AlreadyExistsError,
    ApiError,
    ApiRejectedError,
    ApiUnavailableError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    PermanentError,
    ThrottledError,
    TransientError,
)
from faultline.kube import translate
from tests.fakes.blackhole import BlackHole


def status(message: str, reason: str = "", **details: object) -> bytes:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason}
    return json.dumps({**body, "details": details} if details else body).encode()


@pytest.mark.parametrize(
    ("code", "kind", "permanent"),
    [
        (400, InvalidError, True),
        (401, ForbiddenError, True),
        (403, ForbiddenError, True),
        (404, NotFoundError, True),
        (405, ApiRejectedError, True),
        (409, ConflictError, True),
        (410, ApiRejectedError, True),
        (422, InvalidError, True),
        (408, ApiUnavailableError, False),
        (429, ThrottledError, False),
        (500, ApiUnavailableError, False),
        (503, ApiUnavailableError, False),
        (504, ApiUnavailableError, False),
        (None, ApiUnavailableError, False),
    ],
)
def test_status_to_class(code: int | None, kind: type[ApiError], permanent: bool) -> None:
    err = translate.error(code, "get", "Node gpu-7", body=status('nodes "gpu-7" is bad'))
    assert type(err) is kind
    assert isinstance(err, ApiError) and err.status == code
    assert isinstance(err, PermanentError) is permanent
    assert isinstance(err, TransientError) is not permanent


def test_the_message_names_the_verb_the_object_and_the_servers_words() -> None:
    err = translate.error(404, "get", "Node gpu-7", body=status('nodes "gpu-7" not found', "NotFound"))
    assert str(err) == 'get Node gpu-7: HTTP 404 NotFound: nodes "gpu-7" not found'
    assert (err.verb, err.what, err.reason) == ("get", "Node gpu-7", "NotFound")
    gone = translate.error(None, "patch", "Node gpu-7", body="connection refused")
    assert str(gone) == "patch Node gpu-7: no answer: connection refused"
    plain = translate.error(502, "list", "pods", body=b"<html>bad gateway</html>")
    assert "bad gateway" in str(plain)  # a body that is not a Status object is quoted as it is


def test_already_exists_is_a_conflict_of_its_own() -> None:
    exists = translate.error(
        409, "create", "Job j", body=status('jobs.batch "j" already exists', "AlreadyExists")
    )
    stale = translate.error(409, "patch", "Node n", body=status("the object has been modified", "Conflict"))
    assert type(exists) is AlreadyExistsError and isinstance(exists, ConflictError)
    assert type(stale) is ConflictError


def test_throttled_carries_its_retry_after() -> None:
    err = translate.error(
        429, "evict", "Pod a/b", body=status("Cannot evict pod"), headers={"Retry-After": "7"}
    )
    assert isinstance(err, ThrottledError) and err.delay == 7.0
    lower = translate.error(429, "evict", "Pod a/b", headers={"retry-after": "3"})
    assert lower.delay == 3.0
    from_body = translate.error(
        429, "evict", "Pod a/b", body=status("too many", "TooManyRequests", retryAfterSeconds=5)
    )
    assert from_body.delay == 5.0
    none = translate.error(429, "evict", "Pod a/b")
    assert none.delay == translate.DEFAULT_DELAY_S
    busy = translate.error(503, "get", "Node n", headers={"Retry-After": "2"})
    assert type(busy) is ApiUnavailableError and busy.delay == 2.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("7", 7.0), (" 0 ", 0.0), ("1.5", 1.5), ("-3", 0.0), ("100000", translate.MAX_DELAY_S), ("", None),
     (None, None), ("soon", None)],
)  # fmt: skip
def test_retry_after_header(header: str | None, seconds: float | None) -> None:
    assert translate.retry_after(header) == seconds


def test_retry_after_as_an_http_date() -> None:
    now = 1_800_000_000.0
    assert translate.retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == 30.0
    assert translate.retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0


def test_the_full_transport_translates_no_answer(unreachable_kubeconfig: Path) -> None:
    """The generated client's own exceptions never leave faultline.kube: an API server that is not
    there is ApiUnavailableError naming the call."""
    api = kube.api_client(unreachable_kubeconfig)
    api.configuration.retries = 0
    try:
        with pytest.raises(ApiUnavailableError, match=r"^get Node n: no answer: "):
            kube.nodes.read(api, "n")
    finally:
        api.close()


def test_a_call_to_an_api_server_that_went_silent_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that takes the request and never answers (a dead peer behind a live connection): the
    call fails as ApiUnavailableError after the read timeout instead of holding its thread for good."""
    hole = BlackHole()
    monkeypatch.setattr(kube.client, "REQUEST_TIMEOUT", (1.0, 0.5))  # per try: a GET is tried four times
    api = kube.api_client(hole.kubeconfig(tmp_path))
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            kube.nodes.read(api, "n")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what the call raised, looked at below
            outcome.append(exc)

    caller = threading.Thread(target=read, daemon=True)
    caller.start()
    caller.join(10)  # without a timeout the call never returns
    try:
        assert not caller.is_alive(), "the call to a silent API server is still waiting"
        assert hole.held, "the call never reached the server"
        (raised,) = outcome
        assert isinstance(raised, ApiUnavailableError) and "get Node n" in str(raised), raised
    finally:
        api.close()
        hole.close()


def test_the_agents_transport_loads_no_kubernetes_client(tmp_path: Path) -> None:
    """The agent's footprint: its Kubernetes sink and transport never import the `kubernetes` package, nor
    a YAML parser until a kubeconfig is read (in its pod the agent has the service account's files)."""
    code = (
        "import sys, sinks.kube, faultline.kube.lite as lite\n"
        "print(sorted(m for m in ('kubernetes', 'yaml') if m in sys.modules))\n"
        "lite.from_kubeconfig(lite.Path(sys.argv[1]))\n"
        "print('yaml' in sys.modules)"
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code, str(kubeconfig)], capture_output=True, text=True, timeout=60, check=False
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split("\n")[:2] == ["[]", "True"]

"""The exporter on FerretDB against a local HTTP receiver that is down, then up, and refuses one event: every
fault change and repair step arrives once, in order, signed; a filtered chat sink gets only what it asked
for, with its bearer token; a restarted exporter resends nothing; a refused event is not retried."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from devtools import procs
from faultline import store
from faultline.config.export import SinkFilter, SinkSpec
from faultline.models import Action, FaultState, RepairOutcome, RepairStep
from tests.integration.test_quarantine import fault
from workers import export

pytestmark = pytest.mark.integration
FAST = {"timeout": dt.timedelta(seconds=2), "backoff_max": dt.timedelta(seconds=0.4)}


class Receiver:
    """What arrived at each path (body, headers), answering 503 while `down` and 400 for refused ids."""

    def __init__(self) -> None:
        self.got: dict[str, list[tuple[dict[str, Any], dict[str, str]]]] = {}
        self.down = True
        self.refuse: set[str] = set()
        self.attempts = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                doc = json.loads(raw)
                with receiver.lock:
                    receiver.attempts += 1
                    if receiver.down and self.path == "/events":
                        code = 503
                    elif doc.get("id") in receiver.refuse:
                        code = 400
                    else:
                        receiver.got.setdefault(self.path, []).append(
                            (doc, {**dict(self.headers), "raw": raw.hex()})
                        )
                        code = 202
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ids(self, path: str) -> list[str]:
        with self.lock:
            return [d["id"] for d, _ in self.got.get(path, []) if "id" in d]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_events_arrive_once_in_order_through_an_outage(
    receiver: Receiver, mongo_db: Any, tmp_path: Path
) -> None:
    (tmp_path / "hmac").write_text("s3cret\n")
    (tmp_path / "token").write_text("tok-123\n")
    sinks = [
        SinkSpec(name="events", url=f"{receiver.url}/events", hmac_secret_file=tmp_path / "hmac", **FAST),
        SinkSpec(name="chat", url=f"{receiver.url}/chat", format="webhook", bearer_token_file=tmp_path / "token",
                 filter=SinkFilter(actions=["CONTACT_SUPPORT"]), **FAST),
    ]  # fmt: skip
    st = store.Store(mongo_db)
    st.ensure_indexes()
    exporter = export.Exporter(st, sinks, cluster="lab", poll=0.2)
    exporter.start()
    try:
        procs.wait_for("both sinks placed", lambda: all(st.export_position(s.name)[0] for s in sinks), 10)
        xid = fault("node-1", "XID-79")
        support = fault("node-2", "XID-64").model_copy(update={"action": Action.CONTACT_SUPPORT})
        refused = fault("node-3", "XID-48")
        receiver.refuse.add(f"{refused.id}@1")
        st.write_fault(xid, 1)
        st.write_fault(refused, 1)
        st.write_fault(support, 1)
        repair = st.open_repair("node-1", dt.datetime.now(dt.UTC))
        now = st.now()
        st.add_round(repair, store.RepairRound(step=RepairStep.REBOOT, request="node-1-1", requested_at=now,
                                               started_at=now, outcome=RepairOutcome.SUCCEEDED, at=now))  # fmt: skip
        st.move_repair(
            repair, store.Stage.REMEDIATION, store.State.PENDING, store.State.DONE
        )  # its stage moved
        procs.wait_for("retries while the receiver is down",
                       lambda: exporter.metrics.failures.labels(sink="events")._value.get() >= 3, 10)  # fmt: skip
        assert receiver.ids("/events") == []
        assert len(receiver.got.get("/chat", [])) == 1  # the chat sink is not held back by the other
        receiver.down = False
        expected = [f"{xid.id}@1", f"{support.id}@1", f"{repair}#1#requested", f"{repair}#1#started",
                    f"{repair}#1#finished"]  # fmt: skip
        procs.wait_for("every event", lambda: sorted(receiver.ids("/events")) == sorted(expected), 15)
        st.write_fault(xid.model_copy(update={"state": FaultState.RESOLVED, "resolved_at": st.now()}), 2)
        procs.wait_for("the resolution", lambda: f"{xid.id}@2" in receiver.ids("/events"), 10)
        st.resolve_faults([support.id], "janitor: the node was replaced", node="node-2")  # not the agent's
        procs.wait_for("the janitor's resolution", lambda: f"{support.id}@2" in receiver.ids("/events"), 10)
        procs.wait_for("and in the chat", lambda: len(receiver.got.get("/chat", [])) == 2, 10)
    finally:
        exporter.halt()

    got = receiver.ids("/events")
    assert len(got) == len(set(got)) == 7, got  # once each
    assert f"{refused.id}@1" not in got and exporter.metrics.rejected.labels(sink="events")._value.get() == 1
    events = [doc for doc, _ in receiver.got["/events"]]
    times = [e["time"] for e in events]
    assert times == sorted(times), "in order of time"
    first = next(e for e in events if e["id"] == f"{xid.id}@1")
    assert (first["specversion"], first["type"], first["source"], first["subject"]) == (
        "1.0", "io.faultline.fault.opened", "faultline/lab", "node-1"
    )  # fmt: skip
    assert (first["data"]["code"], first["data"]["fatal"], first["data"]["action"]) == (
        "XID-79",
        True,
        "RESTART_BM",
    )
    assert next(e for e in events if e["id"] == f"{xid.id}@2")["type"] == "io.faultline.fault.resolved"
    finished = next(e for e in events if e["id"] == f"{repair}#1#finished")
    assert finished["type"] == "io.faultline.repair.finished" and finished["data"]["outcome"] == "Succeeded"
    for doc, head in receiver.got["/events"]:
        raw = bytes.fromhex(head["raw"])
        assert head["Content-Type"] == "application/cloudevents+json" and json.loads(raw) == doc
        want = "sha256=" + hmac.new(b"s3cret", raw, hashlib.sha256).hexdigest()
        assert head["X-Faultline-Signature"] == want
    (chat, chat_head), (resolved, _) = receiver.got["/chat"]
    assert chat_head["Authorization"] == "Bearer tok-123" and "X-Faultline-Signature" not in chat_head
    assert chat["text"].startswith("[faultline lab] XID-64 opened on node-2")
    assert resolved["text"].startswith("[faultline lab] XID-64 resolved on node-2")

    attempts = receiver.attempts  # a new exporter on the same store: nothing is sent again
    again = export.Exporter(st, sinks, cluster="lab", poll=0.2)
    for sink in sinks:
        assert again.pass_once(sink) == 0
    assert receiver.attempts == attempts


def test_filters() -> None:
    base = export.Change("f@1", "fault", "io.faultline.fault.opened", dt.datetime.now(dt.UTC), "n", {}, True,
                         "RESTART_BM", "XID-79")  # fmt: skip
    repair = export.Change("r#1#started", "repair", "io.faultline.repair.started", base.time, "n", {},
                           action="CONTACT_SUPPORT")  # fmt: skip

    def sink(**f: Any) -> SinkSpec:
        return SinkSpec(name="s", url="http://x", filter=SinkFilter(**f))

    assert export.accepts(sink(), base) and export.accepts(sink(), repair)
    assert export.accepts(sink(fatal=True), base) and not export.accepts(sink(fatal=True), repair)
    assert not export.accepts(sink(fatal=False), base)
    assert export.accepts(sink(kinds=["repair"]), repair) and not export.accepts(sink(kinds=["repair"]), base)
    assert export.accepts(sink(actions=["CONTACT_SUPPORT"]), repair)
    assert not export.accepts(sink(actions=["CONTACT_SUPPORT"]), base)
    assert export.accepts(sink(codes=["XID-79"]), base) and not export.accepts(sink(codes=["XID-48"]), base)

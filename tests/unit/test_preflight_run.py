"""The preflight run (`workers.preflight.run`) with an in-memory gang: a member that fails meanwhile ends
the others' checks at once with its reason; a passed member waits for its gang, proceeds when all passed,
fails (or proceeds) at the gang timeout; a failure marks the gang before it reports; only the node's
faults are reported; a hung check is the node's fault; an unreachable gang record leaves the member to
check alone. Real processes against the real API server: tests/integration/test_preflight_gang.py."""

from __future__ import annotations

import threading
from typing import Literal

import pytest

from faultline.errors import ApiUnavailableError, ForbiddenError
from faultline.models import Action
from faultline.preflight import FINDINGS_MARK, Finding, read_findings, termination
from workers import gang as gangs
from workers import preflight
from workers.preflight import Settings

FAST = Settings(check_timeout=5.0, gang_timeout=0.5, gang_poll=0.01)
BAD = Finding("remap", "PREFLIGHT-REMAP-PENDING", "a row remapping waits", "0000:3a:00")
MODEL = Finding("count", "PREFLIGHT-GPU-MODEL", "model X", "0000:18:00", Action.NONE, node_fault=False)


class MemoryGang:
    """The record of one round, in memory, with every write logged."""

    def __init__(
        self, size: int | None, *, others: dict[str, str] | None = None, join_error: Exception | None = None
    ) -> None:
        self.gang = gangs.Gang("faultline.io/gang=g", size)
        self.states: dict[str, tuple[str, str]] = {k: (v, "r") for k, v in (others or {}).items()}
        self.writes: list[tuple[str, str]] = []
        self.join_error = join_error

    def join(self) -> int:
        if self.join_error is not None:
            raise self.join_error
        self.write("checking")
        return 1

    def write(self, state: Literal["checking", "passed", "failed"], reason: str = "") -> None:
        self.states["me"] = (state, reason)
        self.writes.append((state, reason))

    def verdict(self) -> gangs.Verdict:
        members = {
            gangs.member_key(pod): gangs.Member(pod, f"node-{pod}", state, 1, float(i), reason)  # type: ignore[arg-type]
            for i, (pod, (state, reason)) in enumerate(self.states.items())
        }
        return gangs.decide(gangs.Record(1, members, "1"), self.gang, round_=1)


def test_alone_it_passes_or_fails_on_its_checks() -> None:
    assert preflight.run(lambda: [], settings=FAST) == preflight.Outcome(0, "")
    reported: list[list[Finding]] = []
    outcome = preflight.run(
        lambda: [BAD, MODEL], settings=FAST, report=lambda f: reported.append(f) or len(f)
    )
    assert outcome.code == 1
    assert (
        outcome.reason.splitlines()[0]
        == "preflight remap failed: PREFLIGHT-REMAP-PENDING on GPU 0000:3a:00: "
        "a row remapping waits"
    )
    assert reported == [[BAD]]  # the model is the pod's business: not reported
    assert outcome.reported == 1
    only_model = preflight.run(lambda: [MODEL], settings=FAST, report=lambda f: reported.append(f) or 0)
    assert only_model.code == 1 and reported == [[BAD]]


def test_a_failed_member_stops_the_checks_at_once() -> None:
    g = MemoryGang(4, others={"a": "passed", "x": "checking"})
    release = threading.Event()

    def slow_checks() -> list[Finding]:
        g.states["x"] = ("failed", "PREFLIGHT-ECC-DBE on GPU 0000:18:00")  # another member fails meanwhile
        return [] if release.wait(30) else [BAD]  # a run that waited for it would fail on BAD instead

    outcome = preflight.run(slow_checks, settings=Settings(check_timeout=60, gang_poll=0.01), gang=g)
    release.set()
    assert outcome == preflight.Outcome(
        1,
        "gang faultline.io/gang=g: member x on node node-x failed preflight: PREFLIGHT-ECC-DBE on GPU 0000:18:00",
    )
    assert g.writes == [("checking", "")]  # its own checks never finished: nothing more written


def test_a_passed_member_waits_for_its_gang() -> None:
    g = MemoryGang(3, others={"a": "passed", "b": "checking"})
    timer = threading.Timer(0.2, lambda: g.states.__setitem__("b", ("passed", "")))
    timer.start()
    outcome = preflight.run(lambda: [], settings=Settings(gang_timeout=30, gang_poll=0.01), gang=g)
    timer.join()
    assert outcome == preflight.Outcome(0, "")
    assert g.writes == [("checking", ""), ("passed", "")]


def test_then_fails_fast_when_another_fails() -> None:
    g = MemoryGang(3, others={"a": "passed", "b": "checking"})
    timer = threading.Timer(0.2, lambda: g.states.__setitem__("b", ("failed", "PREFLIGHT-XID-79")))
    timer.start()
    outcome = preflight.run(lambda: [], settings=Settings(gang_timeout=30, gang_poll=0.01), gang=g)
    timer.join()
    assert outcome.code == 1 and outcome.reason.endswith(
        "member b on node node-b failed preflight: PREFLIGHT-XID-79"
    )


@pytest.mark.parametrize(("action", "code"), [("fail", 1), ("proceed", 0)])
def test_the_gang_timeout(action: Literal["fail", "proceed"], code: int) -> None:
    g = MemoryGang(4, others={"a": "passed"})
    outcome = preflight.run(
        lambda: [], settings=Settings(gang_timeout=0.2, gang_poll=0.01, gang_timeout_action=action), gang=g
    )
    assert outcome.code == code
    if code:
        assert (
            outcome.reason
            == "gang faultline.io/gang=g: 2 of 4 members passed within 0.2 s: the gang did not assemble"
        )


def test_a_failure_marks_the_gang_before_it_reports() -> None:
    g = MemoryGang(4)
    order: list[str] = []

    def report(findings: list[Finding]) -> int:
        order.append(f"report while gang says {g.states['me'][0]}")
        raise RuntimeError("the node agent's ingest at /run/faultline/ingest.sock did not keep the events")

    outcome = preflight.run(lambda: [BAD], settings=FAST, gang=g, report=report)
    assert order == ["report while gang says failed"]
    assert g.writes[-1][0] == "failed" and "PREFLIGHT-REMAP-PENDING" in g.writes[-1][1]
    people, findings = outcome.reason.rsplit("\n", 1)
    assert outcome.code == 1 and people.endswith(
        "(not reported to the node agent: the node agent's ingest at /run/faultline/ingest.sock did not keep the "
        "events)"
    )
    # the findings line is there still, for the object monitor
    assert [f.code for f in read_findings(findings)] == ["PREFLIGHT-REMAP-PENDING"]


def test_a_hung_check_is_the_nodes_fault() -> None:
    release = threading.Event()
    reported: list[list[Finding]] = []
    outcome = preflight.run(
        lambda: [] if release.wait(30) else [BAD],  # hangs until released (after the run)
        settings=Settings(check_timeout=0.2),
        report=lambda f: reported.append(f) or 1,
    )
    release.set()
    assert outcome.code == 1 and outcome.reason.startswith(
        "preflight timeout failed: PREFLIGHT-HUNG: the checks did not finish within 0.2 s"
    )
    assert [(f.code, f.action) for f in reported[0]] == [("PREFLIGHT-HUNG", Action.RESTART_BM)]


@pytest.mark.parametrize(
    "error",
    [
        ForbiddenError("get", "Lease t/x", "leases is forbidden", status=403),
        ApiUnavailableError("get", "Lease t/x", "connection refused"),
    ],
)
def test_an_unreachable_gang_record_leaves_it_alone(error: Exception) -> None:
    g = MemoryGang(4, join_error=error)
    assert preflight.run(lambda: [], settings=FAST, gang=g) == preflight.Outcome(0, "")
    assert preflight.run(lambda: [BAD], settings=FAST, gang=g).code == 1
    assert g.writes == []


def _broken_checker() -> list[Finding]:
    raise RuntimeError("NVML Shared Library Not Found\n  (libnvidia-ml.so.1)")


def test_a_checker_error_is_a_warning_and_the_pod_proceeds(caplog: pytest.LogCaptureFixture) -> None:
    reported: list[list[Finding]] = []
    outcome = preflight.run(_broken_checker, settings=FAST, report=lambda f: reported.append(f) or 1)
    assert outcome == preflight.Outcome(
        0,
        "",
        warning="preflight warning: the checks could not run (RuntimeError: NVML Shared Library Not Found "
        "(libnvidia-ml.so.1)); the pod proceeds unchecked (fail_on_error: false)",
    )
    assert reported == []  # not a finding: nothing reaches the node agent
    (record,) = [r for r in caplog.records if getattr(r, "outcome", None) == "check-error"]
    assert record.levelname == "WARNING" and record.exc_info is None  # one line, no traceback
    assert "\n" not in outcome.warning


def test_a_checker_error_in_a_gang_counts_as_passed() -> None:
    g = MemoryGang(2, others={"a": "passed"})
    outcome = preflight.run(_broken_checker, settings=FAST, gang=g)
    assert outcome.code == 0 and outcome.warning.startswith("preflight warning: the checks could not run")
    assert g.writes == [("checking", ""), ("passed", "")]


def test_with_fail_on_error_a_checker_error_fails_the_pod(caplog: pytest.LogCaptureFixture) -> None:
    g = MemoryGang(2, others={"a": "passed"})
    reported: list[list[Finding]] = []
    settings = Settings(check_timeout=5.0, gang_poll=0.01, fail_on_error=True)
    outcome = preflight.run(
        _broken_checker, settings=settings, gang=g, report=lambda f: reported.append(f) or 1
    )
    text = (
        "preflight error: the checks could not run (RuntimeError: NVML Shared Library Not Found "
        "(libnvidia-ml.so.1)); failing the pod (fail_on_error)"
    )
    assert outcome == preflight.Outcome(1, text)
    assert g.writes[-1] == ("failed", text)  # the rest of the gang stops waiting
    assert reported == []  # the checker's fault, not the node's
    (record,) = [r for r in caplog.records if getattr(r, "outcome", None) == "check-error"]
    assert record.levelname == "ERROR" and record.exc_info is None


def test_findings_still_fail_the_pod_without_fail_on_error() -> None:
    outcome = preflight.run(lambda: [BAD], settings=FAST, report=len)
    assert outcome.code == 1 and outcome.warning == "" and outcome.reported == 1


def test_the_termination_message_carries_the_nodes_findings_for_the_object_monitor() -> None:
    """People read the reason; the last line gives the object monitor the node's findings (not the pod's own,
    such as a GPU model other than the one asked for), bounded, and read back only when well formed."""
    model = Finding("count", "PREFLIGHT-GPU-MODEL", "not an H100", "", Action.NONE, node_fault=False)
    hung = Finding("timeout", "PREFLIGHT-HUNG", "a driver call", "", Action.RESTART_BM)
    text = termination([BAD, model, hung])
    assert text.startswith("preflight ") and len(text.encode()) <= 4096
    assert [(f.code, f.gpu, f.action) for f in read_findings(text)] == [
        ("PREFLIGHT-REMAP-PENDING", BAD.gpu, Action.COMPONENT_RESET),
        ("PREFLIGHT-HUNG", "", Action.RESTART_BM),
    ]
    many = [
        Finding("ecc", f"PREFLIGHT-ECC-{i}", "x" * 300, f"0000:{i:02x}:00", Action.COMPONENT_RESET)
        for i in range(200)
    ]
    assert len(termination(many).encode()) <= 4096 and 20 < len(read_findings(termination(many))) < 64
    assert read_findings("preflight passed") == []
    for bad, says in [
        ('[{"code":"XID-79","gpu":"","action":"RESTART_BM"}]', "not a PREFLIGHT- code"),
        ('[{"code":"PREFLIGHT-X Y","gpu":"","action":"RESTART_BM"}]', "not a valid taint value"),
        ('[{"code":"PREFLIGHT-X","gpu":"../etc","action":"RESTART_BM"}]', "not a PCI bus id"),
        ('[{"code":"PREFLIGHT-X","gpu":"","action":"DESTROY"}]', "is not one of"),
        ("{", "not JSON"),
    ]:
        with pytest.raises(ValueError, match=says):
            read_findings(f"reason\n{FINDINGS_MARK}{bad}")

"""`faultline preflight`, the init container: run the checks, tell the gang, report a node at fault, and say
why in the pod's status. The collaborators come in from the CLI (the checks are `sources.preflight`'s,
which a worker does not import; the gang is `workers.gang`'s Lease; the report goes to the node agent's
ingest socket), so this is the order of things and nothing else:

    join the gang (when the pod is in one)
    run the checks on a thread of their own, while watching the gang: a member that fails meanwhile
        ends this one at once, with the gang's reason (a hung driver call is abandoned, not waited for)
    the checks fail    -> mark the gang failed first (the others stop waiting), then report the findings
                          that are the node's fault through the ingest socket, exit 1 with the reason
    the checks pass    -> mark passed, wait for the gang: all `size` passed -> exit 0; one failed -> exit 1
                          with its reason; `gang_timeout` -> exit 1 (or 0 with gang_timeout_action proceed)
    checks take longer than `check_timeout` -> PREFLIGHT-HUNG (a GPU call that does not return is a hung
                          driver: the node's fault)
    the checks raise   -> the checker's own error, not a finding: a one-line warning, then on as if passed
                          (the pod starts unchecked), or, with `fail_on_error`, exit 1 with that line (the
                          gang marked failed); never reported, never a traceback

Success writes nothing and sends nothing (but a checker error's warning, the termination message). A gang
record that cannot be reached (no RBAC in the pod's namespace, API server away) does not fail the pod:
preflight carries on alone and says so in the log; a report the agent did not keep is named in the
termination message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from faultline import bounds
from faultline.errors import FaultlineError
from faultline.models import Action
from faultline.preflight import TERMINATION_MESSAGE, Finding, reason, termination
from workers.gang import Verdict

log = logging.getLogger(__name__)


class Gang(Protocol):
    """What the run needs of `workers.gang.GangLink`."""

    def join(self) -> int: ...

    def write(self, state: Literal["checking", "passed", "failed"], reason: str = "") -> None: ...

    def verdict(self) -> Verdict: ...


@dataclass(frozen=True)
class Settings:
    check_timeout: float = 120.0  # seconds the checks may take
    gang_timeout: float = 300.0  # seconds a passed member waits for the rest of its gang
    gang_timeout_action: Literal["fail", "proceed"] = "fail"
    gang_poll: float = 1.0  # seconds between reads of the gang record
    fail_on_error: bool = False  # a checker's own error fails the pod (else: a warning, the pod proceeds)


@dataclass(frozen=True)
class Outcome:
    code: int  # the process's exit status: 0 passed, 1 failed
    reason: str  # the termination message ("" when it passed)
    findings: list[Finding] = field(default_factory=list)
    reported: int = 0  # health events the node agent kept
    warning: str = ""  # the checks could not run and the pod proceeds anyway: why, in one line


def run(
    checks: Callable[[], list[Finding]],
    *,
    settings: Settings,
    gang: Gang | None = None,
    report: Callable[[list[Finding]], int] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    started = clock()
    gang = _join(gang)
    result: list[list[Finding]] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            result.append(checks())
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which decides
            failure.append(exc)

    worker = threading.Thread(target=work, name="preflight-checks", daemon=True)
    worker.start()
    while worker.is_alive():
        if clock() - started >= settings.check_timeout:
            hung = Finding(
                "timeout",
                "PREFLIGHT-HUNG",
                f"the checks did not finish within "
                f"{settings.check_timeout:g} s (a GPU driver call that does not return)",
                "",
                Action.RESTART_BM,
            )
            return _failed([hung], gang, report)
        verdict = _verdict(gang)
        if verdict is not None and verdict.state == "failed":
            log.warning("preflight gang failed", extra={"outcome": "gang-failed", "reason": verdict.reason})
            return Outcome(1, verdict.reason)
        worker.join(settings.gang_poll if gang is not None else min(settings.gang_poll, 0.2))
    warning = ""
    if failure:
        error = failure[0]
        if not isinstance(error, Exception):
            raise error
        if settings.fail_on_error:
            text = checker_error(error, fail=True)
            log.error("preflight checks error", extra={"outcome": "check-error", "error": text})
            if gang is not None:
                _write(gang, "failed", text)
            return Outcome(1, text)
        warning = checker_error(error, fail=False)
        log.warning("preflight checks error; proceeding", extra={"outcome": "check-error", "error": warning})
    findings = result[0] if result else []
    if findings:
        return _failed(findings, gang, report)
    if gang is None:
        return Outcome(0, "", warning=warning)
    _write(gang, "passed")
    waited_from = clock()
    while True:
        verdict = _verdict(gang)
        if verdict is None or verdict.state == "proceed":
            return Outcome(0, "", warning=warning)
        if verdict.state == "failed":
            log.warning("preflight gang failed", extra={"outcome": "gang-failed", "reason": verdict.reason})
            return Outcome(1, verdict.reason)
        if clock() - waited_from >= settings.gang_timeout:
            text = f"{verdict.reason} within {settings.gang_timeout:g} s"
            if settings.gang_timeout_action == "proceed":
                log.warning(
                    "preflight gang incomplete; proceeding", extra={"outcome": "gang-timeout", "reason": text}
                )
                return Outcome(0, "", warning=warning)
            return Outcome(1, f"{text}: the gang did not assemble")
        sleep(settings.gang_poll)


def checker_error(error: Exception, *, fail: bool) -> str:
    """The one line that says the checks could not run (a bug or a missing piece of the checker, not a
    finding on the GPUs), clipped for the termination message."""
    what = " ".join(f"{type(error).__name__}: {error}".split())
    if fail:
        line = f"preflight error: the checks could not run ({what}); failing the pod (fail_on_error)"
    else:
        line = (
            f"preflight warning: the checks could not run ({what}); the pod proceeds unchecked "
            f"(fail_on_error: false)"
        )
    return bounds.clip(line, TERMINATION_MESSAGE)


def _failed(
    findings: list[Finding], gang: Gang | None, report: Callable[[list[Finding]], int] | None
) -> Outcome:
    text = reason(findings)
    message = termination(findings)  # the reason, and the node's findings for the object monitor
    if gang is not None:
        _write(gang, "failed", text)
    faults = [f for f in findings if f.node_fault]
    reported = 0
    if faults and report is not None:
        try:
            reported = report(faults)
        except (FaultlineError, OSError, RuntimeError) as exc:
            log.error(
                "preflight report not kept",
                extra={"outcome": "report-failed", "error": bounds.clip(str(exc), bounds.ERROR_TEXT)},
            )
            said = bounds.clip(f"{text}\n(not reported to the node agent: {exc})", TERMINATION_MESSAGE)
            message = message.replace(text, said, 1)
    log.warning("preflight failed", extra={"outcome": "failed", "codes": [f.code for f in findings]})
    return Outcome(1, message, findings, reported)


def _join(gang: Gang | None) -> Gang | None:
    if gang is None:
        return None
    try:
        gang.join()
    except FaultlineError as exc:
        log.warning(
            "preflight gang record unavailable; checking alone",
            extra={"outcome": "gang-unavailable", "error": bounds.clip(str(exc), bounds.ERROR_TEXT)},
        )
        return None
    return gang


def _verdict(gang: Gang | None) -> Verdict | None:
    if gang is None:
        return None
    try:
        return gang.verdict()
    except FaultlineError as exc:  # the API server away for a moment: read again at the next poll
        log.warning(
            "preflight gang record unreadable", extra={"error": bounds.clip(str(exc), bounds.ERROR_TEXT)}
        )
        return Verdict("wait", f"gang record unreadable: {exc}")


def _write(gang: Gang, state: Literal["checking", "passed", "failed"], text: str = "") -> None:
    try:
        gang.write(state, text)
    except FaultlineError as exc:
        error = bounds.clip(str(exc), bounds.ERROR_TEXT)
        log.warning("preflight gang record not written", extra={"state": state, "error": error})

"""The janitor (`faultline worker janitor`): carries out the repairs remediation asked for, checks that
they worked, and records the outcome.

It claims the `janitor` stage of `repairs` documents (set pending when a RemediationRequest is written)
and runs the last round's step:
- REBOOT: a privileged Job pinned to the node (its own ServiceAccount, image and command configurable),
  then a wait for the node to come back: a new boot id and Ready again.
- GPU_RESET: a privileged Job on the node that refuses to run while GPU processes remain, then resets the
  affected GPUs; the wait is for the Job to succeed.
  With `reboot_via="cloud"` and a cloud provider configured, the provider's API reboots the instance
  instead (it works when the node is too broken to run a Job); a node with no providerID of that
  provider (bare metal) still gets the Job.
- REPLACE: the cloud provider's replacement (`workers.cloud`: AWS, GCP, Azure, OCI), then a wait for the
  Node to go away (a new instance takes its place under another name) or to come back with a new boot
  id and Ready. The round's faults were the old hardware's: the janitor resolves them itself.
Then it validates: every fault of the round must be resolved by the node agent's fresh healthy report
within `validate_timeout`.

How a repair becomes that report on a real node: the janitor never tells the agent that faults are
gone; it records, on the round, that its step verifiably happened (`Store.record_step_verified`: the
reset Job succeeded, which with `backoffLimit: 0` and `restartPolicy: Never` means the reset script
exited 0 for every GPU; or the node came back Ready with a new boot id). While the round validates,
the node agent reads those verified rounds of its node from the store (`Store.repairs_to_confirm`),
re-reads the round's GPUs through its GPU backend (NVML, DCGM, the simulator) and reports each GPU
that reads healthy (not lost, nothing pending, no uncorrectable errors since the reset); the `gpu`
pack's `gpu-repaired` patterns turn that report into a clear of the faults the step repairs. A GPU
still unhealthy is not reported, its faults stay open, validation ends NotCleared and the next round
escalates. The two never import each other: they meet in the `repairs` documents. (A kernel-log
line cannot do this: the driver writes none for a reset, and anything user space writes, such as
nvidia-smi's "was successfully reset", could be written by any tenant.) A reboot is also recognised
by the kernel's boot line in the new boot's log (the `node` pack's boot marker).

The round's outcome (Succeeded, Failed, TimedOut, NotCleared) goes to the repairs document and the
request's status; anything but Succeeded sets the remediation stage pending again, so the next round
escalates. Nothing stays in progress forever: every wait has a timeout.

No wait holds a thread. The handler is one look: start the round, act (the Job, the provider call), see
whether the step is done, then whether the faults cleared; what is not there yet is a `common.Wait`: the
claim stays held and the next look comes after `poll` (a tenth of the time waited so far, up to 15 s,
while a node reboots) on whichever thread is free, from the repair as stored. So `threads` bounds the
looks at once, not the repairs in progress: an outage that releases many repairs at once waits for all
their reboots together (the chaos suite's 10-minute store outage released 26, which 8 threads holding
their repairs took in four rounds). How many repairs are carried out at once, fleet-wide, is capped
(`max_repairs_in_flight`, and `max_replacements_in_flight` for cloud replacements, `workers.inflight`):
a round over a cap does not start; it is given back and tried again after CAP_RETRY_S.

A janitor killed mid-repair loses nothing: the round records when it started, the node's boot id before
the repair, whether the Job was created and the provider call made, and validation's deadline, so
whoever takes it over (once its lease runs out) waits for the same reboot instead of asking for another
one. A janitor stopped gives its waiting repairs back, with no verdict.

RemediationRequests that people create are adopted by the maintenance pass (`workers.user_requests`:
refused with a clear status when they cannot be carried out) and carried out here like any round,
with three differences: a request deleted before its round starts cancels it; the node is cordoned
while the round runs (`user_cordon`); the Job is named by the request's uid.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import SkipValidation, field_validator

from faultline import bounds, config, kube, liveness, store
from faultline.errors import ApiError, ConflictError, NotFoundError, TransientError
from faultline.models import RepairOutcome, RepairStep
from workers import (
    cloud,
    common,
    fleet_state,
    gpu_clients,
    inflight,
    overrides,
    preflight_findings,
    remedies,
    rma,
    rules,
    user_requests,
)

log = logging.getLogger(__name__)
WORKER = "janitor"
GONE = "<node gone>"  # boot_before of a node that no longer exists
WAIT_MAX_S = 15.0  # the longest between two looks at a node or Job the repair waits for
LOOK_GAP_S = 30.0  # validation looks further apart than this: the agent gets its full time again
STAGE = store.Stage.JANITOR
REPAIR_LABEL = "faultline.io/repair"  # on repair Jobs and their pods: what it carries out (reboot, gpu-reset)
# The GPU reset as NVIDIA documents it (nvidia-smi(1), --gpu-reset: "requires ... no processes using the
# GPU"), run in the host's mount namespace (the Job is privileged with hostPID; the reset command enters
# PID 1's namespaces): nvidia-smi is the driver's own, from the GPU Operator's driver root
# (/run/nvidia/driver, where its driver container's file system is) or the host's. It waits up to
# HOLD_WAIT seconds for every process holding one of the reset GPUs' device nodes (/dev/nvidia<minor>) to
# go (the janitor has paused the GPU clients: the GPU Operator's device plugin, DCGM and exporter,
# faultline's agent; the driver's own persistence and fabric manager daemons are left to nvidia-smi, and
# pods on other GPUs after a partial drain do not count), names them and exits 3 if any remains; resets
# each GPU; then reads each again afresh (exit 5 if one does not answer).
RESET_SCRIPT = r"""
driver_root=${DRIVER_ROOT:-/run/nvidia/driver}; proc=${PROC:-/proc}; wait_s=${HOLD_WAIT:-120}
if [ -x "$driver_root/usr/bin/nvidia-smi" ]; then smi() { chroot "$driver_root" nvidia-smi "$@"; }
elif command -v nvidia-smi >/dev/null 2>&1; then smi() { nvidia-smi "$@"; }
else echo "no nvidia-smi: not in the GPU Operator's driver root ($driver_root) nor on the host" >&2; exit 4
fi
devices=""
for gpu in "$@"; do
  minor=$(smi --query-gpu=minor_number --format=csv,noheader -i "$gpu") ||
    { echo "GPU $gpu: no minor number (is it on this node?)" >&2; exit 1; }
  devices="$devices /dev/nvidia$(echo "$minor" | tr -d ' ')"
done
holders() {
  for fd in "$proc"/[0-9]*/fd/*; do
    target=$(readlink "$fd" 2>/dev/null) || continue
    for dev in $devices; do
      [ "$target" = "$dev" ] || continue
      pid=${fd#"$proc"/}; pid=${pid%%/*}; comm=$(cat "$proc/$pid/comm" 2>/dev/null)
      case "$comm" in nvidia-persiste*|nv-fabricmanage*) ;; *) [ "$pid" = "$$" ] || echo "$pid $comm";; esac
    done
  done | sort -u
}
waited=0
while [ -n "$(holders)" ]; do
  if [ "$waited" -ge "$wait_s" ]; then
    echo "GPU still held after ${wait_s}s, not resetting; processes holding it:" >&2
    holders >&2; exit 3
  fi
  sleep 2; waited=$((waited + 2))
done
for gpu in "$@"; do smi --gpu-reset -i "$gpu" || exit 1; done
for gpu in "$@"; do
  smi --query-gpu=pci.bus_id,name --format=csv,noheader -i "$gpu" ||
    { echo "GPU $gpu does not answer after its reset" >&2; exit 5; }
done
"""
# The node's state for a person, before a repair changes it: nvidia-bug-report.sh (the driver's own, from
# the GPU Operator's driver root or the host, as nvidia-smi above) run in the host's mount namespace by the
# repair Job's init container, into $BUG_REPORT_DIR/<request>.log.gz (written under a dot name, then moved:
# the node agent uploads complete files only). It never fails the Job: a node without the driver's tools, or
# a report that does not finish within $BUG_REPORT_TIMEOUT seconds (SIGTERM, then SIGKILL 10 s later: a
# wedged GPU's tools may ignore the first), lets the repair go ahead without it. Its time counts in the
# repair's own (job_timeout, reboot_timeout).
BUG_REPORT_SCRIPT = r"""
dir=${BUG_REPORT_DIR:?}; name=$1; limit=${BUG_REPORT_TIMEOUT:-300}
driver_root=${DRIVER_ROOT:-/run/nvidia/driver}
mkdir -p "$dir" || { echo "cannot make $dir: no bug report"; exit 0; }
part="$dir/.$name.log"
if [ -x "$driver_root/usr/bin/nvidia-bug-report.sh" ]; then
  timeout -k 10 "$limit" chroot "$driver_root" nvidia-bug-report.sh --output-file "/tmp/.$name.log" \
    >/dev/null 2>&1
  rc=$?
  for f in "$driver_root/tmp/.$name.log.gz" "$driver_root/tmp/.$name.log"; do
    [ -f "$f" ] && mv "$f" "$dir/"
  done
elif command -v nvidia-bug-report.sh >/dev/null 2>&1; then
  timeout -k 10 "$limit" nvidia-bug-report.sh --output-file "$part" >/dev/null 2>&1
  rc=$?
else
  echo "no nvidia-bug-report.sh: not in the GPU Operator's driver root ($driver_root) nor on the host"; exit 0
fi
if [ "$rc" = 124 ]; then  # cut short: a partial report is not kept as if it were whole
  rm -f "$part" "$part.gz"; echo "nvidia-bug-report.sh did not finish within ${limit}s: no report"; exit 0
fi
[ -f "$part" ] && gzip -f "$part"
if [ -s "$part.gz" ]; then mv "$part.gz" "$dir/$name.log.gz" && echo "bug report: $dir/$name.log.gz"
else rm -f "$part" "$part.gz"; echo "nvidia-bug-report.sh left no report (within ${limit}s)"; fi
exit 0
"""
_NSENTER = ("nsenter", "-t", "1", "-m", "--")  # the host's mount namespace: its driver tools and /dev


# record_only: the Job prints the command it was given and succeeds (its log is the record)
RECORD_SCRIPT = 'echo "faultline janitor (record only): would run $0: $*"'

_Provider = cloud.Provider | None
Verdict = tuple[RepairOutcome, str]  # how a round's step (or its validation) ended, and why
REQUEST_PHASES = (RepairOutcome.SUCCEEDED, RepairOutcome.FAILED, RepairOutcome.TIMED_OUT)  # its own phase
CAP_RETRY_S = 15.0  # a round held back by a cap on repairs in flight is tried again after this


class Settings(config.JanitorTuning):
    """The janitor's tunables (defined once, in `JanitorConfig`) and the cloud provider built from it."""

    provider: SkipValidation[_Provider] = None  # REPLACE, and REBOOT with reboot_via="cloud"
    caps: remedies.Caps = remedies.Caps()  # what people's requests are held to (remediation's values)

    @field_validator("reset_command")
    @classmethod
    def _builtin_reset(cls, command: tuple[str, ...]) -> tuple[str, ...]:
        return command or (*_NSENTER, "sh", "-c", RESET_SCRIPT, "gpu-reset")

    @classmethod
    def from_config(cls, cfg: config.JanitorConfig, provider: cloud.Provider | None) -> Settings:
        return config.part(cfg, cls, provider=provider, caps=config.part(cfg, remedies.Caps))

    @property
    def repair_caps(self) -> inflight.Caps:
        """The caps on repairs in flight (0 in a setting: no cap)."""
        return inflight.Caps(self.max_repairs_in_flight or None, self.max_replacements_in_flight or None)


class Janitor:
    def __init__(
        self, st: store.Store, api: kube.ApiClient, settings: Settings, owner: str, *,
        stall: float = liveness.DEFAULT_LIMIT_S,
    ) -> None:  # fmt: skip
        self.alive = liveness.Liveness()  # what its /healthz answers: `stall` s without progress fails it
        self.store = st
        self.api = api
        self.settings = settings
        self.owner = owner
        self.metrics = common.WorkerMetrics(WORKER)
        limits = user_requests.Limits(settings.user_actions, settings.caps, settings.provider is not None)
        self.adopter = user_requests.Adopter(st, api, limits, record=self._event)
        self.state = fleet_state.JanitorState(st, self.metrics.registry)
        self.loop = common.ClaimLoop(
            st, STAGE, owner, self._handle, lease=settings.lease, threads=settings.threads,
            metrics=self.metrics, collection=store.Work.REPAIRS, order=("-fatal", "first_seen"),
            every=settings.lease.total_seconds() / 2, max_attempts=5, api=api, resync=self.adopter.run,
            observe=self.state.refresh, alive=self.alive, stall=stall,
        )  # fmt: skip
        self.stop = self.loop.stop

    def start(self) -> list[threading.Thread]:
        return self.loop.start()

    def halt(self, timeout: float = 30.0) -> bool:
        return self.loop.halt(timeout)

    # -- one repair ----------------------------------------------------------------------------------------
    def _handle(self, claim: store.Claim) -> common.Outcome:
        """One look at the repair's last round: start it, act (the Job, the provider call, each once),
        see whether the step is done, then whether its faults cleared. Whatever is not there yet is a
        wait: the round goes back pending and is looked at again later, by this replica or another,
        from what the round records, so a wait holds no thread (see `common.Wait`)."""
        repair = store.Repair.from_doc(claim.doc)
        rounds = repair.rounds
        if not rounds or rounds[-1].outcome:
            return store.State.DONE  # nothing waiting
        index, current = len(rounds) - 1, rounds[-1]
        node, step, name = repair.node, current.step, current.request
        user = repair.user
        if user is not None and current.started_at is None and not user_requests.still_wanted(self.api, user):
            return self._cancel(repair, index, current)
        # on every look until the step is done, whatever the round says it did already (the store is no
        # authority on that either), before anything is written anywhere; a request deleted while its round
        # validates only loses its status
        step_part = current.validate_until is None
        if not current.external and step_part and (why := self._unrequested(node, current)) is not None:
            return self._refuse(repair, index, current, why)
        unstarted = current.started_at is None and not current.external
        if unstarted and (why := self._left_alone(node)) is not None:  # an operator's override wins
            return self._cancel(repair, index, current, why, refused=True)
        external = current.external
        status = self._noop_status if external else self._status  # an external CR's status is its own
        if user is not None:  # a person's request: written only while it is still that request
            status = functools.partial(self._status, uid=user.uid)
            if self.settings.user_cordon and current.validate_until is None:
                user_requests.cordon(self.api, node, name)
        started = current.started_at
        if started is None:  # the first holder of this round: what a takeover must wait for
            started = self.store.clock()
            boot = self._boot_id_or_gone(node)
            current = current.model_copy(update={"started_at": started, "boot_before": boot})
            self.store.start_round(repair.id, index, started, boot)
            if not external and (held_back := self._over_cap(repair, index, step)) is not None:
                return held_back
        if self.owner not in current.lookers:  # this replica's first look (the round's first, or a takeover)
            lookers = [*current.lookers, self.owner]
            self.store.record_lookers(repair.id, index, lookers)
            current = current.model_copy(update={"lookers": lookers})
            phase = "Running" if current.validate_until is None else "Validating"
            status(name, phase, started=started, attempts=len(lookers))
        if current.validate_until is None:  # the step's part
            if external:  # an external remediator acts; the janitor only validates (below)
                outcome, message = RepairOutcome.SUCCEEDED, "left to the external remediator"
            else:
                done = self._carry_out(node, step, current.job or name, current, started, (repair.id, index))
                if done is None:
                    return self._later(started)
                outcome, message = done
            if outcome != RepairOutcome.SUCCEEDED:
                return self._finish(repair, index, current, outcome, message, status)
            current = self._validating(repair, index, current, message, status)
        outcome_or_wait = self._validate(repair, index, current)
        if isinstance(outcome_or_wait, common.Wait):
            return outcome_or_wait
        return self._finish(repair, index, current, *outcome_or_wait, status)

    def _over_cap(self, repair: store.Repair, index: int, step: RepairStep) -> common.Outcome | None:
        """The round just started: may it go ahead under the caps on repairs in flight (`workers.inflight`)?
        If not, its start is taken back and it waits (given back, not failed); None: it goes ahead."""
        limits = self.settings.repair_caps
        if limits == inflight.NO_CAPS:
            return None
        others = [r.step for r in self.store.repairs_in_flight() if r.repair_id != repair.id]
        why = inflight.over(limits, step, others)
        if why is None:
            return None
        self.store.withdraw_start(repair.id, index)
        self.metrics.limited.labels(limit="replacements" if "replace" in why else "repairs").inc()
        log.warning("repair waits: a cap on repairs in flight is reached",
                    extra={"node": repair.node, "item": repair.id, "action": str(step), "reason": why,
                           "worker": WORKER})  # fmt: skip
        retry = self.store.clock() + dt.timedelta(seconds=CAP_RETRY_S)
        return store.Completion(state=store.State.PENDING, retry_after=retry, fresh=True)

    def _validating(
        self, repair: store.Repair, index: int, current: store.RepairRound, message: str,
        status: Callable[..., None],
    ) -> store.RepairRound:  # fmt: skip
        """The step is done: what that settles (the old hardware's faults of a replacement, the agent's
        re-read after a reset or reboot), and validation's deadline, recorded on the round."""
        step, now = current.step, self.store.clock()
        if step == remedies.REPLACE and not current.external:
            # the old hardware's, of this node only, whatever keys the round names
            self.store.resolve_faults(current.fault_keys, f"janitor: {message}", node=repair.node)
        if step in (remedies.GPU_RESET, remedies.REBOOT) and not current.external:
            # the step verifiably happened: the node agent re-reads the round's GPUs from now on; a failed
            # preflight's findings were one look, which the next pod's preflight takes again
            self.store.resolve_observations(
                current.fault_keys, preflight_findings.SOURCE, f"janitor: {message}", node=repair.node
            )
            self.store.record_step_verified(repair.id, index, now, message)
        if current.external:  # the external remediator may have finished before this janitor looked
            assert current.started_at is not None
            until = (current.requested_at or current.started_at) + dt.timedelta(
                seconds=float(current.timeout or 0)
            )
        else:
            until = now + self.settings.validate_timeout
        self.store.start_validation(repair.id, index, now, until)
        status(current.request, "Validating")
        return current.model_copy(update={"validate_until": until, "checked_at": now})

    def _finish(
        self, repair: store.Repair, index: int, current: store.RepairRound, outcome: RepairOutcome,
        message: str, status: Callable[..., None],
    ) -> common.Outcome:  # fmt: skip
        """The round's verdict: recorded on the round and the request, an Event; anything but Succeeded
        hands the repair back to remediation, which escalates."""
        node, step, name = repair.node, current.step, current.request
        started = current.started_at
        assert started is not None  # a round gets a verdict only once started
        finished = self.store.clock()
        self.store.record_round_outcome(
            repair.id, index, outcome=outcome, at=finished, message=message, started_at=started
        )
        status(name, outcome if outcome in REQUEST_PHASES else RepairOutcome.FAILED,
               finished=finished, message=message)  # fmt: skip
        if repair.user is not None:
            user_requests.uncordon(self.api, node, name)
        common.post_event(
            self.api, node, reason=f"FaultlineRepair{outcome}", note=f"{step} ({name}): {message}",
            action="Repair", warning=outcome != RepairOutcome.SUCCEEDED, worker=WORKER, owner=self.owner,
        )  # fmt: skip
        self.metrics.actions.labels(result=outcome).inc()
        self.state.ended(step, outcome)
        if outcome != RepairOutcome.SUCCEEDED:  # remediation decides the next round (an escalation)
            return store.Completion(then=store.HandOver.TO_REMEDIATION)  # once this claim closes
        return store.State.DONE

    def _later(self, since: dt.datetime) -> common.Wait:
        """Look again later: every `poll` at first, then a tenth of the time waited so far, at most
        WAIT_MAX_S (a reboot takes minutes; a look every 15 s finds it soon enough)."""
        poll = self.settings.poll.total_seconds()
        waited = (self.store.clock() - since).total_seconds()
        return common.Wait(min(max(poll, waited / 10), max(poll, WAIT_MAX_S)))

    def _carry_out(
        self, node: str, step: RepairStep, job: str, current: store.RepairRound, started: dt.datetime,
        where: tuple[str, int],
    ) -> Verdict | None:  # fmt: skip
        """The round's step and its outcome, or None: not done yet (look again later). A failure is an
        outcome (recorded, then escalated), but the API server or the store being away is not: it raises
        TransientError, and the claim is retried with the same round (its start, boot id, Job and cloud
        call recorded), never a second repair."""
        try:
            with store.unreachable_is_transient("carrying out a repair"):
                return self._run(node, step, job, current, started, where)
        except TransientError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed repair is an outcome, recorded and escalated
            return RepairOutcome.FAILED, bounds.clip(f"{type(exc).__name__}: {exc}", bounds.STORED_TEXT)

    def _left_alone(self, node: str) -> str | None:
        """Why an operator's override forbids starting a repair on the node (`workers.overrides`: the opt-out
        label `faultline.io/managed=false`, a pause in force), or None. A node that is gone is not refused
        here (a replacement's wait knows what that means)."""
        try:
            obj = kube.nodes.read(self.api, node)
        except NotFoundError:
            return None
        meta = obj.get("metadata") or {}
        if (meta.get("labels") or {}).get(rules.MANAGED_LABEL) == "false":
            return f"the node is labelled {rules.MANAGED_LABEL}=false: faultline leaves it alone"
        until, _ = overrides.paused_until((meta.get("annotations") or {}).get(overrides.PAUSE_ANNOTATION),
                                          self.store.clock())  # fmt: skip
        if until is not None:
            return f"faultline is paused on the node until {until.isoformat()} ({overrides.PAUSE_ANNOTATION})"
        return None

    def _cancel(
        self, repair: store.Repair, index: int, current: store.RepairRound,
        message: str = "the RemediationRequest was deleted before the repair started",
        *, refused: bool = False,
    ) -> common.Outcome:  # fmt: skip
        """A round not started, and never to be: a person's request deleted, or (`refused`) an operator's
        override on the node (`_left_alone`). Nothing is carried out; the reason is recorded on the round, in
        an Event and on the request (Refused) where there is one."""
        now = self.store.clock()
        if refused:
            log.warning("repair refused: an operator's override on the node",
                        extra={"node": repair.node, "item": repair.id, "action": str(current.step),
                               "reason": message, "worker": WORKER})  # fmt: skip
            uid = repair.user.uid if repair.user is not None else None
            self._status(current.request, "Refused", finished=now, message=message, uid=uid)
        self.store.record_round_outcome(
            repair.id, index, outcome=remedies.CANCELLED, at=now, message=message, started_at=now
        )
        self.store.set_repair_result(repair.id, "cancelled")
        user_requests.uncordon(self.api, repair.node, current.request)  # in case a holder got that far
        self._event(repair.node, "FaultlineRepairCancelled", f"{current.step} ({current.request}): {message}",
                    False)  # fmt: skip
        self.metrics.actions.labels(result=remedies.CANCELLED).inc()
        self.state.ended(current.step, remedies.CANCELLED)
        return store.State.DONE

    def _unrequested(self, node: str, current: store.RepairRound) -> str | None:
        """Why no RemediationRequest asks for this round's step (None: one does). The store alone never
        makes the janitor act: the request must exist in the API server, where only the remediation
        worker's ServiceAccount and the people RBAC allows can create one, name this node and this step
        (and every GPU the round would reset), and not be finished already."""
        try:
            obj = kube.resources.get_request(self.api, current.request)
        except NotFoundError:
            return f"no RemediationRequest {current.request} exists"
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if spec.get("node") != node:
            return f"RemediationRequest {current.request} is for node {spec.get('node')!r}, not {node}"
        if spec.get("action") != str(current.step):
            return f"RemediationRequest {current.request} asks for {spec.get('action')!r}, not {current.step}"
        asked = {str(g) for g in spec.get("gpus") or ()}
        if asked and not {str(g) for g in current.gpus} <= asked:
            return f"RemediationRequest {current.request} does not name every GPU the round would reset"
        if status.get("finishedAt"):
            return f"RemediationRequest {current.request} was carried out already"
        return None

    def _refuse(
        self, repair: store.Repair, index: int, current: store.RepairRound, why: str
    ) -> common.Outcome:
        """A round no RemediationRequest asks for: nothing is carried out; recorded on the round and in a
        warning Event (the request, if any, is someone else's and is left as it is)."""
        now = self.store.clock()
        log.warning("repair refused: no RemediationRequest asks for it",
                    extra={"node": repair.node, "item": repair.id, "action": str(current.step), "reason": why,
                           "worker": WORKER})  # fmt: skip
        self.store.record_round_outcome(
            repair.id, index, outcome=remedies.CANCELLED, at=now, message=why, started_at=now
        )
        self.store.set_repair_result(repair.id, "refused")
        self._event(repair.node, "FaultlineRepairRefused", f"{current.step} ({current.request}): {why}", True)
        self.metrics.actions.labels(result="refused").inc()
        self.state.ended(current.step, remedies.CANCELLED)
        return store.State.DONE

    def _event(self, node: str, reason: str, note: str, warning: bool) -> None:
        common.post_event(self.api, node, reason=reason, note=note, action="Repair", warning=warning,
                          worker=WORKER, owner=self.owner)  # fmt: skip

    def _run(
        self, node: str, step: RepairStep, name: str, current: store.RepairRound, started: dt.datetime,
        where: tuple[str, int],
    ) -> Verdict | None:  # fmt: skip
        before = current.boot_before or ""
        if step == remedies.REBOOT:
            acted = current.acted_at is not None or current.cloud_call is not None  # by an earlier look
            inst = self._instance(node) if self.settings.reboot_via == "cloud" and not acted else None
            if inst is not None:
                target = inst
                self._cloud(current, where, lambda p: p.reboot(target))
            elif current.cloud_call is None:
                self._job(name, node, self.settings.reboot_command, current, where, action="reboot")
                if self.settings.record_only:  # nothing reboots: the Job's exit is the outcome
                    return self._check_job(name, started)
            return self._check_back(node, before, started)
        if step == remedies.GPU_RESET:
            gpus = [str(g) for g in current.gpus]
            pausing = not self.settings.record_only  # record only: nothing on the node is touched
            if pausing and current.acted_at is None:  # the GPUs' clients leave first (the Job waits for them)
                self._gpu_clients(node, gpu_clients.pause)
            try:
                self._job(
                    name, node, (*self.settings.reset_command, *gpus), current, where, action="gpu-reset"
                )
                verdict = self._check_job(name, started)
            except TransientError:
                raise  # looked at again: the clients stay paused for the Job under way
            except Exception:
                if pausing:  # the round ends here (its Job refused, or gone): they come back
                    self._gpu_clients(node, gpu_clients.resume)
                raise
            if verdict is not None and pausing:  # done either way: they come back (the agent, to validate)
                self._gpu_clients(node, gpu_clients.resume)
            return verdict
        if step == remedies.REPLACE:
            if self.settings.provider is None:
                return RepairOutcome.FAILED, "no cloud provider is configured to replace the node"
            if before == GONE:
                return RepairOutcome.SUCCEEDED, "the Node was already gone"
            said = current.cloud_call
            if said is None:  # before the machine goes: what faultline knew of it, kept for a person
                evidence = rma.keep(
                    self.store, self._repair_of(where), where[1], current, "replaced by the provider"
                )
                if evidence is not None:
                    self._status(current.request, "Running", evidence=evidence)
                try:
                    inst = cloud.instance(self._provider_id(node))
                except ValueError as exc:
                    return RepairOutcome.FAILED, f"cannot replace: {exc}"
                said = self._cloud(current, where, lambda p: p.replace(inst))
            back = self._check_back(node, before, started, gone_ok=True)
            return None if back is None else (back[0], f"{said}; {back[1]}")
        return RepairOutcome.FAILED, f"the janitor does not carry out {step}"

    def _instance(self, node: str) -> cloud.Instance | None:
        """The node's instance at the configured provider; None: not one of its instances (bare metal)."""
        if self.settings.provider is None:
            return None
        try:
            inst = cloud.instance(self._provider_id(node))
        except ValueError:
            return None
        return inst if inst.provider == self.settings.provider.name else None

    def _provider_id(self, node: str) -> str:
        return str(kube.nodes.read(self.api, node).get("spec", {}).get("providerID", ""))

    def _cloud(
        self, current: store.RepairRound, where: tuple[str, int], call: Callable[[cloud.Provider], str]
    ) -> str:
        """The provider call, made once per round: a takeover finds it recorded and does not repeat it."""
        if current.cloud_call:
            return current.cloud_call
        provider = self.settings.provider
        assert provider is not None  # callers checked
        for attempt in range(self.settings.cloud_retries):
            try:
                said = call(provider)
                break
            except TransientError as exc:
                if attempt + 1 >= self.settings.cloud_retries:
                    raise
                self.stop.wait(exc.delay)
        doc_id, index = where
        self.store.record_cloud_call(doc_id, index, said)
        log.info("cloud call done: %s", said, extra={"step": current.step, "repair": doc_id})
        return said

    def _job(
        self, name: str, node: str, command: tuple[str, ...], current: store.RepairRound,
        where: tuple[str, int], *, action: str,
    ) -> None:  # fmt: skip
        """The round's Job, created once: a later look finds `acted_at` recorded and only waits for it (a
        Job deleted meanwhile is not created again: its node may have rebooted already)."""
        if current.acted_at is not None:
            return
        s = self.settings
        privileged = not s.record_only
        if s.record_only:
            command = ("sh", "-c", RECORD_SCRIPT, action, *command)
        body: Any = {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {REPAIR_LABEL: action, "faultline.io/node": node}},
            "spec": {
                "backoffLimit": 0, "ttlSecondsAfterFinished": 3600,
                "template": {
                    "metadata": {"annotations": dict(s.job_annotations),
                                 # the drainer leaves the repair's own pod (REPAIR_LABEL) on the node
                                 "labels": {REPAIR_LABEL: action, "faultline.io/node": node}},
                    "spec": {
                        "nodeName": node, "restartPolicy": "Never", "hostPID": privileged,
                        "serviceAccountName": s.service_account, "terminationGracePeriodSeconds": 5,
                        "tolerations": [{"operator": "Exists"}],
                        **({"imagePullSecrets": [{"name": n} for n in s.image_pull_secrets]}
                           if s.image_pull_secrets else {}),
                        **({"initContainers": [_bug_report(s, name)]} if privileged and s.bug_report_dir
                           else {}),
                        "containers": [{"name": action, "image": s.image, "command": list(command),
                                        "securityContext": _job_security(privileged)}],
                    },
                },
            },
        }  # fmt: skip
        with contextlib.suppress(ConflictError):  # created already by this claim's earlier holder
            kube.jobs.create(self.api, s.namespace, body)
        self.store.record_action(*where, self.store.clock())

    def _boot_id(self, node: str) -> str:
        obj = kube.nodes.read(self.api, node)
        return str(obj.get("status", {}).get("nodeInfo", {}).get("bootID", ""))

    def _boot_id_or_gone(self, node: str) -> str:
        try:
            return self._boot_id(node)
        except NotFoundError:
            return GONE

    def _ready(self, node: str) -> tuple[str, bool]:
        obj = kube.nodes.read(self.api, node)
        status = obj.get("status", {})
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
        return str(status.get("nodeInfo", {}).get("bootID", "")), ready

    def _check_back(
        self, node: str, before: str, started: dt.datetime, *, gone_ok: bool = False
    ) -> Verdict | None:
        """One look at the node after a reboot or replacement: back (a new boot id and Ready; removed,
        where `gone_ok`), timed out, or None (not yet)."""
        try:
            boot, ready = self._ready(node)
        except NotFoundError:
            if gone_ok:
                return RepairOutcome.SUCCEEDED, "the Node was removed (a new instance replaces it)"
            raise
        except TransientError:  # the API server away (restarting): not back yet, as far as we know
            boot, ready = "", False
        if boot and boot != before and ready:
            return RepairOutcome.SUCCEEDED, f"back with boot id {boot}"
        if self.store.clock() < started + self.settings.reboot_timeout:
            return None
        what = "no new boot id and Ready" + (" and the Node not removed" if gone_ok else "")
        return RepairOutcome.TIMED_OUT, f"{what} within {self.settings.reboot_timeout}"

    def _gpu_clients(
        self, node: str, change: Callable[[Mapping[str, str], tuple[str, ...]], dict[str, str | None]]
    ) -> None:
        """Pause or resume the GPU clients on the node (`workers.gpu_clients`): a patch of its labels,
        made only on the labels as read."""
        for _ in range(5):
            try:
                meta = kube.nodes.read(self.api, node).get("metadata", {})
            except NotFoundError:
                return  # the Node is gone: nothing runs there
            labels = change(meta.get("labels") or {}, self.settings.gpu_client_labels)
            if not labels:
                return
            try:
                kube.nodes.patch(self.api, node, {"metadata": {"labels": labels}},
                                 resource_version=meta["resourceVersion"])  # fmt: skip
            except ConflictError:
                continue
            log.info("GPU clients %s", "resumed" if labels.get(gpu_clients.AGENT_LABEL) is None else "paused",
                     extra={"node": node, "item": ",".join(sorted(labels))})  # fmt: skip
            return
        raise TransientError(
            f"node {node}: five conflicting updates in a row while pausing GPU clients", delay=1.0
        )

    def _check_job(self, name: str, started: dt.datetime) -> Verdict | None:
        """One look at the round's Job: its outcome, timed out, or None (still running)."""
        try:
            job = kube.jobs.read(self.api, self.settings.namespace, name)
        except TransientError:  # the API server away: not finished, as far as we know
            job = {}
        status = job.get("status", {})
        if status.get("succeeded"):  # backoffLimit 0, restartPolicy Never: the command exited 0
            return RepairOutcome.SUCCEEDED, "the Job succeeded (its command exited 0)"
        if status.get("failed"):
            return RepairOutcome.FAILED, "the Job failed (GPU processes still running, or the reset failed)"
        if self.store.clock() < started + self.settings.job_timeout:
            return None
        return RepairOutcome.TIMED_OUT, f"the Job did not finish within {self.settings.job_timeout}"

    def _validate(
        self, repair: store.Repair, index: int, current: store.RepairRound
    ) -> Verdict | common.Wait:
        """One look at the round's faults: all resolved by a fresh healthy report from the node agent
        (since the round started; an external round's since it was requested), or still open past the
        deadline, or a wait. A gap in the looks longer than LOOK_GAP_S (the store away, every janitor
        away) gives the agent its full time again: otherwise a long outage would end in NotCleared and
        an escalation, a second repair of a node the first one may have fixed. (An external round keeps
        its own deadline.)"""
        assert current.started_at is not None
        assert current.validate_until is not None
        since = (current.requested_at or current.started_at) if current.external else current.started_at
        now, until = self.store.clock(), current.validate_until
        last = current.checked_at or now
        if not current.external and (now - last).total_seconds() > max(
            LOOK_GAP_S, 5 * self.settings.poll.total_seconds()
        ):
            until = max(until, now + self.settings.validate_timeout)
        with store.unreachable_is_transient("reading the round's faults"):
            open_ = self.store.unresolved(current.fault_keys, since)
        if not open_:
            return RepairOutcome.SUCCEEDED, "the node agent reports the GPUs healthy again"
        if now >= until:
            return RepairOutcome.NOT_CLEARED, f"still open after the repair: {', '.join(open_)}"
        look = store.RoundLook(
            index,
            checked_at=now if (now - last).total_seconds() >= LOOK_GAP_S / 3 else None,  # often enough to
            validate_until=until if until != current.validate_until else None,  # tell a gap, not every look
        )
        return common.Wait(self.settings.poll.total_seconds(), look)

    def _repair_of(self, where: tuple[str, int]) -> store.Repair:
        repair = self.store.repair(where[0])
        if repair is None:
            raise TransientError(f"repair {where[0]} is not in the store", delay=1.0)
        return repair

    def _noop_status(self, name: str, phase: str, **_: Any) -> None:
        pass

    def _status(self, name: str, phase: str, *, started: dt.datetime | None = None,
                finished: dt.datetime | None = None, message: str | None = None,
                uid: str | None = None, attempts: int | None = None,
                evidence: str | None = None) -> None:  # fmt: skip
        """Write the request's status (`uid`: only while the request of that name is that object; a
        request deleted meanwhile gets nothing, and that is no error); `evidence`: the RMA bundle kept."""
        status: dict[str, Any] = {"phase": phase}
        if evidence is not None:
            status["evidence"] = evidence
        if started is not None:
            status["startedAt"] = started.strftime("%Y-%m-%dT%H:%M:%SZ")
        if finished is not None:
            status["finishedAt"] = finished.strftime("%Y-%m-%dT%H:%M:%SZ")
        if message is not None:
            status["message"] = bounds.clip(message, bounds.REQUEST_TEXT)
        try:
            current = kube.resources.get_request(self.api, name)
            same = uid is None or (current.get("metadata") or {}).get("uid") == uid  # not another object
            if attempts is not None:  # the replicas that took the round on
                status["attempts"] = attempts
            if same:
                kube.resources.patch_request_status(self.api, name, status)
        except NotFoundError:
            same = False
        except ApiError as exc:
            log.warning("could not update RemediationRequest %s: %s", name, exc)
            return
        if not same:
            log.info(
                "RemediationRequest %s is gone: status %s not written", name, phase, extra={"item": name}
            )


def _bug_report(s: Settings, name: str) -> dict[str, Any]:
    """The repair Job's first container: the node's nvidia-bug-report, before the repair changes the node."""
    limit = int(s.bug_report_timeout.total_seconds())
    return {
        "name": "bug-report", "image": s.image,
        "command": [*_NSENTER, "sh", "-c", BUG_REPORT_SCRIPT, "bug-report", name],
        "env": [{"name": "BUG_REPORT_DIR", "value": s.bug_report_dir},
                {"name": "BUG_REPORT_TIMEOUT", "value": str(limit)}],
        "securityContext": _job_security(True),
    }  # fmt: skip


def _job_security(privileged: bool) -> dict[str, Any]:
    """A repair Job's container: a real reboot or reset enters the host's namespaces (nsenter -t 1) and
    drives the GPUs, which takes root with every capability; the image's default user (65532) would have
    none even in a privileged container. A record-only Job needs nothing."""
    if privileged:
        return {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}
    return {"privileged": False, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}

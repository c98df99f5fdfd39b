"""The remediation worker (`faultline worker remediation`): decides each drained node's repair and asks
for it with a RemediationRequest (CRD `remediationrequests.faultline.io`, ARCHITECTURE §6).

Work items are documents in `repairs`, one per quarantine episode of a node (`<node>/<episode>`),
created by the resync pass once the drainer reports the node drained (or, with `require_drain` off, once
it is quarantined). Each holds the rounds of repair tried: the step, the request's name, and the outcome
the janitor recorded. A claim of the `remediation` stage decides the next step from the node's open
faults and every round recorded for the node (`workers.remedies`: escalation, caps, repeat offenders)
and writes the request; CONTACT_SUPPORT writes none: the node stays quarantined, with an Event and the
node condition `FaultlineRemediation` False. Faults whose repair the cloud provider carries out (announced
maintenance, `repair: provider` in their metadata) get no round: the provider takes the node through its
maintenance, and the fault resolves once it is back. The janitor sets the stage back to pending when a repair
did not clear the fault, which makes the next round an escalation. A round that a person's
RemediationRequest started (adopted by the janitor, `workers.user_requests`) escalates here too, unless
a quarantine episode's repair of the node is open (that one decides, with the failed round in the
node's history). No round is decided while another repair of the node is with the janitor.

After a partial drain (`Drain.scope == "gpus"`: only the pods of the faulty GPUs were moved) the one
repair that may run is a reset of those GPUs. Any other step (an escalation to REBOOT, a fault on
another GPU) first widens the drain to the whole node (`Store.widen_drain`): the repair waits in the
stage state `drain` until the drainer has emptied the node, then the resync pass hands it back.

With a template (`workers.templates`), each request is an external remediator's CR rendered from it
instead of a RemediationRequest. The round is marked external: the janitor carries nothing out for it,
but still validates it (the faults must clear within `external_timeout`) and records the outcome, so a
repair the external remediator did not manage escalates like any other.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import threading
from typing import Any

from faultline import bounds, conditions, config, evidence, kube, liveness, store
from faultline.errors import ConfigError, ConflictError, NotFoundError
from faultline.models import PROVIDER_REPAIR, Action, RepairOutcome, RepairStep
from workers import attribution, common, others, remedies, rma, templates

log = logging.getLogger(__name__)
WORKER = "remediation"
STAGE = store.Stage.REMEDIATION
CONDITION = "FaultlineRemediation"
WAIT_DRAIN = store.State.DRAIN  # the repair waits for the whole node's drain after a partial one
_SEVERITY = {a: i for i, a in enumerate(Action)}
BUSY_RETRY = dt.timedelta(seconds=5)  # look again this long after finding another repair under way
YIELD_RETRY = dt.timedelta(seconds=30)  # look again this long after finding another system acting on the node
ACTIVE = (store.State.PENDING, store.State.CLAIMED)
UNIQUE_PART = 8  # characters of the hash (or of a person's request's uid) that make a request's name unique


class Settings(config.RemediationTuning):
    """The worker's tunables (defined once, in `RemediationConfig`) and what is loaded from the rest of it."""

    caps: remedies.Caps = remedies.Caps()
    template: dict[str, Any] | None = None  # an external remediator's CR; None: RemediationRequest

    @classmethod
    def from_config(cls, cfg: config.RemediationConfig) -> Settings:
        template = templates.load(cfg.template) if cfg.template else None
        markers(cfg.yield_to)  # a bad marker fails at start, named
        return config.part(cfg, cls, caps=config.part(cfg, remedies.Caps), template=template)


def markers(texts: tuple[str, ...]) -> tuple[others.Marker, ...]:
    try:
        return tuple(others.parse(t) for t in texts)
    except ValueError as exc:
        raise ConfigError(f"remediation yield_to: {exc}") from None


def request_name(node: str, episode: dt.datetime | None, round_: int) -> str:
    digest = hashlib.sha256(f"{node}/{store.episode_label(episode)}".encode()).hexdigest()[:UNIQUE_PART]
    return bounds.clip(f"{node}-{digest}-{round_}", bounds.OBJECT_NAME)


def history(st: store.Store, node: str) -> list[remedies.Repair]:
    """Every finished round of repair recorded for the node."""
    return [
        remedies.Repair(r.step, tuple(r.fault_keys), r.at, r.outcome)
        for repair in st.repairs_of(node)
        for r in repair.rounds
        if r.outcome and r.at is not None
    ]


class Remediation:
    def __init__(
        self, st: store.Store, api: kube.ApiClient, settings: Settings, owner: str, *,
        stall: float = liveness.DEFAULT_LIMIT_S, verifier: evidence.Verifier | None = None,
    ) -> None:  # fmt: skip
        """`verifier`: repair only for faults whose writer it proves (`workers.attribution`); None: any."""
        self.alive = liveness.Liveness()  # what its /healthz answers: `stall` s without progress fails it
        self.store = st
        self.api = api
        self.settings = settings
        self.owner = owner
        self.metrics = common.WorkerMetrics(WORKER)
        self.attribution = None if verifier is None else attribution.Attribution(verifier, self.metrics)
        self.yield_to = markers(settings.yield_to)
        self.loop = common.ClaimLoop(
            st, STAGE, owner, self._handle, lease=settings.lease, threads=settings.threads,
            metrics=self.metrics, collection=store.Work.REPAIRS, order=("-fatal", "first_seen"),
            resync=self.resync, every=settings.resync_interval.total_seconds(), api=api, alive=self.alive,
            stall=stall,
        )  # fmt: skip
        self.stop = self.loop.stop

    def start(self) -> list[threading.Thread]:
        return self.loop.start()

    def halt(self, timeout: float = 30.0) -> bool:
        return self.loop.halt(timeout)

    def resync(self) -> None:
        """A repairs document for each quarantine episode that is ready for repair."""
        known = self.store.repair_ids()
        drained = self.store.drained_episodes()
        for hold in self.store.held_nodes():
            node, episode = hold.id, hold.quarantined_at
            if episode is None:
                continue
            if self.settings.require_drain and drained.get(node, ...) != episode:
                continue
            if store.repair_key(node, episode) not in known:
                self.store.open_repair(node, episode)
        for repair in self.store.repairs_in_state(STAGE, WAIT_DRAIN):
            drain = self.store.drain(repair.node)
            if drain is None or drain.episode != repair.episode or drain.scope == "gpus":
                continue  # still partial: widened by the claim that set this state
            if drained.get(repair.node, ...) == repair.episode:
                self.store.move_repair(repair.id, STAGE, WAIT_DRAIN, store.State.PENDING)

    def _handle(self, claim: store.Claim) -> common.Outcome:
        repair = store.Repair.from_doc(claim.doc)
        node = repair.node
        if repair.rounds and not repair.rounds[-1].outcome:
            # written (and requested) by a holder that died before its claim closed: that round is handed
            # over, not decided again (a second request, and the first never carried out)
            return store.Completion(then=store.HandOver.TO_JANITOR)
        others = [r for r in self.store.repairs_of(node) if r.id != repair.id]
        if any(r.janitor.state in ACTIVE for r in others):
            # another repair of the node (a person's RemediationRequest) is under way: decide after it
            later = self.store.clock() + BUSY_RETRY
            return store.Completion(store.State.PENDING, retry_after=later, fresh=True)  # no failed try
        if self.yield_to and (deferred := self._other_remediator(node)) is not None:
            return deferred
        episode = next((r for r in others if r.user is None and r.remediation.state in ACTIVE), None)
        if repair.user is not None and episode is not None:  # a failed request: the episode escalates
            self.store.set_repair_result(repair.id, f"escalation left to repair {episode.id}")
            return store.State.DONE
        faults = self.store.open_fatal_faults(node)
        if self.attribution is not None:  # only faults whose writer is proven ask for a repair
            faults, refused = self.attribution.split(faults)
            if not faults and any(v.retry for _, v in refused):  # its agent's key is not on the Node yet
                later = self.store.clock() + BUSY_RETRY
                return store.Completion(store.State.PENDING, retry_after=later, fresh=True)
            if not faults and refused:
                self.store.set_repair_result(repair.id, "refused: no fault whose writer is proven")
                self.metrics.actions.labels(result="refused").inc()
                return store.State.DONE
        # announced cloud maintenance: the provider does what its action says; faultline only drains
        provided = [f for f in faults if f.metadata.get("repair") == PROVIDER_REPAIR]
        faults = [f for f in faults if f.metadata.get("repair") != PROVIDER_REPAIR]
        if not faults:
            why = "left to the cloud provider's maintenance" if provided else "faults resolved before repair"
            self.store.set_repair_result(repair.id, why)
            return store.State.DONE
        worst = max(faults, key=lambda d: _SEVERITY[Action(d.action)])
        keys = sorted(d.id for d in faults)
        gpus = sorted({d.entity.id for d in faults if d.entity.type == "GPU"})
        now = self.store.clock()
        past = history(self.store, node)
        decision = remedies.decide(Action(worst.action), keys, past, self.settings.caps, now)
        if decision.step is None:
            self.store.set_repair_result(repair.id, decision.reason)
            return store.State.DONE
        round_ = len(repair.rounds) + 1
        name = request_name(node, repair.episode, round_)
        if repair.user is not None:  # after a person's request: named by its uid (it has no episode)
            name = bounds.clip(f"{node}-{repair.user.uid[:UNIQUE_PART]}-{round_}", bounds.OBJECT_NAME)
        record = store.RepairRound(step=decision.step, request=name, fault_keys=keys, gpus=gpus,
                                   reason=decision.reason, requested_at=now)  # fmt: skip
        if self.settings.template is not None:
            record.external, record.timeout = True, self.settings.external_timeout.total_seconds()
        if self._needs_whole_node(repair, decision.step, gpus):
            return WAIT_DRAIN
        if decision.step == remedies.CONTACT_SUPPORT:
            return self._contact_support(repair, record, decision, keys)
        what = self._request(name, node, decision, keys, gpus, round_)
        self.store.add_round(repair.id, record)
        common.post_event(self.api, node, reason="FaultlineRemediationRequested",
                          note=f"{decision.step} ({decision.reason}); {what}", action="Remediate",
                          warning=False, worker=WORKER, owner=self.owner)  # fmt: skip
        self.metrics.actions.labels(result=decision.step.lower()).inc()
        return store.Completion(then=store.HandOver.TO_JANITOR)  # the hand-over, set when this claim closes

    def _contact_support(
        self, repair: store.Repair, record: store.RepairRound, decision: remedies.Decision, keys: list[str]
    ) -> common.Outcome:
        """No automatic repair left: the round is recorded as ContactSupport with its RMA evidence kept, and
        the node's condition and an Event say so (the node stays held)."""
        node, now = repair.node, record.requested_at or self.store.clock()
        record.outcome, record.at = RepairOutcome.CONTACT_SUPPORT, now
        # the evidence first: a failure after the round is added would add it again on the retry
        kept = rma.keep(self.store, repair, len(repair.rounds), record, decision.reason)
        evidence = kept or "not kept (see the remediation log)"
        self.store.add_round(repair.id, record, result="contact support")
        message = (f"no automatic repair left: {decision.reason}; RMA evidence {evidence} "
                   f"(faultline rma {node}); faults {', '.join(keys)}")  # fmt: skip
        kube.nodes.write_conditions(self.api, node, [{
            "type": CONDITION, "status": "False", "reason": "ContactSupport",
            "message": bounds.clip(message, conditions.MESSAGE_LIMIT),
        }], [])  # fmt: skip
        note = f"{decision.reason}; RMA evidence {evidence}"
        common.post_event(
            self.api, node, reason="FaultlineContactSupport", note=note,
            action="Remediate", warning=True, worker=WORKER, owner=self.owner,
        )  # fmt: skip
        self.metrics.actions.labels(result="contact-support").inc()
        return store.State.DONE

    def _other_remediator(self, node: str) -> common.Outcome | None:
        """While the Node carries another system's marker (`yield_to`), no round: the node stays held and
        the claim looks again after YIELD_RETRY; the condition FaultlineRemediation says why."""
        try:
            obj = kube.nodes.read(self.api, node)
        except NotFoundError:
            return None  # gone: the round finds no Node either way, as before
        marker = others.present(obj, self.yield_to)
        current = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}.get(CONDITION)
        if marker is None:
            if (current or {}).get("reason") == "OtherRemediator":  # the other system is done: not any more
                kube.nodes.write_conditions(self.api, node, [], [CONDITION])
            return None
        message = f"another system is acting on this node ({marker}): held, and no repair meanwhile"
        if (current or {}).get("reason") != "OtherRemediator" or (current or {}).get("message") != message:
            kube.nodes.write_conditions(self.api, node, [{
                "type": CONDITION, "status": "False", "reason": "OtherRemediator", "message": message,
            }], [])  # fmt: skip
            common.post_event(self.api, node, reason="FaultlineRemediationDeferred", note=message,
                              action="Remediate", warning=False, worker=WORKER, owner=self.owner)  # fmt: skip
        log.info("repair deferred to another system", extra={"node": node, "reason": str(marker)})
        self.metrics.actions.labels(result="deferred").inc()
        later = self.store.clock() + YIELD_RETRY
        return store.Completion(store.State.PENDING, retry_after=later, fresh=True)

    def _needs_whole_node(self, repair: store.Repair, step: RepairStep, gpus: list[str]) -> bool:
        """After a partial drain of this episode, a step other than a reset of the drained GPUs widens
        the drain to the whole node (the claim then waits in WAIT_DRAIN for it)."""
        if not self.settings.require_drain:
            return False
        drain = self.store.drain(repair.node)
        if drain is None or drain.episode != repair.episode or drain.scope != "gpus":
            return False
        if step == remedies.GPU_RESET and set(gpus) <= set(drain.gpus):
            return False
        if step != remedies.GPU_RESET:
            why = f"{step} needs the whole node"
        else:
            why = f"GPU_RESET of {', '.join(gpus)}: more GPUs than the partial drain moved pods from"
        if repair.episode is not None:
            self.store.widen_drain(repair.node, repair.episode, why)
        common.post_event(
            self.api, repair.node, reason="FaultlineDrainWidened", note=f"{why}: draining it first",
            action="Remediate", warning=False, worker=WORKER, owner=self.owner,
        )  # fmt: skip
        self.metrics.actions.labels(result="drain-widened").inc()
        return True

    def _request(self, name: str, node: str, decision: remedies.Decision, keys: list[str], gpus: list[str],
                 round_: int) -> str:  # fmt: skip
        """Write the request (a RemediationRequest, or the template's CR); say which."""
        reason = bounds.clip(decision.reason, bounds.REQUEST_TEXT)
        if self.settings.template is not None:
            values = {"name": name, "node": node, "action": decision.step, "gpus": gpus, "faultKeys": keys,
                      "reason": reason}  # fmt: skip
            custom = templates.render(self.settings.template, values)
            with contextlib.suppress(ConflictError):  # written already by this claim's earlier holder
                kube.resources.create_object(self.api, custom)
            return f"{custom['kind']} {custom['metadata']['name']}"
        body: dict[str, Any] = {
            "apiVersion": kube.resources.RR_API_VERSION, "kind": "RemediationRequest",
            "metadata": {"name": name, "labels": {"faultline.io/node": node}},
            "spec": {"node": node, "action": decision.step, "gpus": gpus, "reason": reason,
                     "faultKeys": keys, "step": round_},
        }  # fmt: skip
        with contextlib.suppress(ConflictError):  # already written by this claim's earlier holder: the same
            kube.resources.create_request(self.api, body)
        return f"request {name}"

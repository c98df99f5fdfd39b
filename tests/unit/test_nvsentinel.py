"""NVSentinel-compatible ingest without the network: the proto keeps NVSentinel's wire contract (names and
numbers, notes/nvsentinel-proto.md), every enum value maps to a stated faultline action and unknown
numbers are refused by field, each bad field is named, the entity and code a fault is on, and the
check-level "healthy" of NVSentinel's monitors resolving every code its check opened, across a restart."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor, empty_pb2
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from faultline.api import nvsentinel_pb2 as pb
from faultline.api import nvsentinel_pb2_grpc as pb_grpc
from patterns import compiler, loader
from patterns.detectors import NodeDetector
from sources import ingest, nvsentinel, nvsentinel_server
from sources.ingest import InvalidEventError
from tests.unit.fuzzing import fuzz

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
NODE = "gpu-node-01"
UUID = "GPU-5c2b1a7e-0d1f-4c3e-9a77-1b2c3d4e5f60"


def event(**overrides: Any) -> pb.HealthEvent:
    """An XID 79 as NVSentinel's syslog monitor reports it."""
    fields: dict[str, Any] = {
        "version": 1, "agent": "syslog-health-monitor", "componentClass": "GPU",
        "checkName": "SysLogsXIDError", "isFatal": True, "isHealthy": False,
        "message": "GPU has fallen off the bus", "recommendedAction": pb.RESTART_BM, "errorCode": ["79"],
        "entitiesImpacted": [pb.Entity(entityType="PCI", entityValue="0000:9a:00"),
                             pb.Entity(entityType="GPU", entityValue=UUID)],
        "metadata": {"JOURNAL_MESSAGE": "NVRM: Xid (PCI:0000:9a:00): 79, pid=0"}, "nodeName": NODE,
    }  # fmt: skip
    fields.update(overrides)
    e = pb.HealthEvent(**{k: v for k, v in fields.items() if k != "generatedTimestamp"})
    e.generatedTimestamp.FromDatetime(fields.get("generatedTimestamp", NOW - dt.timedelta(seconds=5)))
    return e


def dcgm(**overrides: Any) -> pb.HealthEvent:
    """A DCGM memory watch failure as NVSentinel's GPU monitor reports it (index, PCI, UUID)."""
    fields: dict[str, Any] = {
        "agent": "gpu-health-monitor", "checkName": "GpuMemWatch", "errorCode": ["DCGM_FR_VOLATILE_DBE_DETECTED"],
        "recommendedAction": pb.COMPONENT_RESET, "processingStrategy": pb.EXECUTE_REMEDIATION, "metadata": {},
        "entitiesImpacted": [pb.Entity(entityType="GPU", entityValue="1"),
                             pb.Entity(entityType="PCI", entityValue="00000000:9B:00.0"),
                             pb.Entity(entityType="GPU_UUID", entityValue=UUID)],
    }  # fmt: skip
    fields.update(overrides)
    return event(**fields)


def one(e: pb.HealthEvent) -> nvsentinel.Report:
    (report,) = nvsentinel.validate(pb.HealthEvents(version=1, events=[e]), NODE, NOW)
    return report


# -- the wire contract -------------------------------------------------------------------------------------
# The facts of notes/nvsentinel-proto.md: NVIDIA/NVSentinel data-models/protobufs/health_event.proto.
FIELDS = {
    "HealthEvents": {"version": 1, "events": 2},
    "Entity": {"entityType": 1, "entityValue": 2},
    "BehaviourOverrides": {"force": 1, "skip": 2},
    "HealthEvent": {
        "version": 1, "agent": 2, "componentClass": 3, "checkName": 4, "isFatal": 5, "isHealthy": 6,
        "message": 7, "recommendedAction": 8, "errorCode": 9, "entitiesImpacted": 10, "metadata": 11,
        "generatedTimestamp": 12, "nodeName": 13, "quarantineOverrides": 14, "drainOverrides": 15,
        "processingStrategy": 16, "id": 17, "customRecommendedAction": 18,
    },
}  # fmt: skip
RECOMMENDED_ACTIONS = {"NONE": 0, "COMPONENT_RESET": 2, "CONTACT_SUPPORT": 5, "RUN_FIELDDIAG": 6, "RESTART_VM": 15,
                       "RESTART_BM": 24, "REPLACE_VM": 25, "RUN_DCGMEUD": 26, "CUSTOM": 27, "REMEDIATE": 28,
                       "RESTART_APP": 39, "UNKNOWN": 99}  # fmt: skip
PROCESSING_STRATEGIES = {"UNSPECIFIED": 0, "EXECUTE_REMEDIATION": 1, "STORE_ONLY": 2, "STORE_AND_ANALYSE": 3}


def test_the_proto_keeps_nvsentinels_wire_contract() -> None:
    file = pb.DESCRIPTOR
    assert file.package == "datamodels"
    method = file.services_by_name["PlatformConnector"].methods_by_name["HealthEventOccurredV1"]
    assert (method.input_type.full_name, method.output_type.full_name) == (
        "datamodels.HealthEvents", "google.protobuf.Empty"
    )  # fmt: skip
    assert not (method.client_streaming or method.server_streaming)
    for message, fields in FIELDS.items():
        got = {f.name: f.number for f in file.message_types_by_name[message].fields}
        assert got == fields, message
    fd = descriptor.FieldDescriptor
    kinds = {"version": fd.TYPE_UINT32, "isFatal": fd.TYPE_BOOL, "isHealthy": fd.TYPE_BOOL,
             "recommendedAction": fd.TYPE_ENUM, "processingStrategy": fd.TYPE_ENUM}  # fmt: skip
    for f in file.message_types_by_name["HealthEvent"].fields:
        assert f.type == kinds.get(f.name, fd.TYPE_MESSAGE if f.message_type else fd.TYPE_STRING), f.name
        assert f.is_repeated == (f.name in ("errorCode", "entitiesImpacted", "metadata")), f.name
    event_fields = file.message_types_by_name["HealthEvent"].fields_by_name
    assert event_fields["metadata"].message_type.GetOptions().map_entry
    assert event_fields["generatedTimestamp"].message_type.full_name == "google.protobuf.Timestamp"
    assert event_fields["quarantineOverrides"].message_type.full_name == "datamodels.BehaviourOverrides"
    assert event_fields["entitiesImpacted"].message_type.full_name == "datamodels.Entity"
    assert {v.name: v.number for v in pb.RecommendedAction.DESCRIPTOR.values} == RECOMMENDED_ACTIONS
    assert {v.name: v.number for v in pb.ProcessingStrategy.DESCRIPTOR.values} == PROCESSING_STRATEGIES


def test_every_enum_value_is_mapped_and_named_as_in_the_proto() -> None:
    assert {name: n for n, (name, _) in nvsentinel.ACTIONS.items()} == RECOMMENDED_ACTIONS
    assert {name: n for n, (name, _) in nvsentinel.STRATEGIES.items()} == PROCESSING_STRATEGIES


# -- the mapping -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("NONE", "NONE"),
        ("COMPONENT_RESET", "COMPONENT_RESET"),
        ("CONTACT_SUPPORT", "CONTACT_SUPPORT"),
        ("RUN_FIELDDIAG", "CONTACT_SUPPORT"),
        ("RESTART_VM", "RESTART_VM"),
        ("RESTART_BM", "RESTART_BM"),
        ("REPLACE_VM", "REPLACE_VM"),
        ("RUN_DCGMEUD", "CONTACT_SUPPORT"),
        ("CUSTOM", "CONTACT_SUPPORT"),
        ("REMEDIATE", "CONTACT_SUPPORT"),
        ("RESTART_APP", "RESTART_APP"),
        ("UNKNOWN", "CONTACT_SUPPORT"),
    ],
)
def test_each_recommended_action(action: str, expected: str) -> None:
    report = one(
        event(recommendedAction=pb.RecommendedAction.Value(action), customRecommendedAction="site-x")
    )
    assert (report.record["action"], report.record["fatal"]) == (expected, True)
    assert report.record["metadata"]["nvsentinel_recommended_action"] == action


@pytest.mark.parametrize(
    ("strategy", "fatal", "action"),
    [
        ("UNSPECIFIED", True, "RESTART_BM"),
        ("EXECUTE_REMEDIATION", True, "RESTART_BM"),
        ("STORE_ONLY", False, "NONE"),
        ("STORE_AND_ANALYSE", False, "NONE"),
    ],
)
def test_each_processing_strategy(strategy: str, fatal: bool, action: str) -> None:
    report = one(event(processingStrategy=pb.ProcessingStrategy.Value(strategy)))
    assert (report.record["fatal"], report.record["action"]) == (fatal, action)
    assert report.record["metadata"]["nvsentinel_processing_strategy"] == strategy
    assert report.record["metadata"]["nvsentinel_fatal"] == "true"  # what the monitor said stays


def test_quarantine_overrides() -> None:
    skipped = one(event(quarantineOverrides=pb.BehaviourOverrides(skip=True))).record
    assert (skipped["fatal"], skipped["action"]) == (False, "NONE")
    forced = one(event(isFatal=False, quarantineOverrides=pb.BehaviourOverrides(force=True))).record
    assert (forced["fatal"], forced["action"]) == (True, "RESTART_BM")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"recommendedAction": 7}, "events[1].recommendedAction"),  # a number NVSentinel never defined
        ({"recommendedAction": 100}, "events[1].recommendedAction"),
        ({"processingStrategy": 4}, "events[1].processingStrategy"),
        ({"version": 2}, "events[1].version"),
        ({"nodeName": "gpu-node-02"}, "events[1].nodeName"),
        ({"nodeName": ""}, "events[1].nodeName"),
        ({"agent": ""}, "events[1].agent"),
        ({"checkName": "xid check"}, "events[1].checkName"),
        ({"componentClass": "TOASTER"}, "events[1].componentClass"),
        ({"componentClass": ""}, "events[1].componentClass"),
        ({"errorCode": ["79", "bad code"]}, "events[1].errorCode[1]"),
        ({"errorCode": ["X" * 65]}, "events[1].errorCode[0]"),
        ({"errorCode": ["9" * 64]}, "events[1].errorCode[0]"),  # 68 with its XID- prefix
        ({"errorCode": [str(i) for i in range(17)]}, "events[1].errorCode"),
        ({"entitiesImpacted": [pb.Entity(entityType="PCI", entityValue="")]}, "events[1].entitiesImpacted[0].entityValue"),
        ({"entitiesImpacted": [pb.Entity(entityType="NVLINK5", entityValue="1")]}, "events[1].entitiesImpacted[0].entityType"),
        ({"entitiesImpacted": [pb.Entity(entityType="GPU", entityValue=str(i)) for i in range(17)]}, "events[1].entitiesImpacted"),
        ({"message": "x" * 4097}, "events[1].message"),
        ({"metadata": {"a.b": "1"}}, "events[1].metadata['a.b']"),
        ({"metadata": {"k": "v" * 1025}}, "events[1].metadata['k']"),
        ({"metadata": {f"k{i}": "v" for i in range(33)}}, "events[1].metadata"),
        ({"generatedTimestamp": NOW + dt.timedelta(minutes=6)}, "events[1].generatedTimestamp"),
        ({"generatedTimestamp": NOW - dt.timedelta(days=8)}, "events[1].generatedTimestamp"),
        ({"id": "i" * 129}, "events[1].id"),
        ({"customRecommendedAction": "c" * 129}, "events[1].customRecommendedAction"),
        ({"quarantineOverrides": pb.BehaviourOverrides(force=True, skip=True)}, "events[1].quarantineOverrides"),
        ({"quarantineOverrides": pb.BehaviourOverrides(force=True), "processingStrategy": pb.STORE_ONLY},
         "events[1].quarantineOverrides.force"),
        ({"drainOverrides": pb.BehaviourOverrides(force=True)}, "events[1].drainOverrides.force"),
        ({"drainOverrides": pb.BehaviourOverrides(skip=True)}, "events[1].drainOverrides.skip"),
    ],
)  # fmt: skip
def test_each_rule_names_the_field(overrides: dict[str, Any], field: str) -> None:
    batch = pb.HealthEvents(version=1, events=[event(), event(**overrides)])
    with pytest.raises(InvalidEventError) as info:
        nvsentinel.validate(batch, NODE, NOW)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_batch_rules_and_a_missing_time() -> None:
    bare = event()
    bare.ClearField("generatedTimestamp")
    with pytest.raises(InvalidEventError, match=r"^events\[0\]\.generatedTimestamp: required"):
        nvsentinel.validate(pb.HealthEvents(events=[bare]), NODE, NOW)
    for count in (0, 1001):
        with pytest.raises(InvalidEventError, match=r"^events: a batch holds 1 to 1000"):
            nvsentinel.validate(pb.HealthEvents(events=[event()] * count), NODE, NOW)
    with pytest.raises(InvalidEventError, match=r"^version: 3 is not"):
        nvsentinel.validate(pb.HealthEvents(version=3, events=[event()]), NODE, NOW)
    assert nvsentinel.validate(pb.HealthEvents(events=[event(version=0)]), NODE, NOW)  # 0: unset


@pytest.mark.parametrize(
    ("e", "entity"),
    [
        (event(), ("GPU", "0000:9a:00")),  # syslog XID: PCI first, then the UUID
        (dcgm(), ("GPU", "0000:9b:00")),  # DCGM: index, nvidia-smi's PCI address, UUID
        (dcgm(entitiesImpacted=[pb.Entity(entityType="GPU", entityValue="1"),
                                pb.Entity(entityType="gpu_uuid", entityValue=UUID)]), ("GPU", UUID)),
        (dcgm(entitiesImpacted=[pb.Entity(entityType="GPU", entityValue="1")]), ("GPU", "1")),
        (event(componentClass="NVSwitch", checkName="SysLogsSXIDError", errorCode=["24007"],
               entitiesImpacted=[pb.Entity(entityType="NVSWITCH", entityValue="2"),
                                 pb.Entity(entityType="PCI", entityValue="0000:c3:00.0"),
                                 pb.Entity(entityType="NVLINK", entityValue="28")]), ("NVSWITCH", "0000:c3:00")),
        (event(componentClass="NIC", entitiesImpacted=[pb.Entity(entityType="NIC", entityValue="mlx5_0"),
                                                       pb.Entity(entityType="PCI", entityValue="0000:17:00.0")]),
         ("NIC", "mlx5_0")),
        (event(componentClass="NODE", entitiesImpacted=[]), None),
    ],
)  # fmt: skip
def test_the_entity_a_fault_is_on(e: pb.HealthEvent, entity: tuple[str, str] | None) -> None:
    record = one(e).record
    assert record["entities"] == ([{"type": entity[0], "id": entity[1]}] if entity else [])
    sent = ",".join(f"{x.entityType}={x.entityValue}" for x in e.entitiesImpacted)
    assert record["metadata"].get("nvsentinel_entities", "") == sent


@pytest.mark.parametrize(
    ("e", "codes"),
    [
        (event(), ("XID-79",)),
        (event(checkName="SysLogsSXIDError", errorCode=["24007", "sxid-extra"]), ("SXID-24007", "SXID-EXTRA")),
        (dcgm(errorCode=["dcgm_fr_x", "DCGM_FR_X", "DCGM_FR_Y"]), ("DCGM_FR_X", "DCGM_FR_Y")),
        (event(checkName="SysLogsGPUFallenOff", errorCode=["GPU_FALLEN_OFF_BUS"]), ("GPU_FALLEN_OFF_BUS",)),
        (event(checkName="Other", errorCode=["79"]), ("79",)),  # a bare number of another check stays
        (event(checkName="nccl/allreduce:bw", errorCode=[]), ("NCCL-ALLREDUCE-BW",)),  # none: the check's
        (event(isHealthy=True, errorCode=[]), ()),  # healthy, no code: the whole check (see plan)
    ],
)  # fmt: skip
def test_codes(e: pb.HealthEvent, codes: tuple[str, ...]) -> None:
    assert one(e).codes == codes


def test_a_healthy_event_neither_fatal_nor_acting() -> None:
    record = one(event(isHealthy=True, isFatal=True)).record
    assert (record["healthy"], record["fatal"], record["action"]) == (True, False, "NONE")


# -- check-level clears ------------------------------------------------------------------------------------
def records(reports: list[nvsentinel.Report], table: dict[Any, Any] | None = None, **caps: int) -> Any:
    limits = {"max_keys": 10, "max_codes": 10, **caps}
    return nvsentinel.plan(reports, table or {}, **limits)


def test_a_check_passing_resolves_every_code_it_opened_on_that_entity() -> None:
    fail_x, fail_y = one(dcgm(errorCode=["DCGM_FR_X"])), one(dcgm(errorCode=["DCGM_FR_Y"]))
    other_gpu = one(dcgm(entitiesImpacted=[pb.Entity(entityType="PCI", entityValue="0000:3b:00")]))
    other_agent = one(dcgm(agent="site-monitor"))
    passing = one(dcgm(isHealthy=True, errorCode=[], isFatal=False, recommendedAction=pb.NONE))
    out, table = records([fail_x, fail_y, other_gpu, other_agent, passing])
    clears = [(r["code"], r["entities"][0]["id"]) for r in out if r["healthy"]]
    assert clears == [("DCGM_FR_X", "0000:9b:00"), ("DCGM_FR_Y", "0000:9b:00")]
    assert set(table) == {other_gpu.key, other_agent.key}  # what it did not pass stays open

    one_code = one(dcgm(isHealthy=True, errorCode=["DCGM_FR_X"]))
    out, table = records([fail_x, fail_y, one_code])
    assert [r["code"] for r in out if r["healthy"]] == ["DCGM_FR_X"]
    assert table == {fail_x.key: ("DCGM_FR_Y",)}
    out, table = records([passing])  # a check that never failed here: nothing to resolve
    assert (out, table) == ([], {})


def test_the_index_is_bounded() -> None:
    reports = [one(dcgm(checkName=f"Watch{i}")) for i in range(5)]
    _, table = records(reports, max_keys=3)
    assert [k[1] for k in table] == ["Watch2", "Watch3", "Watch4"]  # the most recently failing
    _, table = records([one(dcgm(errorCode=[f"C{i}"])) for i in range(5)], max_codes=2)
    assert list(table.values()) == [("C3", "C4")]


def test_the_index_survives_a_restart_and_a_refused_append(tmp_path: Path) -> None:
    spool = ingest.IngestSpool(tmp_path / "ingest")
    path = spool.directory / "nvsentinel-checks.json"
    index = nvsentinel.CheckIndex(path)
    assert index.accept([one(dcgm(errorCode=["DCGM_FR_X", "DCGM_FR_Y"]))], spool.append) == 2
    restarted = nvsentinel.CheckIndex(path)
    passing = one(dcgm(isHealthy=True, errorCode=[]))

    def refuse(_: list[dict[str, Any]]) -> None:
        raise ingest.SpoolFullError("full")

    with pytest.raises(ingest.SpoolFullError):
        restarted.accept([passing], refuse)  # nothing appended: the codes must stay resolvable
    assert json.loads(path.read_text())["open"] == [[*passing.key, ["DCGM_FR_X", "DCGM_FR_Y"]]]
    assert nvsentinel.CheckIndex(path).accept([passing], spool.append) == 2
    assert json.loads(path.read_text())["open"] == []
    appended = [r for _, r in spool.read(0, 0)[2]]
    assert [(r["code"], r["healthy"]) for r in appended] == [
        ("DCGM_FR_X", False), ("DCGM_FR_Y", False), ("DCGM_FR_X", True), ("DCGM_FR_Y", True)
    ]  # fmt: skip


def test_an_unreadable_index_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "nvsentinel-checks.json"
    path.write_text("{not json")
    assert nvsentinel.CheckIndex(path).table == {}


def test_records_become_faults_through_the_ingest_pack() -> None:
    """What the agent's flow does with the spooled records: the same lines and pack as faultline's
    own ingest; NVSentinel's check-level healthy resolves the DCGM fault, the XID stays."""
    compiled = compiler.compile_packs(loader.load([]))
    detector = NodeDetector(NODE, compiled)
    batch = [event(), dcgm(), event(componentClass="NODE", checkName="CspMaintenance", errorCode=[],
                                    entitiesImpacted=[], processingStrategy=pb.STORE_ONLY)]  # fmt: skip
    passing = dcgm(isHealthy=True, isFatal=False, errorCode=[], recommendedAction=pb.NONE)
    out, table = records(nvsentinel.validate(pb.HealthEvents(version=1, events=batch), NODE, NOW))
    later, _ = records(nvsentinel.validate(pb.HealthEvents(version=1, events=[passing]), NODE, NOW), table)
    for i, record in enumerate(out + later):
        for line in ingest.lines(record):
            for hit in compiled.match("grpc", line):
                detector.observe(100.0 + i, hit, line)
    got = {(f.entity.type, f.entity.id, f.code, f.component.value, f.fatal, f.action.value, f.state.value)
           for f in detector.snapshot_faults()}  # fmt: skip
    assert got == {
        ("GPU", "0000:9a:00", "XID-79", "GPU", True, "RESTART_BM", "open"),
        ("GPU", "0000:9b:00", "DCGM_FR_VOLATILE_DBE_DETECTED", "GPU", True, "COMPONENT_RESET", "resolved"),
        ("NODE", "", "CSPMAINTENANCE", "NODE", False, "NONE", "open"),
    }


# -- the server, in process --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served() -> Iterator[tuple[grpc.Channel, ingest.IngestSpool, Path]]:
    with tempfile.TemporaryDirectory() as name:  # short: a Unix socket path has ~100 bytes
        spool = ingest.IngestSpool(Path(name) / "spool")
        sock = Path(name) / "nvs" / "nvsentinel.sock"
        server = nvsentinel_server.serve(NODE, spool, sock)
        try:
            with grpc.insecure_channel(f"unix:{sock}") as channel:
                yield channel, spool, sock
        finally:
            server.stop(None).wait(10)


def now_event(**overrides: Any) -> pb.HealthEvent:
    return event(generatedTimestamp=dt.datetime.now(dt.UTC), **overrides)


def test_the_server_keeps_a_batch_before_it_answers_and_refuses_a_bad_one_whole(
    served: tuple[grpc.Channel, ingest.IngestSpool, Path],
) -> None:
    channel, spool, sock = served
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    stub = pb_grpc.PlatformConnectorStub(channel)
    appends = spool.appends
    with pytest.raises(grpc.RpcError) as info:
        stub.HealthEventOccurredV1(
            pb.HealthEvents(version=1, events=[now_event(), now_event(recommendedAction=3)])
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("events[1].recommendedAction: 3 is not one of NONE=0, ")
    assert spool.appends == appends  # nothing of it kept
    reply = stub.HealthEventOccurredV1(
        pb.HealthEvents(version=1, events=[now_event(), now_event(errorCode=["48"])])
    )
    assert reply == empty_pb2.Empty()
    kept = [r for _, r in spool.read(0, 0)[2]]  # on disk when the call returned
    assert [(r["code"], r["entities"], r["action"]) for r in kept[-2:]] == [
        ("XID-79", [{"type": "GPU", "id": "0000:9a:00"}], "RESTART_BM"),
        ("XID-48", [{"type": "GPU", "id": "0000:9a:00"}], "RESTART_BM"),
    ]


@fuzz(200)
@given(st.binary(max_size=200))
def test_the_server_answers_any_bytes_with_ok_or_invalid_argument(
    served: tuple[grpc.Channel, ingest.IngestSpool, Path], data: bytes
) -> None:
    channel, _, _ = served
    raw = channel.unary_unary(f"/{nvsentinel_server.SERVICE}/{nvsentinel_server.METHOD}")
    answer: tuple[grpc.StatusCode, str] | None = None
    try:
        raw(data, timeout=10)
    except grpc.RpcError as exc:
        answer = (exc.code(), exc.details())
    if answer is None:  # accepted: it decodes to events this node takes (arbitrary bytes hardly ever do)
        assert pb.HealthEvents.FromString(data).events
        return
    assert answer[0] == grpc.StatusCode.INVALID_ARGUMENT, answer
    try:
        pb.HealthEvents.FromString(data)
    except DecodeError:
        assert answer[1].startswith("request: not a HealthEvents ("), answer

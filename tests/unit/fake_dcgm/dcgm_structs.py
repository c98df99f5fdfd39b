"""A stand-in for DCGM's `dcgm_structs` binding (constants and the health response shape), for tests."""

from __future__ import annotations

from dataclasses import dataclass, field

DCGM_OPERATION_MODE_AUTO = 1
DCGM_GROUP_DEFAULT = 0
DCGM_GROUP_EMPTY = 1
DCGM_DIAG_LVL_SHORT = 10
DCGM_DIAG_LVL_MED = 20
DCGM_DIAG_LVL_LONG = 30
DCGM_DIAG_LVL_XLONG = 40
DCGM_DIAG_RESULT_PASS = 0
DCGM_DIAG_RESULT_SKIP = 1
DCGM_DIAG_RESULT_WARN = 2
DCGM_DIAG_RESULT_FAIL = 3
DCGM_DIAG_RESULT_NOT_RUN = 4
DCGM_HEALTH_WATCH_PCIE = 0x1
DCGM_HEALTH_WATCH_NVLINK = 0x2
DCGM_HEALTH_WATCH_PMU = 0x4
DCGM_HEALTH_WATCH_MCU = 0x8
DCGM_HEALTH_WATCH_MEM = 0x10
DCGM_HEALTH_WATCH_SM = 0x20
DCGM_HEALTH_WATCH_INFOROM = 0x40
DCGM_HEALTH_WATCH_THERMAL = 0x80
DCGM_HEALTH_WATCH_POWER = 0x100
DCGM_HEALTH_WATCH_DRIVER = 0x200
DCGM_HEALTH_WATCH_NVSWITCH_NONFATAL = 0x400
DCGM_HEALTH_WATCH_NVSWITCH_FATAL = 0x800
DCGM_HEALTH_RESULT_PASS = 0
DCGM_HEALTH_RESULT_WARN = 10
DCGM_HEALTH_RESULT_FAIL = 20


@dataclass
class ErrorDetail:
    msg: bytes = b""
    code: int = 0


@dataclass
class EntityPair:
    entityGroupId: int = 1  # noqa: N815 - DCGM's field names
    entityId: int = 0  # noqa: N815


@dataclass
class Incident:
    system: int
    health: int
    error: ErrorDetail
    entityInfo: EntityPair  # noqa: N815


@dataclass
class HealthResponse:
    overallHealth: int = 0  # noqa: N815
    incidentCount: int = 0  # noqa: N815
    incidents: list[Incident] = field(default_factory=list)


@dataclass
class DiagTestRun:
    """c_dcgmDiagTestRun_v2's fields the backend reads."""

    name: bytes
    result: int
    numErrors: int = 0  # noqa: N815
    errorIndices: list[int] = field(default_factory=list)  # noqa: N815


@dataclass
class DiagError:
    """c_dcgmDiagError_v1's fields the backend reads."""

    entity: EntityPair
    code: int
    msg: bytes


@dataclass
class DiagResponse:
    """The shape of c_dcgmDiagResponse_v12 (DCGM 4): tests, and the errors they index."""

    numTests: int = 0  # noqa: N815
    tests: list[DiagTestRun] = field(default_factory=list)
    numErrors: int = 0  # noqa: N815
    errors: list[DiagError] = field(default_factory=list)

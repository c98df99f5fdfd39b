"""A stand-in for DCGM's `dcgm_structs` binding (constants and the health response shape), for tests."""

from __future__ import annotations

from dataclasses import dataclass, field

DCGM_OPERATION_MODE_AUTO = 1
DCGM_GROUP_DEFAULT = 0
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

"""A stand-in for DCGM's `pydcgm` binding (DcgmHandle, DcgmGroup with health watches), for tests."""

from __future__ import annotations

from typing import Any

import dcgm_agent
import dcgm_structs


class DcgmHandle:
    def __init__(self, ipAddress: str = "", opMode: int = 0) -> None:  # noqa: N803 - DCGM's names
        dcgm_agent.STATE["connected"] = ipAddress
        self.handle = 1

    def Shutdown(self) -> None:
        dcgm_agent.STATE["connected"] = None


class _Health:
    def Set(self, systems: int) -> None:
        dcgm_agent.STATE["watches"] = systems

    def Check(self) -> dcgm_structs.HealthResponse:
        incidents = list(dcgm_agent.STATE["incidents"])
        worst = max((i.health for i in incidents), default=0)
        return dcgm_structs.HealthResponse(worst, len(incidents), incidents)


class DcgmGroup:
    def __init__(self, handle: DcgmHandle, groupName: str = "", groupType: int = 0) -> None:  # noqa: N803
        self.health = _Health()

    def AddEntity(self, group: int, entity: int) -> None:
        dcgm_agent.STATE["entities"].append((group, entity))

    def GetGpuIds(self) -> list[int]:
        return list(range(len(dcgm_agent.STATE["gpus"])))

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)

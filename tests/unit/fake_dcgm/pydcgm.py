"""A stand-in for DCGM's `pydcgm` binding (DcgmHandle, DcgmGroup with health watches), for tests."""

from __future__ import annotations

import os
from typing import Any

import dcgm_agent
import dcgm_structs


class DcgmHandle:
    def __init__(self, ipAddress: str = "", opMode: int = 0) -> None:  # noqa: N803 - DCGM's names
        if dcgm_agent.STATE["refuse"]:
            raise ConnectionError(f"host engine connection invalid/disconnected at {ipAddress}")
        dcgm_agent.STATE["connected"] = ipAddress
        self.handle = 1

    def Shutdown(self) -> None:
        dcgm_agent.STATE["connected"] = None


class _Health:
    def Set(self, systems: int) -> None:
        dcgm_agent.STATE["watches"] = systems

    def Check(self) -> dcgm_structs.HealthResponse:
        down = os.environ.get("FAKE_DCGM_DOWN_FILE", "")
        if down and os.path.exists(down):  # the host engine away (restarting, being upgraded)
            raise ConnectionRefusedError("DCGM host engine: connection refused")
        incidents = list(dcgm_agent.STATE["incidents"])
        worst = max((i.health for i in incidents), default=0)
        return dcgm_structs.HealthResponse(worst, len(incidents), incidents)


class _Action:
    def __init__(self, group: DcgmGroup) -> None:
        self.group = group

    def RunDiagnostic(self, diagLevel: int) -> dcgm_structs.DiagResponse:  # noqa: N803
        dcgm_agent.STATE["diag_runs"].append((diagLevel, list(self.group.gpus)))
        answer = dcgm_agent.STATE["diag"]
        if isinstance(answer, Exception):
            raise answer
        return answer or dcgm_structs.DiagResponse()


class DcgmGroup:
    def __init__(self, handle: DcgmHandle, groupName: str = "", groupType: int = 0) -> None:  # noqa: N803
        self.health = _Health()
        self.action = _Action(self)
        self.gpus: list[int] = []
        dcgm_agent.STATE["groups"] += 1

    def AddGpu(self, gpuId: int) -> None:  # noqa: N803
        self.gpus.append(gpuId)

    def Delete(self) -> None:
        dcgm_agent.STATE["groups"] -= 1

    def AddEntity(self, group: int, entity: int) -> None:
        dcgm_agent.STATE["entities"].append((group, entity))

    def GetGpuIds(self) -> list[int]:
        return list(range(len(dcgm_agent.STATE["gpus"])))

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)

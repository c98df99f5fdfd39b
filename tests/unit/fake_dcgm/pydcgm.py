"""A stand-in for DCGM's `pydcgm` binding (DcgmHandle, DcgmGroup with health watches and field values,
DcgmFieldGroup), for tests."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import dcgm_agent
import dcgm_fields
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


class DcgmFieldGroup:
    def __init__(self, dcgmHandle: DcgmHandle, name: str = "", fieldIds: list[int] | None = None) -> None:  # noqa: N803
        self.name = name
        self.fieldIds = list(fieldIds or [])


class _Samples:
    def WatchFields(self, group: DcgmFieldGroup, update_us: int, keep_s: float, keep: int) -> None:
        if dcgm_agent.STATE["refuse_watch"]:
            raise RuntimeError("DCGM_ST_NOT_SUPPORTED")
        dcgm_agent.STATE["watched"] = (list(group.fieldIds), update_us)

    def GetLatest_v2(self, group: DcgmFieldGroup) -> Any:
        """A DcgmFieldValueEntityCollection's shape: .values[entity group][entity][field id] -> series."""
        gpus = {
            gpu: {fid: [SimpleNamespace(value=v, isBlank=v is None)]
                  for fid, v in values.items() if fid in group.fieldIds}
            for gpu, values in dcgm_agent.STATE["values"].items()
        }  # fmt: skip
        return SimpleNamespace(values={dcgm_fields.DCGM_FE_GPU: gpus} if gpus else {})


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
        self.samples = _Samples()
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

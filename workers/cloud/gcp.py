"""Google Cloud: the Compute Engine API v1, with a token from the metadata server.

    reboot   instances.reset (a hard reset: the node keeps its name and disks)
    replace  for an instance of a managed instance group (a GKE node pool), the group's recreateInstances:
             a new VM under the same name, placed anew; any other instance is deleted
Both wait for the zone operation to finish. For the maintenance monitor, `zone_instances` lists a zone's
instances with their `scheduling` and `upcomingMaintenance` (one paged call per zone).

The token comes from the metadata server (the node's service account, or the workload identity
federation GKE serves there); GCE_METADATA_HOST overrides its address. The service account needs
compute.instances.reset, .get, .delete and compute.instanceGroupManagers.update
(roles/compute.instanceAdmin.v1 is enough); the maintenance monitor, compute.instances.list only
(roles/compute.viewer).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import requests

from workers import cloud

API = "https://compute.googleapis.com/compute/v1"
LIST_FIELDS = "items(name,scheduling,upcomingMaintenance),nextPageToken"


@dataclass(frozen=True)
class Settings:
    endpoint: str = API  # the Compute API base, up to /compute/v1
    metadata_host: str = ""  # "": GCE_METADATA_HOST, else metadata.google.internal
    operation_timeout: float = 600.0  # seconds to wait for a zone operation
    poll: float = 2.0
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


class GCP:
    name = "gcp"

    def __init__(self, settings: Settings, *, session: requests.Session | None = None) -> None:
        self.settings = settings
        self.session = session or requests.Session()
        self.tokens = cloud.TokenCache(self._token)

    def _token(self) -> tuple[str, float]:
        host = (
            self.settings.metadata_host
            or self.settings.env.get("GCE_METADATA_HOST")
            or "metadata.google.internal"
        )
        url = f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token"
        body = cloud.call(self.session, "GET", url, what="GCP metadata server token",
                          headers={"Metadata-Flavor": "Google"}).json()  # fmt: skip
        return str(body["access_token"]), float(body.get("expires_in", 300))

    def _call(self, method: str, path: str, what: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = path if path.startswith("http") else f"{self.settings.endpoint.rstrip('/')}/{path.lstrip('/')}"
        headers = {"Authorization": f"Bearer {self.tokens.get()}"}
        r = cloud.call(self.session, method, url, what=what, headers=headers, json=body)
        out: dict[str, Any] = r.json() if r.content else {}
        return out

    def _wait(self, op: dict[str, Any], inst: cloud.Instance, what: str) -> str:
        zone_ops = f"projects/{inst.project}/zones/{inst.zone}/operations/{op.get('name')}"

        def done() -> str | None:
            nonlocal op
            if op.get("status") != "DONE":
                op = self._call("GET", zone_ops, f"{what}: operation {op.get('name')}")
                if op.get("status") != "DONE":
                    return None
            errors = (op.get("error") or {}).get("errors") or []
            if errors:
                raise cloud.CloudError(
                    f"{what}: " + "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
                )
            return f"{what}: operation {op.get('name')} done"

        return cloud.wait_until(
            done, what=what, timeout=self.settings.operation_timeout, interval=self.settings.poll
        )

    def _instance_path(self, inst: cloud.Instance) -> str:
        return f"projects/{inst.project}/zones/{inst.zone}/instances/{inst.id}"

    def reboot(self, inst: cloud.Instance) -> str:
        what = f"GCE reset {inst.id}"
        return self._wait(self._call("POST", f"{self._instance_path(inst)}/reset", what), inst, what)

    def replace(self, inst: cloud.Instance) -> str:
        vm = self._call("GET", self._instance_path(inst), f"GCE get {inst.id}")
        items = (vm.get("metadata") or {}).get("items") or []
        group = next((str(i.get("value")) for i in items if i.get("key") == "created-by"), "")
        if "/instanceGroupManagers/" in group:
            what = f"GCE recreate {inst.id} in {group.rsplit('/', 1)[-1]}"
            path = group.split("/compute/v1/", 1)[-1] + "/recreateInstances"
            op = self._call("POST", path, what, {"instances": [f"zones/{inst.zone}/instances/{inst.id}"]})
        else:
            what = f"GCE delete {inst.id} (in no managed instance group)"
            op = self._call("DELETE", self._instance_path(inst), what)
        return self._wait(op, inst, what)

    def zone_instances(self, project: str, zone: str) -> dict[str, dict[str, Any]]:
        """Every instance of a zone, by name, with its `scheduling` and `upcomingMaintenance`
        (instances.list, 500 a page, only those fields)."""
        out: dict[str, dict[str, Any]] = {}
        token = ""
        while True:
            query = {"fields": LIST_FIELDS, "maxResults": "500", **({"pageToken": token} if token else {})}
            page = self._call("GET", f"projects/{project}/zones/{zone}/instances?{urlencode(query)}",
                              f"GCE list instances of {project}/{zone}")  # fmt: skip
            for item in page.get("items") or []:
                out[str(item.get("name", ""))] = item
            token = str(page.get("nextPageToken") or "")
            if not token:
                return out

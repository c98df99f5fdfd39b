"""Azure: Azure Resource Manager (Microsoft.Compute, api-version 2024-07-01), with a managed identity token.

    reboot   virtualMachines/restart (a VM or a scale set's VM: AKS node pools are scale sets)
    replace  .../redeploy: Azure moves the VM to a new host and starts it again (same name and disks),
             which is the repair for hardware faults that Azure itself offers
Both follow the asynchronous operation (Azure-AsyncOperation, else Location) until it ends.

Token: Microsoft Entra workload identity when AZURE_FEDERATED_TOKEN_FILE, AZURE_CLIENT_ID and
AZURE_TENANT_ID are set (what AKS injects), else the instance metadata service's managed identity
(AZURE_CLIENT_ID picks a user-assigned one). The identity needs Microsoft.Compute/virtualMachines/restart
and /redeploy actions on the node resource group (Virtual Machine Contributor is enough).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from workers import cloud

API_VERSION = "2024-07-01"
SCOPE = "https://management.azure.com/"


@dataclass(frozen=True)
class Settings:
    endpoint: str = "https://management.azure.com"
    authority: str = ""  # "": AZURE_AUTHORITY_HOST, else https://login.microsoftonline.com/
    imds: str = "http://169.254.169.254"
    operation_timeout: float = 900.0
    poll: float = 5.0
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


class Azure:
    name = "azure"

    def __init__(self, settings: Settings, *, session: requests.Session | None = None) -> None:
        self.settings = settings
        self.session = session or requests.Session()
        self.tokens = cloud.TokenCache(self._token)

    def _token(self) -> tuple[str, float]:
        env = self.settings.env
        if (
            env.get("AZURE_FEDERATED_TOKEN_FILE")
            and env.get("AZURE_CLIENT_ID")
            and env.get("AZURE_TENANT_ID")
        ):
            authority = (
                self.settings.authority
                or env.get("AZURE_AUTHORITY_HOST")
                or "https://login.microsoftonline.com/"
            )
            url = f"{authority.rstrip('/')}/{env['AZURE_TENANT_ID']}/oauth2/v2.0/token"
            form = {
                "grant_type": "client_credentials", "client_id": env["AZURE_CLIENT_ID"],
                "scope": f"{SCOPE}.default",
                "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                "client_assertion": Path(env["AZURE_FEDERATED_TOKEN_FILE"]).read_text().strip(),
            }  # fmt: skip
            body = cloud.call(
                self.session, "POST", url, what="Azure workload identity token", data=form
            ).json()
        else:
            params = {"api-version": "2018-02-01", "resource": SCOPE}
            if env.get("AZURE_CLIENT_ID"):
                params["client_id"] = env["AZURE_CLIENT_ID"]
            url = f"{self.settings.imds.rstrip('/')}/metadata/identity/oauth2/token"
            body = cloud.call(self.session, "GET", url, what="Azure managed identity token (IMDS)",
                              params=params, headers={"Metadata": "true"}).json()  # fmt: skip
        return str(body["access_token"]), float(body.get("expires_in", 300))

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens.get()}"}

    def _action(self, inst: cloud.Instance, action: str) -> str:
        what = f"Azure {action} {inst.id.rsplit('/virtualMachines/', 1)[-1]}"
        url = f"{self.settings.endpoint.rstrip('/')}{inst.id}/{action}"
        params = {"api-version": API_VERSION}
        r = cloud.call(
            self.session, "POST", url, what=what, ok=(200, 202), params=params, headers=self._headers()
        )
        if r.status_code == 200:
            return f"{what}: done"
        status_url = r.headers.get("Azure-AsyncOperation") or r.headers.get("Location")
        if not status_url:
            return f"{what}: accepted"
        interval = float(r.headers.get("Retry-After", self.settings.poll))

        def done() -> str | None:
            p = cloud.call(self.session, "GET", status_url, what=f"{what}: operation status", ok=(200, 202),
                           headers=self._headers())  # fmt: skip
            if "Azure-AsyncOperation" not in r.headers:  # a Location poll: 202 until it ends
                return None if p.status_code == 202 else f"{what}: done"
            body: dict[str, Any] = p.json() if p.content else {}
            status = str(body.get("status", "InProgress"))
            if status == "Succeeded":
                return f"{what}: Succeeded"
            if status in ("Failed", "Canceled"):
                error = body.get("error") or {}
                raise cloud.CloudError(f"{what}: {status}: {error.get('code')}: {error.get('message')}")
            return None

        return cloud.wait_until(done, what=what, timeout=self.settings.operation_timeout, interval=interval)

    def reboot(self, inst: cloud.Instance) -> str:
        return self._action(inst, "restart")

    def replace(self, inst: cloud.Instance) -> str:
        return self._action(inst, "redeploy")

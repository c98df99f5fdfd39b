"""The cloud maintenance monitor's settings (`faultline maintenance`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal

from pydantic import Field

from faultline.config.base import (
    Component,
    Duration,
    EvidenceFields,
    KubeFields,
    Part,
    StoreFields,
    WorkerFields,
)

Kind = Literal["REBOOT", "REDEPLOY", "TERMINATE", "FREEZE"]
Cloud = Literal["aws", "gcp", "azure", "oci"]


class MaintenanceTuning(Part):
    """What `workers.maintenance.Settings` takes from the component's settings."""

    interval: Duration = Field(
        default=dt.timedelta(minutes=1), ge=dt.timedelta(seconds=1),
        description="between looks at the providers' announcements (duration); one call per region, zone "
        "or instance (OCI) each time",
    )  # fmt: skip
    lead_time: Duration = Field(
        default=dt.timedelta(hours=1), ge=dt.timedelta(0),
        description="raise a maintenance fault this long (duration) before its window starts, so "
        "quarantine and drain are done before the provider takes the node down",
    )  # fmt: skip
    settle: Duration = Field(
        default=dt.timedelta(minutes=10), gt=dt.timedelta(0),
        description="a maintenance that ended without a new boot id resolves once the node stayed Ready "
        "this long (duration) after it (one that restarts the node resolves at its new boot id)",
    )  # fmt: skip
    quarantine_kinds: tuple[Kind, ...] = Field(
        default=("REBOOT", "REDEPLOY", "TERMINATE"),
        description="kinds of maintenance whose faults are fatal (the default rules cordon and drain); "
        "the others (FREEZE: a pause of seconds) are recorded and shown, not acted on",
    )
    acknowledge: bool = Field(
        default=True,
        description="ask Azure to start an event early (StartRequests, through the node's agent) once "
        "the node is drained",
    )
    azure_stale_after: Duration = Field(
        default=dt.timedelta(minutes=2), gt=dt.timedelta(0),
        description="an Azure node's Scheduled Events as its agent relayed them are trusted this long "
        "(duration); older, the node's maintenance faults are left as they are",
    )  # fmt: skip
    clouds: tuple[Cloud, ...] = Field(
        default=("aws", "gcp", "azure", "oci"),
        description="the providers whose nodes are watched (by their spec.providerID); Azure's come from "
        "the node agents (scheduled_events)",
    )
    node_selector: str = Field(
        default="", description="label selector of the nodes watched; empty: every node with a providerID"
    )
    analyzer_feed: bool = Field(
        default=False,
        description="also write the store's feed that the cluster analyzer reads, as writer "
        "`maintenance` (where one runs: the chart sets it with analyzer.enabled)",
    )


class MaintenanceConfig(Component, StoreFields, KubeFields, WorkerFields, EvidenceFields, MaintenanceTuning):
    """The cloud maintenance monitor (`faultline maintenance`): reads what the providers announce for the
    cluster's nodes and raises a fault on each node ahead of its maintenance window. Credentials are the
    janitor's (environment, IRSA, EKS Pod Identity, the metadata server, an OCI API key file)."""

    aws_region: str | None = Field(default=None, description="AWS region; unset: from each node's zone")
    aws_endpoint: str | None = Field(default=None, description="the EC2 API's base URL (unset: the region's)")
    gcp_endpoint: str | None = Field(
        default=None, description="the Compute API's base URL, up to /compute/v1"
    )
    oci_endpoint: str | None = Field(
        default=None, description="the OCI Core API's base URL (unset: the region's)"
    )
    oci_config: Path = Field(default=Path("~/.oci/config"), description="OCI API key config file")
    oci_profile: str = Field(default="DEFAULT", description="profile in the OCI config file")

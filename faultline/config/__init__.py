"""Typed configuration: one frozen pydantic-settings model per component, resolved only in the CLI (file <
environment < flags, `cli.settings`) and handed down as objects. `COMPONENTS` names them for the CLI and
`faultline config show`.

Each name is imported from its module when first used (PEP 562): a process builds only the models it
uses (the node agent, on every GPU node, builds its own and not the twenty others: 2.2 MiB of its memory).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faultline.config.agent import AgentConfig
    from faultline.config.analyzer import AnalyzerConfig
    from faultline.config.base import Component, Duration, Flag, Seconds, parse_seconds, part
    from faultline.config.commands import (
        BreakerResetConfig,
        ChartCrdsConfig,
        ChartSecretsConfig,
        ExplainConfig,
        ReportConfig,
        RetentionConfig,
        RmaConfig,
        StatusConfig,
        UninstallConfig,
    )
    from faultline.config.export import ExportConfig, SinkFilter, SinkSpec
    from faultline.config.maintenance import MaintenanceConfig, MaintenanceTuning
    from faultline.config.object_monitor import ObjectMonitorConfig, ObjectMonitorTuning
    from faultline.config.preflight import PreflightConfig, WebhookConfig
    from faultline.config.workers import (
        DrainConfig,
        DrainTuning,
        JanitorConfig,
        JanitorTuning,
        QuarantineConfig,
        QuarantineTuning,
        RemediationConfig,
        RemediationTuning,
        RepairCaps,
    )

COMPONENTS: dict[str, type[Component]]  # built on first use, as every name here

_HOME = {
    "AgentConfig": "agent",
    "AnalyzerConfig": "analyzer",
    "Component": "base",
    "Duration": "base",
    "Flag": "base",
    "Seconds": "base",
    "parse_seconds": "base",
    "part": "base",
    "BreakerResetConfig": "commands",
    "ChartCrdsConfig": "commands",
    "ChartSecretsConfig": "commands",
    "ExplainConfig": "commands",
    "ReportConfig": "commands",
    "RetentionConfig": "commands",
    "RmaConfig": "commands",
    "StatusConfig": "commands",
    "UninstallConfig": "commands",
    "ExportConfig": "export",
    "SinkFilter": "export",
    "SinkSpec": "export",
    "MaintenanceConfig": "maintenance",
    "MaintenanceTuning": "maintenance",
    "ObjectMonitorConfig": "object_monitor",
    "ObjectMonitorTuning": "object_monitor",
    "PreflightConfig": "preflight",
    "WebhookConfig": "preflight",
    "DrainConfig": "workers",
    "DrainTuning": "workers",
    "JanitorConfig": "workers",
    "JanitorTuning": "workers",
    "QuarantineConfig": "workers",
    "QuarantineTuning": "workers",
    "RemediationConfig": "workers",
    "RemediationTuning": "workers",
    "RepairCaps": "workers",
}  # fmt: skip
_COMPONENTS = {
    "agent": "AgentConfig",
    "quarantine": "QuarantineConfig",
    "drain": "DrainConfig",
    "remediation": "RemediationConfig",
    "janitor": "JanitorConfig",
    "status": "StatusConfig",
    "explain": "ExplainConfig",
    "report": "ReportConfig",
    "rma": "RmaConfig",
    "breaker-reset": "BreakerResetConfig",
    "retention": "RetentionConfig",
    "uninstall": "UninstallConfig",
    "chart-secrets": "ChartSecretsConfig",
    "chart-crds": "ChartCrdsConfig",
    "webhook": "WebhookConfig",
    "preflight": "PreflightConfig",
    "analyzer": "AnalyzerConfig",
    "object-monitor": "ObjectMonitorConfig",
    "maintenance": "MaintenanceConfig",
    "export": "ExportConfig",
}  # fmt: skip


if not TYPE_CHECKING:  # mypy reads the imports above, and still flags a name that is not here

    def __getattr__(name: str) -> Any:
        if name == "COMPONENTS":
            value: Any = {component: __getattr__(model) for component, model in _COMPONENTS.items()}
        elif name in _HOME:
            value = getattr(importlib.import_module(f"faultline.config.{_HOME[name]}"), name)
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = value
        return value


__all__ = [
    "COMPONENTS",
    "AgentConfig",
    "AnalyzerConfig",
    "BreakerResetConfig",
    "ChartCrdsConfig",
    "ChartSecretsConfig",
    "Component",
    "DrainConfig",
    "DrainTuning",
    "Duration",
    "ExplainConfig",
    "ExportConfig",
    "Flag",
    "JanitorConfig",
    "JanitorTuning",
    "MaintenanceConfig",
    "MaintenanceTuning",
    "ObjectMonitorConfig",
    "ObjectMonitorTuning",
    "PreflightConfig",
    "QuarantineConfig",
    "QuarantineTuning",
    "RemediationConfig",
    "RemediationTuning",
    "RepairCaps",
    "ReportConfig",
    "RetentionConfig",
    "RmaConfig",
    "Seconds",
    "SinkFilter",
    "SinkSpec",
    "StatusConfig",
    "UninstallConfig",
    "WebhookConfig",
    "parse_seconds",
    "part",
]  # fmt: skip

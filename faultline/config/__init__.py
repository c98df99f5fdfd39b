"""Typed configuration: one frozen pydantic-settings model per component, resolved only in the CLI (file <
environment < flags, `cli.settings`) and handed down as objects. `COMPONENTS` names them for the CLI and
`faultline config show`."""

from __future__ import annotations

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

COMPONENTS: dict[str, type[Component]] = {
    "agent": AgentConfig,
    "quarantine": QuarantineConfig,
    "drain": DrainConfig,
    "remediation": RemediationConfig,
    "janitor": JanitorConfig,
    "status": StatusConfig,
    "explain": ExplainConfig,
    "report": ReportConfig,
    "rma": RmaConfig,
    "breaker-reset": BreakerResetConfig,
    "retention": RetentionConfig,
    "uninstall": UninstallConfig,
    "chart-secrets": ChartSecretsConfig,
    "chart-crds": ChartCrdsConfig,
    "webhook": WebhookConfig,
    "preflight": PreflightConfig,
    "analyzer": AnalyzerConfig,
    "object-monitor": ObjectMonitorConfig,
    "maintenance": MaintenanceConfig,
    "export": ExportConfig,
}

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

"""Online anomaly scores of each GPU's health fields (the analyzer's `anomaly` setting), as plain code
with time passed in (the Bytewax shell is `dataflows.cluster`).

Input: health samples, events whose metadata carries a GPU's health fields as numbers (`metadata.
ecc_sbe_volatile: "12"`, ...; `metadata.boot_id` where known), keyed by the GPU across reboots and nodes
(`patterns.cluster.field_value(record, "gpu")`). Counters (errors since the driver loaded) are scored
as rates: their rise per hour between two samples of one boot; a counter that went down, or a sample of
another boot, was reset and starts over with no rate. Temperature is scored as its value.

Model, per GPU and field (river's online statistics, so each field's score is its own and a fault
names the field behind it): the recent level, an exponentially weighted mean of the field's last
samples (`stats.EWMean`, RECENT), against the GPU's own normal, an exponentially weighted mean and
variance over about its last thousand samples (`stats.EWMean`/`stats.EWVar`, BASELINE) learned only
from samples that score below half the threshold (a drift does not teach itself as normal: learning it
would widen the deviation as fast as the rate climbs). The score is

    (recent - normal mean) / max(normal deviation, floor)

one-sided (only a rise is a warning). The floor (per field, in its unit) keeps a GPU whose rate never
moved from alarming at its first errors: at rate 0 it takes a recent rate of `threshold` x `floor`.
Why not a multivariate detector (river's HalfSpaceTrees): its score says that a GPU looks odd, not
which field, and its features must be scaled into [0, 1] ahead of time; these fields are each
meaningful alone, and the fault must say which one moved and by how much.

After `warmup` learned samples, a score at or past the field's threshold opens `GPU-ANOMALY-<FIELD>`
(non-fatal, action NONE: an early warning that the default quarantine rules never cordon for), with
the score, the rate and the normal in its metadata, and every scored field's score beside it; it
resolves when the score falls below half the threshold (hysteresis, so a rate near the threshold
does not flap). State is bounded: a GPU with no sample for `expire` is forgotten (`Models.expire`), and
the models are saved in the partition's checkpoint (pickled: river's statistics are plain objects).
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from faultline.config.analyzer import AnomalyField
from faultline.errors import ConfigError
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id, utc_from_epoch

PATTERN = "gpu-anomaly"  # the derived faults' pattern, and the partition key's prefix
GAUGES = frozenset({"temperature"})  # scored as values; every other field is a counter, scored as a rate
RECENT = 0.3  # EWMean fading factor of the recent level: about the last three samples
BASELINE = 0.002  # EWMean/EWVar fading factor of the GPU's normal: about its last thousand samples
MIN_DT = 1.0  # seconds: two samples closer than this give no rate (a repeat of one read)

Sample = tuple[str, int, float, str, str, str, tuple[tuple[str, float], ...]]
# (gpu, position, t, node, boot id, record id, ((field, value), ...)): small, it crosses the exchange


def river_stats() -> Any:
    """river's `stats`, imported only when anomaly scores are on; a clear error where it is missing."""
    try:
        from river import stats  # noqa: PLC0415 - optional: numpy and scipy weigh 150 MB in an image
    except ImportError as exc:
        raise ConfigError(
            f"anomaly scores need river, which is not installed ({exc}): install faultline[anomaly]"
        ) from exc
    return stats


def sample(
    gpu: str | None, position: int, t: float, node: str, record_id: str, metadata: Mapping[str, str],
    fields: Mapping[str, AnomalyField],
) -> Sample | None:  # fmt: skip
    """A record's health sample: the enabled fields its metadata carries as numbers (None: not a sample)."""
    if not gpu:
        return None
    values = []
    for name, spec in fields.items():
        raw = metadata.get(name)
        if not spec.enabled or raw is None:
            continue
        try:
            value = float(raw)
        except (TypeError, ValueError):
            continue  # not a number: not evidence
        if math.isfinite(value):
            values.append((name, value))
    if not values:
        return None
    return (gpu, position, t, node, str(metadata.get("boot_id", "")), record_id, tuple(values))


def rate(previous: tuple[float, float, str] | None, t: float, value: float, boot: str) -> float | None:
    """A counter's rise per hour since `previous` (its time, value and boot); None where there is no
    rate: no previous sample, another boot, a counter that went down (reset: a reboot or driver reload),
    or a sample not after the previous one."""
    if previous is None:
        return None
    t0, v0, boot0 = previous
    if boot != boot0 or value < v0 or t - t0 < MIN_DT:
        return None
    return (value - v0) / (t - t0) * 3600.0


class FieldModel:
    """One GPU field's model: its last sample (counters), its recent level and its normal, how many
    samples its normal learned, and the fault it has open (when it opened, how many samples since)."""

    __slots__ = ("baseline", "count", "last", "learned", "node", "opened", "recent", "variance")

    def __init__(self) -> None:
        stats = river_stats()
        self.recent = stats.EWMean(fading_factor=RECENT)
        self.baseline = stats.EWMean(fading_factor=BASELINE)
        self.variance = stats.EWVar(fading_factor=BASELINE)
        self.last: tuple[float, float, str] | None = None
        self.learned = 0
        self.opened: float | None = None
        self.node = ""
        self.count = 0

    def score(self, floor: float) -> float:
        deviation = max(math.sqrt(max(self.variance.get(), 0.0)), floor)
        return float(self.recent.get() - self.baseline.get()) / deviation

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


@dataclass
class Gpu:
    seen: float  # the newest sample's time
    fields: dict[str, FieldModel] = field(default_factory=dict)


@dataclass(frozen=True)
class AnomalyFault:
    """A GPU-ANOMALY fault change (open, or resolved) for the analyzer's sink: `revision` is the
    position of the sample that made it. `pattern` names it for the sink's counters."""

    gpu: str
    field: str
    node: str
    t: float
    first_seen: float
    count: int
    resolved: bool
    metadata: Mapping[str, str]
    revision: int
    pattern: str = PATTERN

    @property
    def code(self) -> str:
        return "GPU-ANOMALY-" + self.field.upper().replace("_", "-")

    def fault(self) -> Fault:
        """As stored in `faults`: non-fatal, action NONE, on the GPU by UUID (its key across reboots)."""
        return Fault(
            id=fault_id(self.node, "GPU-UUID", self.gpu, self.code), node=self.node,
            entity=Entity(type="GPU-UUID", id=self.gpu), code=self.code, component=Component.GPU,
            count=self.count, first_seen=utc_from_epoch(self.first_seen), last_seen=utc_from_epoch(self.t),
            fatal=False, action=Action.NONE, state=FaultState.RESOLVED if self.resolved else FaultState.OPEN,
            resolved_at=utc_from_epoch(self.t) if self.resolved else None,
            description=f"{self.field} of this GPU rising past its normal (early warning; no action)",
            pattern=self.pattern, metadata={"scope": "cluster", **self.metadata},
        )  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """The analyzer's `anomaly_fields`, `anomaly_warmup` and `anomaly_expire` (in seconds)."""

    fields: Mapping[str, AnomalyField]
    warmup: int = 30
    expire: float = 7 * 86400.0

    def enabled(self) -> dict[str, AnomalyField]:
        return {name: spec for name, spec in self.fields.items() if spec.enabled}


class Models:
    """The models of one partition's GPUs."""

    def __init__(self, settings: Settings) -> None:
        river_stats()  # fail at the start, not at the first sample
        self.fields = settings.enabled()
        self.warmup = settings.warmup
        self.expire_after = settings.expire
        self.gpus: dict[str, Gpu] = {}
        self.stale = 0  # samples ignored as not newer than the GPU's last (a replay, or out of order)

    def add(self, s: Sample) -> list[AnomalyFault]:
        """Take one sample in; the fault changes it makes."""
        gpu_key, position, t, node, boot, record_id, values = s
        g = self.gpus.get(gpu_key)
        if g is None:
            g = self.gpus[gpu_key] = Gpu(seen=float("-inf"))
        elif t <= g.seen:
            self.stale += 1
            return []
        g.seen = t
        measured: dict[str, tuple[float, float]] = {}  # field -> (what was scored, score)
        for name, value in values:
            spec = self.fields.get(name)
            if spec is None:
                continue
            m = g.fields.get(name)
            if m is None:
                m = g.fields[name] = FieldModel()
            if name in GAUGES:
                x: float | None = value
            else:
                x = rate(m.last, t, value, boot)
                m.last = (t, value, boot)
            if x is None:
                continue
            m.recent.update(x)
            measured[name] = (x, m.score(spec.floor))
        out = []
        for name, (x, score) in measured.items():
            spec, m = self.fields[name], g.fields[name]
            if m.opened is None and m.learned >= self.warmup and score >= spec.threshold:
                m.opened, m.node, m.count = t, node, 0
            if m.opened is not None:
                m.count += 1
                resolved = score < spec.threshold / 2
                if resolved or m.count == 1:  # an open fault is written when it opens and when it resolves
                    out.append(self._fault(gpu_key, name, m, t, x, score, measured, values, record_id,
                                           position, resolved))  # fmt: skip
                if resolved:
                    m.opened = None
                continue
            if score >= spec.threshold / 2 and m.learned >= self.warmup:
                continue  # suspect: learning it would widen the normal until a drift never scores high
            m.baseline.update(x)
            m.variance.update(x)
            m.learned += 1
        return out

    def _fault(
        self, gpu_key: str, name: str, m: FieldModel, t: float, x: float, score: float,
        measured: Mapping[str, tuple[float, float]], values: tuple[tuple[str, float], ...], record_id: str,
        position: int, resolved: bool,
    ) -> AnomalyFault:  # fmt: skip
        assert m.opened is not None
        unit = "C" if name in GAUGES else "/h"
        meta = {
            "anomaly": name, "score": f"{score:.2f}", "threshold": f"{self.fields[name].threshold:g}",
            "value" if name in GAUGES else "rate": f"{x:.4g}{unit}",
            "normal": f"{m.baseline.get():.4g}{unit}",
            "deviation": f"{math.sqrt(max(m.variance.get(), 0.0)):.4g}{unit}",
            "samples": str(m.learned),
            "scores": ",".join(f"{n}={s:.2f}" for n, (_x, s) in sorted(measured.items())),
            "fields": ",".join(f"{n}={v:g}" for n, v in values),
            "records": record_id,
        }  # fmt: skip
        return AnomalyFault(gpu=gpu_key, field=name, node=m.node, t=t, first_seen=m.opened, count=m.count,
                            resolved=resolved, metadata=meta, revision=position)  # fmt: skip

    def expire(self, watermark: float) -> int:
        """Forget the GPUs with no sample for `expire` seconds before `watermark`."""
        gone = [k for k, g in self.gpus.items() if g.seen < watermark - self.expire_after]
        for k in gone:
            del self.gpus[k]
        return len(gone)

    def state(self) -> dict[str, Any]:
        """For the partition's checkpoint: the GPUs' models, pickled (one binary value)."""
        return {"models": pickle.dumps(self.gpus, protocol=pickle.HIGHEST_PROTOCOL), "stale": self.stale}

    @classmethod
    def restore(cls, settings: Settings, state: Mapping[str, Any] | None) -> Models:
        out = cls(settings)
        if state and state.get("models"):
            # the analyzer's own checkpoint in its own store: as trusted as every other record there
            out.gpus = pickle.loads(bytes(state["models"]))  # noqa: S301
            out.stale = int(state.get("stale") or 0)
        return out

"""GPU anomaly scores (`patterns.anomaly`): counter rates (resets, other boots, repeats), scores that
raise GPU-ANOMALY on a drifting correctable-ECC rate and not on healthy noise or a counter reset, the
fault's fields, resolving, the models in the partition's checkpoint, expiry, and the analyzer's
dataflow with scores on (one worker and two; restarted from its checkpoints)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from bytewax.testing import TestingSink, TestingSource, cluster_main, run_main

from dataflows import cluster as flow
from faultline.config.analyzer import ANOMALY_FIELDS, AnomalyField
from faultline.errors import ConfigError
from faultline.models import Action, FaultState
from patterns import anomaly, cluster, loader
from patterns.cluster import Record
from tests.unit.feeding import feed_items
from workers import rules

T = 1_800_000_000.0
MINUTE = 60.0
SETTINGS = anomaly.Settings(ANOMALY_FIELDS, warmup=30, expire=86400.0)


@pytest.mark.parametrize(
    ("previous", "t", "value", "boot", "expected"),
    [
        (None, T, 5.0, "b1", None),  # the first sample: no rate yet
        ((T, 5.0, "b1"), T + 3600, 17.0, "b1", 12.0),  # 12 more in an hour
        ((T, 5.0, "b1"), T + 60, 6.0, "b1", 60.0),  # per hour
        ((T, 5.0, "b1"), T + 60, 5.0, "b1", 0.0),
        ((T, 50.0, "b1"), T + 60, 3.0, "b1", None),  # went down: reset (driver reload, GPU reset)
        ((T, 5.0, "b1"), T + 60, 90.0, "b2", None),  # another boot: the counter restarted in between
        ((T, 5.0, "b1"), T, 9.0, "b1", None),  # the same read again
        ((T, 5.0, "b1"), T - 60, 9.0, "b1", None),  # out of order
    ],
)
def test_rate(previous: Any, t: float, value: float, boot: str, expected: float | None) -> None:
    assert anomaly.rate(previous, t, value, boot) == expected


def test_a_sample_is_the_enabled_numeric_fields_of_a_gpu() -> None:
    meta = {"gpu_uuid": "G1", "ecc_sbe_volatile": "12", "temperature": "71", "pcie_replay": "x",
            "nvlink_crc": "nan", "boot_id": "b1"}  # fmt: skip
    s = anomaly.sample("G1", 7, T, "n1", "e1", meta, SETTINGS.enabled())
    assert s == ("G1", 7, T, "n1", "b1", "e1", (("ecc_sbe_volatile", 12.0),))  # temperature is off by default
    assert anomaly.sample(None, 7, T, "n1", "e1", meta, SETTINGS.enabled()) is None  # no GPU key
    assert anomaly.sample("G1", 7, T, "n1", "e1", {"code": "x"}, SETTINGS.enabled()) is None


def ecc_samples(rates_per_hour: list[float], *, gpu: str = "G1", start: float = T, boot: str = "b1",
                counter: float = 0.0, rng: random.Random | None = None) -> list[anomaly.Sample]:  # fmt: skip
    """A sample a minute whose correctable-ECC counter rose by `rate` per hour (Poisson with `rng`)."""
    out: list[anomaly.Sample] = []
    for i, r in enumerate(rates_per_hour):
        counter += _poisson(rng, r / 60) if rng is not None else r / 60
        out.append((gpu, i + 1, start + i * MINUTE, "n1", boot, f"e{i}", (("ecc_sbe_volatile", counter),)))
    return out


def _poisson(rng: random.Random, mean: float) -> int:
    n, p, limit = 0, 1.0, pow(2.718281828459045, -mean)
    while True:
        p *= rng.random()
        if p <= limit:
            return n
        n += 1


def run(models: anomaly.Models, samples: list[anomaly.Sample]) -> list[anomaly.AnomalyFault]:
    return [f for s in samples for f in models.add(s)]


def test_healthy_noise_raises_nothing() -> None:
    """A day of a minute's samples at a healthy correctable-ECC rate (about 2 an hour, Poisson)."""
    models = anomaly.Models(SETTINGS)
    assert run(models, ecc_samples([2.0] * 1440, rng=random.Random(1))) == []


def test_a_drifting_correctable_ecc_rate_raises_and_resolves() -> None:
    models = anomaly.Models(SETTINGS)
    healthy = [1.0] * 120
    drift = [1.0 + 5.0 * i for i in range(60)]  # rising by 5/h a minute, to 296/h
    got = run(models, ecc_samples(healthy + drift + [0.0] * 30))
    opened = [f for f in got if not f.resolved]
    assert len(opened) == 1
    f = opened[0].fault()
    assert (f.code, f.entity.type, f.entity.id) == ("GPU-ANOMALY-ECC-SBE-VOLATILE", "GPU-UUID", "G1")
    assert f.node == "n1"
    assert (f.fatal, f.action, f.state) == (False, Action.NONE, FaultState.OPEN)
    assert float(f.metadata["score"]) >= 6.0 and f.metadata["rate"].endswith("/h")
    assert f.metadata["anomaly"] == "ecc_sbe_volatile"
    # learned: the healthy rates and the drift's start, under the threshold
    assert 119 <= int(f.metadata["samples"]) < 180
    assert f.metadata["scores"].startswith("ecc_sbe_volatile=")
    assert f.metadata["fields"].startswith("ecc_sbe_volatile=")
    # it opened while the rate was climbing, well before its top
    assert 120 * MINUTE < f.first_seen.timestamp() - T < 170 * MINUTE
    resolved = [f for f in got if f.resolved]
    assert len(resolved) == 1 and resolved[0].fault().state == FaultState.RESOLVED
    assert resolved[0].fault().resolved_at is not None


def test_the_default_quarantine_rules_leave_a_gpu_anomaly_alone() -> None:
    models = anomaly.Models(SETTINGS)
    opened = run(models, ecc_samples([1.0] * 60 + [600.0] * 3))[0].fault()
    doc = {"_id": opened.id, "code": opened.code, "component": opened.component.value,
           "action": opened.action.value, "fatal": opened.fatal, "count": opened.count}  # fmt: skip
    want = rules.desired(rules.load_rules(None), [rules.OpenFault.from_doc(doc)], {})
    assert not want.quarantined and want.faults == ()


def test_a_counter_reset_raises_nothing() -> None:
    """A reboot (another boot id), and a GPU reset within one boot (the counter goes down)."""
    models = anomaly.Models(SETTINGS)
    before = ecc_samples([2.0] * 100, counter=5000.0)
    after_reboot = ecc_samples([2.0] * 50, start=T + 100 * MINUTE, boot="b2", counter=0.0)
    after_reset = ecc_samples([2.0] * 50, start=T + 150 * MINUTE, boot="b2", counter=0.0)
    assert run(models, before + after_reboot + after_reset) == []
    m = models.gpus["G1"].fields["ecc_sbe_volatile"]
    # every sample learned but the first, the first of the new boot, and the first after the reset
    assert m.learned == 197


def test_warmup_and_switched_off_fields() -> None:
    fields = {**ANOMALY_FIELDS, "pcie_replay": AnomalyField(enabled=False)}
    models = anomaly.Models(anomaly.Settings(fields, warmup=30))
    bad: list[anomaly.Sample] = [("G1", i, T + i * MINUTE, "n1", "b", f"e{i}",
            (("ecc_sbe_volatile", 1000.0 * i), ("pcie_replay", 1000.0 * i))) for i in range(20)]  # fmt: skip
    assert run(models, bad) == []  # still learning; and pcie_replay is not scored at all
    assert set(models.gpus["G1"].fields) == {"ecc_sbe_volatile"}


def test_models_survive_a_checkpoint_and_expire() -> None:
    models = anomaly.Models(SETTINGS)
    samples = ecc_samples([1.0] * 120 + [500.0] * 5)
    run(models, samples[:100])
    restored = anomaly.Models.restore(SETTINGS, models.state())
    assert restored.gpus["G1"].fields["ecc_sbe_volatile"].learned == 99
    assert restored.add(samples[50]) == [] and restored.stale == 1  # a replayed sample is not learned twice
    assert [f.field for f in run(restored, samples[100:])] == ["ecc_sbe_volatile"]
    assert restored.expire(T + 124 * MINUTE + 86400.0 - 1) == 0
    assert restored.expire(T + 124 * MINUTE + 86400.0 + 1) == 1 and restored.gpus == {}


def test_without_river_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "river", None)  # import river fails as where it is not installed
    with pytest.raises(ConfigError, match=r"faultline\[anomaly\]"):
        anomaly.Models(SETTINGS)


def health_record(i: int, counter: float, gpu: str = "G1") -> Record:
    meta = {"gpu_uuid": gpu, "ecc_sbe_volatile": str(counter), "boot_id": "b1"}
    return Record(position=(i + 1) << 16, kind="events", id=f"e{i}", t=T + i * MINUTE, node="n1",
                  code="GPU-HEALTH", healthy=True, metadata=meta)  # fmt: skip


@pytest.mark.parametrize("workers", [1, 2])
def test_the_dataflow_scores_and_keeps_its_models_across_a_restart(workers: int) -> None:
    packs = cluster.ClusterPacks(loader.PackSet())
    counter, records = 0.0, []
    for i in range(200):
        counter += 1 / 60 if i < 100 else 10.0  # 1/h, then 600/h from sample 100
        records.append(health_record(i, counter))
    got: list[Any] = []
    f = flow.build(packs, TestingSource(feed_items(records[:90], per_read=10)), TestingSink(got), checkpoints={},
                   checkpoint_interval=0.0, scores=SETTINGS)  # fmt: skip
    if workers == 1:
        run_main(f)
    else:
        cluster_main(f, [], 0, worker_count_per_proc=2)
    assert [v for k, v in got if k == "fault"] == []
    checkpoints = {p: s for k, (p, s) in ((k, v) for k, v in got if k == "checkpoint")}
    saved = checkpoints[cluster.partition(anomaly.PATTERN, "G1")]["anomaly"]
    assert anomaly.Models.restore(SETTINGS, saved).gpus["G1"].fields["ecc_sbe_volatile"].learned == 89

    # restarted from the checkpoints, the feed read again from the start: the models go on from 89
    again: list[Any] = []
    f = flow.build(packs, TestingSource(feed_items(records, per_read=10)), TestingSink(again), checkpoints=checkpoints,
                   checkpoint_interval=0.0, scores=SETTINGS)  # fmt: skip
    run_main(f)
    faults = [v.fault() for k, v in again if k == "fault"]
    assert [(x.code, x.state) for x in faults] == [("GPU-ANOMALY-ECC-SBE-VOLATILE", FaultState.OPEN)]
    assert faults[0].metadata["samples"] == "99"  # learned 89 before the restart and 10 after, none twice

"""Where the analyzer's processes sit in its Bytewax cluster (`cli.analyzer_processes.layout`): one pod,
or the pods of a StatefulSet (`peers`), and what a member pod's output asks before it is written."""

from __future__ import annotations

import threading

import pytest

from cli import analyzer_processes as ap
from faultline import config
from faultline.errors import ConfigError, TransientError

URI = "mongodb://store:27017/"
PEERS = ("fl-analyzer-0.fl-analyzer-peers.ns.svc.cluster.local:7410",
         "fl-analyzer-1.fl-analyzer-peers.ns.svc.cluster.local:7410")  # fmt: skip


def settings(**given: object) -> config.AnalyzerConfig:
    return config.AnalyzerConfig(mongodb_uri=URI, **given)  # type: ignore[arg-type]


def test_one_pod_with_one_process_is_no_cluster_and_with_two_talks_on_loopback() -> None:
    assert not ap.layout(settings()).clustered
    two = ap.layout(settings(processes=2, process_port=7500))
    assert two.clustered and two.place == 0 and two.leader is None
    assert two.addresses(0) == two.addresses(1) == ["127.0.0.1:7500", "127.0.0.1:7501"]


def test_pods_of_a_statefulset_take_their_place_from_the_host_name() -> None:
    where = ap.layout(settings(peers=PEERS, processes=2), hostname="fl-analyzer-1")
    assert (where.place, where.first, where.processes, where.leader) == (1, 2, 2, PEERS[0])
    host0, host1 = (p.rpartition(":")[0] for p in PEERS)
    # its own address is listened on everywhere, its pod's other process on loopback, pod 0's by name
    assert where.addresses(2) == [f"{host0}:7410", f"{host0}:7411", "0.0.0.0:7410", "127.0.0.1:7411"]
    assert where.addresses(3) == [f"{host0}:7410", f"{host0}:7411", "127.0.0.1:7410", "0.0.0.0:7411"]
    first = ap.layout(settings(peers=PEERS), hostname="fl-analyzer-0")
    assert (first.place, first.first, first.addresses(0)) == (0, 0, ["0.0.0.0:7410", f"{host1}:7410"])
    assert ap.owner(first, "analyzer/fl-analyzer-0/7", "abc").startswith(f"analyzer/{PEERS[0]}/abc/")
    assert ap.owner(where, "analyzer/fl-analyzer-1/7", "abc") == "analyzer/fl-analyzer-1/7"
    # peer_index given: the host name is not read
    assert ap.layout(settings(peers=PEERS, peer_index=1), hostname="anything").place == 1


@pytest.mark.parametrize(
    ("given", "hostname", "says"),
    [
        ({"peers": PEERS}, "analyzer", "host name 'analyzer' does not end with -<ordinal>"),
        ({"peers": PEERS}, "fl-analyzer-2", "this pod's place is 2, but 2 peers are given"),
        ({"peers": PEERS, "owner": "me"}, "fl-analyzer-0", "owner: not with peers"),
    ],
)
def test_pods_whose_settings_do_not_fit_are_told_which(
    given: dict[str, object], hostname: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        ap.layout(settings(**given), hostname=hostname)


@pytest.mark.parametrize(
    ("peers", "says"),
    [(("store:7410", "nohost"), "peer 1 ('nohost') is not host:port"),
     (("a:80",), "peer 0 ('a:80') is not host:port with a port from 1024"),
     (("a:7410", "a:7410"), "given twice: a:7410")],
)  # fmt: skip
def test_bad_peers_are_refused_by_place(peers: tuple[str, ...], says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        settings(peers=peers)


def test_a_member_writes_while_the_pod_0_it_joined_holds_the_lease_and_never_again_once_it_does_not() -> None:
    joined = f"analyzer/{PEERS[0]}/abc/1.0a1b2c3d"
    holders: list[object] = [
        joined,
        TransientError("store away"),
        f"analyzer/{PEERS[0]}/abc/1.99999999",
        joined,
    ]
    asked: list[object] = []
    lost: list[bool] = []

    def holder() -> str | None:
        h = holders.pop(0)
        asked.append(h)
        if isinstance(h, Exception):
            raise h
        return h  # type: ignore[return-value]

    guard = ap.LeaseGuard(holder, joined, every=0, on_lost=lambda: lost.append(True))
    assert guard() and not lost  # the pod 0 it joined holds it
    assert guard() and not lost  # the store away: the last answer stands
    assert not guard() and lost == [True]  # a later start of pod 0 (same pid in its container): no, for good
    assert not guard() and len(asked) == 3  # not asked again, even were the first to hold it again


def test_a_member_trusts_its_look_at_the_lease_for_a_while() -> None:
    calls: list[int] = []

    def holder() -> str:
        calls.append(1)
        return "analyzer/elsewhere:7410/abc/3.00000000"  # another cluster's pod 0

    guard = ap.LeaseGuard(holder, f"analyzer/{PEERS[0]}/abc/3.00000000", every=3600)
    assert not guard()
    assert not guard() and len(calls) == 1


def test_pod_0_is_named_by_its_peer_its_settings_and_this_start() -> None:
    first = ap.layout(settings(peers=PEERS), hostname="fl-analyzer-0")
    one, two = ap.owner(first, "x", "abc"), ap.owner(first, "x", "abc")
    assert one != two and one.rsplit(".", 1)[0] == two.rsplit(".", 1)[0]  # pid.random: each start its own
    assert ap.led_by(one, PEERS[0], "abc") is True
    assert ap.led_by(one, PEERS[0], "def") is False  # pod 0 running other settings
    assert ap.led_by(one, PEERS[1], "abc") is None and ap.led_by(None, PEERS[0], "abc") is None


def test_the_fingerprint_changes_with_what_shapes_the_flow_and_not_with_the_rest() -> None:
    base = ap.fingerprint(settings(peers=PEERS), {"p": {"window": "10m"}}, "code1")
    assert (
        ap.fingerprint(
            settings(peers=PEERS, peer_index=1, batch=7, poll=3), {"p": {"window": "10m"}}, "code1"
        )
        == base
    )
    changed = [
        ap.fingerprint(settings(peers=PEERS, workers=2), {"p": {"window": "10m"}}, "code1"),
        ap.fingerprint(settings(peers=PEERS, checkpoint_interval=9), {"p": {"window": "10m"}}, "code1"),
        ap.fingerprint(settings(peers=(*PEERS, "fl-analyzer-2.x:7410")), {"p": {"window": "10m"}}, "code1"),
        ap.fingerprint(settings(peers=PEERS), {"p": {"window": "20m"}}, "code1"),
        ap.fingerprint(settings(peers=PEERS), {"p": {"window": "10m"}, "q": {}}, "code1"),
        ap.fingerprint(settings(peers=PEERS), {"p": {"window": "10m"}}, "code2"),  # an image update alone
    ]
    assert base not in changed and len(set(changed)) == len(changed)
    code = ap.code_identity()
    assert len(code) == 12 and code == ap.code_identity()


def test_a_member_joins_once_pod_0_holds_the_lease_running_its_settings() -> None:
    mine = f"analyzer/{PEERS[0]}/abc/1.0a1b2c3d"
    holders: list[object] = [None, None, TransientError("store away"), f"analyzer/{PEERS[0]}/old/1.1",
                             f"analyzer/{PEERS[0]}/old/1.1", mine]  # fmt: skip
    said: list[str] = []
    beats: list[int] = []

    def holder() -> str | None:
        h = holders.pop(0)
        if isinstance(h, Exception):
            raise h
        return h  # type: ignore[return-value]

    found = ap.wait_for_leader(holder, PEERS[0], "abc", threading.Event(), say=said.append,
                               beat=lambda: beats.append(1), poll=0)  # fmt: skip
    assert found == mine and not holders and len(beats) == 5
    assert said == [f"waiting for pod 0 ({PEERS[0]}) to hold the lease", "the store: store away",
                    "pod 0 holds the lease running other settings (the pods being updated?)"]  # fmt: skip
    stop = threading.Event()
    stop.set()
    assert ap.wait_for_leader(lambda: None, PEERS[0], "abc", stop, say=said.append) is None


def test_a_member_that_finds_pod_0_running_other_settings_for_long_starts_again() -> None:
    seen: list[str] = []
    with pytest.raises(ap.OtherSettingsError, match="running other settings for 0 s"):
        ap.wait_for_leader(lambda: f"analyzer/{PEERS[0]}/old/1.1", PEERS[0], "abc", threading.Event(),
                           say=seen.append, poll=0, other_for=0)  # fmt: skip
    # the store away or nobody holding it is not other settings: the wait goes on
    stop = threading.Event()
    looks = iter([None, None, None])

    def holder() -> str | None:
        try:
            return next(looks)
        except StopIteration:
            stop.set()
            return None

    assert ap.wait_for_leader(holder, PEERS[0], "abc", stop, say=seen.append, poll=0, other_for=0) is None

"""`faultline dev cluster up|down`: a local cluster and FerretDB in the foreground, and a way to stop one
left running in the background (by the state file `up` writes)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from devtools import procs
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo

STATE = Path(tempfile.gettempdir()) / f"faultline-dev-cluster-{os.getuid()}.json"


def up(nodes: int, emit: Callable[[str], None], *, state: Path = STATE) -> None:
    """Run until SIGINT/SIGTERM; emit `KUBECONFIG=...` and `MONGODB_URI=...` once everything is ready."""
    if state.exists() and procs.alive(json.loads(state.read_text()).get("pid", 0)):
        raise SystemExit(
            f"a dev cluster is already running (see {state}); stop it with `faultline dev cluster down`"
        )

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    cluster = LocalCluster(nodes=nodes)
    mongo = LocalMongo()
    try:
        cluster.start()
        mongo.start()
        assert mongo.proc is not None
        state.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "children": [p.pid for p in cluster.procs] + [mongo.proc.pid],
                    "kubeconfig": str(cluster.kubeconfig),
                    "mongodb_uri": mongo.uri,
                }
            )
        )
        emit(f"KUBECONFIG={cluster.kubeconfig}")
        emit(f"MONGODB_URI={mongo.uri}")
        emit(f"# ready in {cluster.ready_seconds:.1f} s with {nodes} simulated GPU nodes; Ctrl-C to stop")
        while True:
            time.sleep(1)
            dead = [p.name for p in [*cluster.procs, mongo.proc] if p is not None and not p.alive()]
            if dead:
                raise SystemExit(f"{', '.join(dead)} exited; stopping")
    except KeyboardInterrupt:
        pass
    finally:
        mongo.stop()
        cluster.stop()
        with contextlib.suppress(FileNotFoundError):
            state.unlink()


def down(*, state: Path = STATE, timeout: float = 30.0) -> str:
    """Stop the dev cluster recorded in `state`; return what was done."""
    if not state.exists():
        return "no dev cluster is running"
    info = json.loads(state.read_text())
    pid = int(info.get("pid", 0))
    if procs.alive(pid):
        os.kill(pid, signal.SIGTERM)
        procs.wait_for("the dev cluster to stop", lambda: not procs.alive(pid), timeout)
    leftovers = [c for c in info.get("children", []) if procs.alive(c)]
    for child in leftovers:  # `up` was killed hard: stop its process groups ourselves
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        state.unlink()
    return f"stopped the dev cluster (pid {pid})" + (
        f" and {len(leftovers)} orphaned processes" if leftovers else ""
    )

"""A TCP proxy on loopback that injects network faults between a client and a server (the chaos suite
puts one between the node agents and FerretDB, and one between the workers and FerretDB).

    proxy = NetProxy(target_port=mongo.port).start()
    uri = f"mongodb://127.0.0.1:{proxy.port}/..."
    proxy.set_delay(0.3)     # every chunk arrives 300 ms later, each way (order kept, throughput not capped)
    proxy.partition()        # a network partition: nothing passes either way; connections hang
    proxy.heal()             # the partition's connections are reset, new ones pass again
    proxy.reject()           # the server gone: connections reset, new ones closed at once (until heal)
    proxy.stop()

With `tls` (an SSLContext with the server's certificate) it terminates TLS: the registry behind HTTPS in
the install page's test (`devtools.registry.tls_front`).

A partition drops traffic instead of refusing it, as a broken network does: clients find out by their
own timeouts (a refused connection is what a stopped server gives, the FerretDB-kill scenario's case).
Connections held across the partition are closed when it heals (after minutes of silence both ends
would have given up on them), so clients reconnect.

One asyncio loop on its own thread carries every connection: the agents of 50+ nodes open several
each, and a thread per direction per connection would cost more than the traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import Callable
from types import TracebackType

CHUNK = 65536


class NetProxy:
    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.target = (target_host, target_port)
        self.port = port
        self.tls = tls  # TLS terminated here: clients speak it, the server gets the plain bytes
        self.delay = 0.0
        self.partitioned = False
        self.rejecting = False
        self.connections = 0  # accepted so far (a check that clients go through the proxy)
        self.rejected = 0  # connections closed at once by `reject`
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._cut: set[asyncio.StreamWriter] = set()  # writers of connections that lived in a partition
        self._ready = threading.Event()

    # -- control (from any thread) ----------------------------------------------------------------------
    def start(self) -> NetProxy:
        self._thread = threading.Thread(target=self._run, name=f"netproxy-{self.target[1]}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self._server is None:
            raise RuntimeError(f"the proxy to port {self.target[1]} did not start")
        return self

    def set_delay(self, seconds: float) -> None:
        """Latency added to every chunk, each way (0: none)."""
        if seconds < 0:
            raise ValueError(f"delay {seconds} s: must be >= 0")
        self.delay = seconds

    def partition(self) -> None:
        """From now on nothing passes: open connections go silent, new ones are accepted and hang."""
        self.partitioned = True
        self._call(self._mark_cut)

    def heal(self) -> None:
        """End a partition or a rejection: the connections that lived through it are reset, new ones
        pass."""
        self.partitioned = False
        self.rejecting = False
        self._call(self._reset_cut)

    def reject(self) -> None:
        """As if the server were gone: every connection is closed, and new ones are closed at once."""
        self.rejecting = True
        self._call(self._reset_all)

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has ended already
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> NetProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the loop ---------------------------------------------------------------------------------------
    def _call(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(fn)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", self.port, limit=CHUNK, ssl=self.tls)
            )
            self.port = int(self._server.sockets[0].getsockname()[1])
        finally:
            self._ready.set()
        if self._server is not None:
            loop.run_forever()
        loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.close()
        await asyncio.sleep(0)

    def _mark_cut(self) -> None:
        self._cut |= self._open

    def _reset_all(self) -> None:
        for writer in list(self._open):
            writer.close()

    def _reset_cut(self) -> None:
        for writer in self._cut:
            writer.close()
        self._cut.clear()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.rejecting:
            self.rejected += 1
            client_w.close()
            return
        writers = [client_w]
        self._track(client_w)
        try:
            try:
                server_r, server_w = await asyncio.open_connection(*self.target, limit=CHUNK)
            except OSError:
                return  # the server is down: the client sees its connection closed
            writers.append(server_w)
            self._track(server_w)
            pair = (client_w, server_w)
            await asyncio.gather(
                self._pump(client_r, server_w, pair), self._pump(server_r, client_w, pair),
                return_exceptions=True,
            )  # fmt: skip
        finally:
            for writer in writers:
                writer.close()
                self._open.discard(writer)
                self._cut.discard(writer)

    def _track(self, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        if self.partitioned:
            self._cut.add(writer)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:  # fmt: skip
        """Copy one direction: chunks queued with the time they may leave, written in order by a second
        task (so a delay adds latency without limiting throughput); during a partition they are dropped."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def send() -> None:
            try:
                while (item := await queue.get()) is not None:
                    due, data = item
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if self.partitioned or any(w in self._cut for w in pair):
                        continue  # dropped on the way
                    writer.write(data)
                    await writer.drain()
            finally:
                for w in pair:  # this side is done (or broken): close both, which ends the reader too
                    w.close()

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(CHUNK):
                if self.partitioned:
                    continue
                queue.put_nowait((time.monotonic() + self.delay, data))
        finally:
            queue.put_nowait(None)  # what is queued still goes (after its delay), then both sides close
            with contextlib.suppress(Exception):
                await sender

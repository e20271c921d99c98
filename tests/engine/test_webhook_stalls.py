"""Webhook deliveries cannot be stalled: a receiver that trickles its answer or floods it holds
the sender for at most its timeout and its answer bound, and delays no other delivery."""

from __future__ import annotations

import asyncio

from app.aio import wait_for
from tests.conftest import make_settings, start_harness
from tests.webhook_support import SECRET, attempts, read_request


class Receivers:
    """Real HTTP receivers on loopback: one trickles its answer a byte at a time, one answers
    50 MB, one answers at once."""

    FLOOD = 50 * 1024 * 1024

    def __init__(self) -> None:
        self.trickle_started = asyncio.Event()
        self.trickle_ended = asyncio.Event()
        self.flood_started = asyncio.Event()
        self.flood_sent = 0
        self.fast: list[bool] = []  # per fast delivery: was the trickle still going?
        self.servers: list[asyncio.Server] = []

    async def start(self) -> dict[str, str]:
        urls = {}
        for name, handler in (("trickle", self._trickle), ("flood", self._flood),
                              ("fast", self._fast)):
            server = await asyncio.start_server(handler, "127.0.0.1", 0)
            self.servers.append(server)
            urls[name] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
        return urls

    async def close(self) -> None:
        for server in self.servers:
            server.close()

    async def _trickle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        self.trickle_started.set()
        try:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            for _ in range(600):  # a byte every 0.1 s for a minute, unless the client leaves
                writer.write(b"x")
                await writer.drain()
                if reader.at_eof():
                    break
                await asyncio.sleep(0.1)
        except ConnectionError:
            pass
        finally:
            self.trickle_ended.set()
            writer.close()

    async def _flood(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        self.flood_started.set()
        chunk = b"x" * (1024 * 1024)
        try:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.FLOOD)
            while self.flood_sent < self.FLOOD:
                writer.write(chunk)
                await writer.drain()
                self.flood_sent += len(chunk)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _fast(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        self.fast.append(not self.trickle_ended.is_set())
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        writer.close()


async def test_a_trickling_or_flooding_receiver_delays_no_other_delivery(
        database_url: str) -> None:
    receivers = Receivers()
    urls = await receivers.start()
    deadline = 5.0
    h, close = await start_harness(make_settings(
        database_url, webhook_secret=SECRET, webhook_allow_http=True, webhook_allow_private=True,
        webhook_timeout_s=deadline, webhook_retry_base_s=600))
    try:
        await h.app.state.engine.stop()  # swarms stay queued; cancelling one makes it due now
        ids = {name: (await h.post({"task": "t", "agents": [{"name": "a"}],
                                    "webhook_url": url})).json()["id"]
               for name, url in urls.items()}
        for name in ("trickle", "flood"):
            assert (await h.client.post(f"/swarms/{ids[name]}/cancel")).status_code == 202
        await wait_for(receivers.trickle_started.wait(), 20)
        await wait_for(receivers.flood_started.wait(), 20)
        # both slow deliveries are under way: the next one must not wait for them
        assert (await h.client.post(f"/swarms/{ids['fast']}/cancel")).status_code == 202
        rows = await attempts(h, ids["fast"], 1)
        assert rows[0].status_code == 204
        assert receivers.fast == [True], "the fast delivery waited for the trickling one"
        trickle, flood = [(await attempts(h, ids[n], 1))[0] for n in ("trickle", "flood")]
        # the receiver sees the connection go on its next byte or two
        await wait_for(receivers.trickle_ended.wait(), 10)
    finally:
        h.app.state.engine = None
        await close()
        await receivers.close()
    # the trickle was cut at the deadline (connect + send + read), not after a minute
    assert trickle.status_code is None and "within 5 s" in (trickle.error or "")
    assert deadline * 1000 <= (trickle.latency_ms or 0) < 4 * deadline * 1000
    # the flood's status was taken and its body left unread after a few chunks
    assert flood.status_code == 200
    assert receivers.flood_sent < Receivers.FLOOD // 2

"""A small HTTP/1.1 client for streamed responses, on asyncio's Protocol API.

Where it is used, and the need it serves (issue 17): only by dynspec's built-in driver
(dynspec.bench), which measures emulated sweeps and CI; live sweeps default to the real
`sglang.bench_serving` (TLS, proxies, its own client).  The measured need is client CPU on
small machines where the client shares cores with the emulator: 57,835 output tokens per
client CPU-second against sglang.bench_serving 0.5.9's 20,267 (2.85x) at C=256, and about
55 us of CPU per streamed chunk for the earlier aiohttp version of this generator, most of
it in aiohttp's StreamReader round trip (a future, a task wake-up, buffer bookkeeping per
chunk; benchmarks/bench_loadgen.py, docs/GPU_NODE.md "Load generator").  On the wall clock
that was 1.06x, because the emulator set the pace: by the issue's own criterion this is not
yet a user-visible need, and replacing this module by aiohttp's client is the open
follow-up (docs/GPU_NODE.md says so).  A Protocol gets each socket read as a plain
callback, so the body bytes go straight to the caller's handler with the moment they
arrived, and no coroutine wakes until the response ends.

What it speaks: POST with a JSON body; responses with Transfer-Encoding: chunked,
Content-Length, or read-until-close; keep-alive connections reused one request at a
time (a closed-loop worker holds one).  Plain http only.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable
from urllib.parse import urlsplit

BodyHandler = Callable[[bytes, float], None]  # (bytes, perf_counter time they arrived)
_MAX_HEAD = 64 * 1024
_MAX_ERROR_BODY = 64 * 1024


class HTTPStreamError(Exception):
    """The connection failed or the server broke the HTTP framing."""


class _Response(asyncio.Protocol):
    """One connection; parses one response at a time and hands 2xx body bytes to on_body."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.done: asyncio.Future | None = None
        self.on_body: BodyHandler | None = None
        self._reset()

    def _reset(self) -> None:
        self.buf = b""
        self.state = "head"  # head -> size | data | length | close -> end
        self.status = 0
        self.keep_alive = True
        self.remaining = 0  # bytes left in the current chunk / content-length body
        self.error_body = b""

    def start(self, on_body: BodyHandler) -> asyncio.Future:
        self._reset()
        self.on_body = on_body
        self.done = self.loop.create_future()
        return self.done

    # asyncio callbacks ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            if self.state == "close" and exc is None:
                self._finish()  # a body delimited by the end of the connection
            else:
                self.done.set_exception(HTTPStreamError(
                    f"connection closed by the server{f' ({exc})' if exc else ''} before the response ended"))

    def data_received(self, data: bytes) -> None:
        if self.done is None or self.done.done():
            return  # nothing asked for: a server speaking out of turn; the next request resets
        now = time.perf_counter()
        try:
            self._parse(self.buf + data if self.buf else data, now)
        except HTTPStreamError as exc:
            self.done.set_exception(exc)
            self.transport.abort()

    # parsing ---------------------------------------------------------------------------------
    def _body(self, data: bytes, now: float) -> None:
        if 200 <= self.status < 300:
            self.on_body(data, now)
        elif len(self.error_body) < _MAX_ERROR_BODY:
            self.error_body += data

    def _parse(self, buf: bytes, now: float) -> None:
        pos, n = 0, len(buf)
        while pos < n and not self.done.done():
            st = self.state
            if st == "data":
                take = min(self.remaining, n - pos)
                self._body(buf[pos:pos + take], now)
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self.state = "crlf"
            elif st == "size" or st == "crlf" or st == "trailers":
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                line = buf[pos:end]
                pos = end + 2
                if st == "crlf":
                    if line:
                        raise HTTPStreamError("chunked body: missing CRLF after a chunk")
                    self.state = "size"
                elif st == "trailers":
                    if not line:
                        self._finish()
                else:
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise HTTPStreamError(f"chunked body: bad chunk size {line[:40]!r}") from None
                    if size == 0:
                        self.state = "trailers"
                    else:
                        self.remaining, self.state = size, "data"
            elif st == "length":
                take = min(self.remaining, n - pos)
                self._body(buf[pos:pos + take], now)
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self._finish()
            elif st == "close":
                self._body(buf[pos:], now)
                pos = n
            else:  # head
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    if n - pos > _MAX_HEAD:
                        raise HTTPStreamError("response head too large")
                    break
                self._head(buf[pos:end])
                pos = end + 4
        self.buf = buf[pos:] if pos < n else b""

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise HTTPStreamError(f"not an HTTP/1.x response: {lines[0][:60]!r}")
        self.status = int(parts[1])
        if self.status == 100:
            return  # interim response; the real head follows
        chunked, length = False, None
        self.keep_alive = parts[0] == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"transfer-encoding":
                chunked = value.endswith(b"chunked")
            elif name == b"content-length":
                length = int(value)
            elif name == b"connection":
                self.keep_alive = value == b"keep-alive" or (self.keep_alive and value != b"close")
        if chunked:
            self.state = "size"
        elif length is not None:
            self.state, self.remaining = "length", length
            if length == 0:
                self._finish()
        else:
            self.state, self.keep_alive = "close", False

    def _finish(self) -> None:
        self.state = "end"
        if not self.done.done():
            self.done.set_result(self.status)


class StreamClient:
    """POSTs to one server, streaming 2xx bodies to a handler; keeps idle connections for reuse."""

    def __init__(self, base_url: str):
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"{base_url}: only plain http://host:port URLs are supported")
        self.host, self.port = u.hostname, u.port or 80
        self.prefix = u.path.rstrip("/")
        self._idle: list[_Response] = []

    async def _connect(self, reuse: bool = True) -> tuple[_Response, bool]:
        while reuse and self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: _Response(loop), self.host, self.port)
        return conn, False

    async def post(self, path: str, body: bytes, on_body: BodyHandler,
                   timeout: float | None = None) -> tuple[int, bytes]:
        """Send one request; returns (status, body of a non-2xx response).  Raises HTTPStreamError,
        OSError (cannot connect) or asyncio.TimeoutError."""
        request = (b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                   b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                   % ((self.prefix + path).encode(), self.host.encode(), self.port, len(body), body))
        conn, reused = await self._connect()
        while True:
            done = conn.start(on_body)
            conn.transport.write(request)
            try:
                status = await asyncio.wait_for(done, timeout)
                break
            except HTTPStreamError:
                conn.transport.abort()
                # A kept-alive connection the server closed just as we reused it: nothing was
                # answered, so send again once on a fresh connection.
                if reused and conn.state == "head" and not conn.buf:
                    conn, reused = await self._connect(reuse=False)
                    continue
                raise
            except BaseException:
                conn.transport.abort()  # timed out or cancelled: this connection is done for
                raise
        if conn.keep_alive and not conn.closed:
            self._idle.append(conn)
        else:
            conn.transport.close()
        return status, conn.error_body

    def close(self) -> None:
        for conn in self._idle:
            conn.transport.close()
        self._idle.clear()

"""What one client may hold of the emulator: how long it may take to send its request headers,
how many connections are open at once, and what a request the HTTP parser refuses gets back.

aiohttp closes a connection that has not sent a whole request `HEADER_TIMEOUT_S` after it opened
(or after its last answer): its keep-alive timer starts with the connection.  Connections beyond
the cap evict the one that has waited longest without a request under way, so slow sockets
cannot hold every file handle and /health keeps answering; when every connection is busy with a
request, the newcomer is closed instead.  An unparseable request (an 8 KB URL, a bad header)
gets SGLang's JSON error body, not aiohttp's plain text, and one log line, not a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from functools import lru_cache

HEADER_TIMEOUT_S = 30.0  # above aiohttp's client keep-alive (15 s): a pooled connection is dropped by its client first
ACCEPT_BATCH = 64  # asyncio accepts up to the listen backlog per wake-up, before any of them is capped
FD_RESERVE = 2 * ACCEPT_BATCH + 64  # two batches in flight, the log, the listening socket, the engine's files

log = logging.getLogger("dynspec.sim.emulator")


def raise_file_limit() -> int:
    """The soft open-file limit raised to the hard one; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def max_connections(file_limit: int) -> int:
    return max(16, file_limit - FD_RESERVE)


def _json_handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                       message: str | None = None):
    """RequestHandler.handle_error with SGLang's JSON body and a one-line log."""
    from http import HTTPStatus

    from dynspec.sim.emulator.api import error_response

    if request.writer.output_size > 0:
        raise ConnectionError("response already sent, cannot send the error")
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "error"
    detail = " ".join(str(message or exc or reason).split())[:200]
    log.warning("refused a request from %s: %s %s", request.remote, status, detail)
    resp = error_response(status, f"{status} {reason}: {detail}")
    resp.force_close()
    return resp


@lru_cache(maxsize=1)
def _json_handler_class():
    from aiohttp.web_protocol import RequestHandler

    return type("JsonErrorRequestHandler", (RequestHandler,), {"__slots__": (), "handle_error": _json_handle_error})


class ConnectionCap:
    """The protocol factory for loop.create_server: aiohttp's handlers, capped and answering JSON."""

    def __init__(self, server, limit: int):
        self.server, self.limit = server, limit
        self.open: dict = {}  # handler -> None, oldest first
        self.evicted = 0
        self.refused = 0
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler, transport):
            made(handler, transport)
            self.open[handler] = None
            # aiohttp's keep-alive timer cuts a slow request only after a first answer: the first is ours
            asyncio.get_running_loop().call_later(HEADER_TIMEOUT_S, self._first_request_late, handler)
            if len(self.open) > limit:
                self._make_room(handler, transport)

        def connection_lost(handler, exc=None):
            self.open.pop(handler, None)
            lost(handler, exc)

        server.connection_made, server.connection_lost = connection_made, connection_lost

    def __call__(self):
        handler = self.server()
        handler.__class__ = _json_handler_class()  # same slots, JSON errors
        return handler

    def _first_request_late(self, handler) -> None:
        if handler in self.open and not getattr(handler, "_request_count", 1) \
                and not getattr(handler, "_request_in_progress", True):
            del self.open[handler]
            handler.force_close()

    def _make_room(self, newcomer, transport) -> None:
        for h in self.open:  # oldest first; one with a request under way is never cut
            if h is not newcomer and not getattr(h, "_request_in_progress", True):
                del self.open[h]
                h.force_close()
                self.evicted += 1
                return
        del self.open[newcomer]
        self.refused += 1
        transport.close()

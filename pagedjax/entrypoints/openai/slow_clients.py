"""Slow and stalled clients: timeouts the HTTP layer enforces.

* **Headers** (``header_timeout_s``): a request's headers must be complete this
  long after its connection opened, or after the first byte of a request on a
  kept-alive connection. If some bytes came, the server answers **408**
  (OpenAI-shaped JSON, ``Connection: close``) and closes the connection; a
  connection that sent nothing is closed without an answer.
* **Body** (``body_timeout_s``): the body (a chunked body included) must be
  complete this long after its headers; then **408** and the connection is
  closed. The handler, waiting for the body, sees a disconnect and stops.
* **Idle** between requests on a kept-alive connection: uvicorn's
  ``timeout_keep_alive`` (``--timeout-keep-alive``); the connection is closed.
* **Stalled responses** (``stall_timeout_s``): while a response is being
  sent, a watchdog looks every second at how many of its bytes the client
  has acknowledged (bytes written, less those still in the transport's buffer
  and in the kernel's send queue, ``SIOCOUTQ``). When that count has not moved
  for this long while bytes wait, the client has read nothing: the connection
  is reset (``SO_LINGER`` 0, so the kernel drops the unsent bytes at once and
  the client sees the reset), the handler sees a disconnect, and a stream's engine requests
  are aborted (their KV pages freed). Kernel buffers can hold megabytes, so
  counting acknowledged bytes finds a stalled reader long before the
  server's own writes would block.

All of them live in :func:`protocol_class`: uvicorn's h11 protocol with
these deadlines. ``/health`` and other requests are served on their own
connections by the event loop, which a stalled client never blocks.
"""

from __future__ import annotations

import fcntl
import json
import logging
import socket
import struct
import termios
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("pagedjax.server")

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_STALL_TIMEOUT_S = 60.0


def _timeout_response(what: str, seconds: float) -> bytes:
    body = json.dumps({"error": {
        "message": f"the request {what} did not arrive within {seconds:g} s.",
        "type": "invalid_request_error", "param": None, "code": "request_timeout"}}).encode()
    head = (f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    return head + body


class _CountingTransport:
    """A transport that counts the bytes written through it (the rest is forwarded)."""

    def __init__(self, transport):
        self._t = transport
        self.written = 0

    def write(self, data) -> None:
        self.written += len(data)
        self._t.write(data)

    def __getattr__(self, name):
        return getattr(self._t, name)


def _kernel_queue(sock) -> int:
    """Bytes in the socket's send queue not yet acknowledged (0 if unknown)."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
        return struct.unpack("i", raw)[0]
    except (OSError, AttributeError, ValueError):
        return 0


def _reset(sock) -> None:
    """Make the coming close a reset: the kernel drops the unsent bytes at once (a
    plain close would keep them, and the socket, while the peer's window is shut)
    and the client learns that the connection is gone."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except (OSError, AttributeError):
        pass


class _DeadlineProtocol(H11Protocol):
    """H11Protocol with header, body and stall deadlines (set by :func:`protocol_class`)."""

    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s = DEFAULT_BODY_TIMEOUT_S
    stall_timeout_s = DEFAULT_STALL_TIMEOUT_S

    def connection_made(self, transport) -> None:
        transport = _CountingTransport(transport)
        super().connection_made(transport)
        self._sock = transport.get_extra_info("socket")
        self._acked, self._progress_at = 0, time.monotonic()
        self._watch = self.loop.call_later(1.0, self._watchdog)
        self._timer = None
        self._phase_cycle = None  # the cycle whose body the timer watches
        self._got_bytes = False
        self._arm(self.header_timeout_s)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def data_received(self, data: bytes) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        if idle and self._timer is None:  # a new request starts on a kept-alive connection
            self._arm(self.header_timeout_s)
        self._got_bytes = True
        super().data_received(data)
        self._update()

    def _update(self) -> None:
        c = self.cycle
        if c is None or c.response_complete:
            return  # still waiting for headers: the header timer runs
        if c.more_body and not c.response_started and not c.disconnected:
            if self._phase_cycle is not c:  # headers just completed: time the body
                self._phase_cycle = c
                self._arm(self.body_timeout_s)
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        self._disarm()
        self._got_bytes = False
        super().on_response_complete()
        self._update()  # a pipelined request may have started

    def connection_lost(self, exc) -> None:
        self._disarm()
        self._watch.cancel()
        super().connection_lost(exc)

    def _watchdog(self) -> None:
        """Abort the connection if its client acknowledged nothing for the stall timeout."""
        if self.transport.is_closing():
            return
        now = time.monotonic()
        waiting = self.transport.get_write_buffer_size() + _kernel_queue(self._sock)
        acked = self.transport.written - waiting
        if waiting == 0 or acked != self._acked:
            self._acked, self._progress_at = acked, now
        elif now - self._progress_at >= self.stall_timeout_s:
            logger.warning("a client read nothing for %g s (%d bytes waiting): connection "
                           "reset", self.stall_timeout_s, waiting)
            _reset(self._sock)
            self.transport.abort()
            return
        self._watch = self.loop.call_later(1.0, self._watchdog)

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        c = self.cycle
        if c is None or c.response_complete:
            if self._got_bytes:
                self.transport.write(_timeout_response("headers", self.header_timeout_s))
            self.transport.close()
            return
        if c.more_body and not c.response_started:
            self.transport.write(_timeout_response("body", self.body_timeout_s))
            c.disconnected = True  # the handler sees a disconnect; its answer is dropped
            c.message_event.set()
            self.transport.close()


def protocol_class(header_timeout_s: float, body_timeout_s: float,
                   stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S) -> type:
    """uvicorn's ``http`` protocol with these header, body and stall deadlines."""
    return type("DeadlineH11Protocol", (_DeadlineProtocol,),
                {"header_timeout_s": float(header_timeout_s),
                 "body_timeout_s": float(body_timeout_s),
                 "stall_timeout_s": float(stall_timeout_s)})

"""Hostile clients for benchmarks/soak.py (``--hostile N``): slow readers and bad input.

Each of the N clients loops until the soak ends, picking one of:

* ``slow_reader``: a streamed completion on a raw socket with a 4 KiB receive
  buffer that reads nothing (the server must abort it after its stall
  timeout and free its pages), or one that reads 4 KiB a second (served);
* ``slow_headers``: sends half a request line and then nothing (408 expected);
* ``bad_input``: one of a list of malformed or hostile bodies (broken JSON,
  ``messages: []``, a 5,000-rule chained grammar, the ``(a{1000}){1000}``
  regex, logit_bias keys that are not ids, a prompt id beyond the vocabulary);
  a 4xx is the expected answer;
* ``grammar_ok``: a small regex-constrained completion (200 expected).

An outcome is ``ok`` when the server answered as expected, ``failed`` for an
unexpected status (any 5xx) or a broken connection where an answer was due,
``hung`` when nothing came within the request timeout (the soak's
``--request-timeout``: a streamed request may wait minutes in the queue behind
the other clients before its first byte).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time

TCP_ESTABLISHED = 1  # tcp_info.tcpi_state (Linux)
CHAINED = "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(5000)) + 'r5000: "b"\n'

BAD_BODIES = [
    ("/v1/completions", b'{"prompt": "x", "max_tokens": '),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 4,
                              "structured_outputs": {"grammar": CHAINED}}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 4,
                         "structured_outputs": {"regex": "(a{1000}){1000}"}}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 4, "logit_bias": {"abc": 1}}),
    ("/v1/completions", {"prompt": [10**7], "max_tokens": 4}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 4, "stop": [""]}),
    ("/v1/completions", {"prompt": "a", "n": "3"}),
]


def _request(host: str, port: int, path: str, body, api_key: str | None) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


async def _status(reader: asyncio.StreamReader, timeout: float) -> int:
    line = await asyncio.wait_for(reader.readline(), timeout)
    parts = line.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


async def _open(host: str, port: int):
    return await asyncio.open_connection(host, port)


async def slow_reader(host, port, api_key, rng, timeout) -> str:
    body = {"prompt": "Tell me a long story.", "stream": True, "max_tokens": 400,
            "ignore_eos": True, "logprobs": 5}
    if rng.random() < 0.5:  # reads 4 KiB a second: slow, but never stalled
        reader, writer = await _open(host, port)
        writer.write(_request(host, port, "/v1/completions", body, api_key))
        try:
            if await _status(reader, timeout) != 200:
                return "failed"
            t_end = time.monotonic() + timeout
            while time.monotonic() < t_end:
                data = await asyncio.wait_for(reader.read(4096), timeout)
                if not data:
                    return "ok"
                if b"data: [DONE]" in data:
                    return "ok"
                await asyncio.sleep(1.0)
            return "hung"
        except asyncio.TimeoutError:
            return "hung"
        except ConnectionError:
            return "failed"
        finally:
            writer.close()
    return await _never_reads(host, port, api_key, body, timeout)


async def _never_reads(host, port, api_key, body, timeout) -> str:
    """A raw socket that reads nothing: 'ok' once the server resets or closes it."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, (host, port))
        await loop.sock_sendall(sock, _request(host, port, "/v1/completions", body, api_key))
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            await asyncio.sleep(1.0)
            # The TCP state, not a peek: a peek keeps returning the unread bytes of a
            # connection the server has already reset.
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
            if state != TCP_ESTABLISHED:  # reset or closed by the server: after a 200?
                try:
                    head = sock.recv(12, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except OSError:
                    head = b""
                return "ok" if not head or head.startswith(b"HTTP/1.1 200") else "failed"
        return "hung"
    finally:
        sock.close()


async def slow_headers(host, port, api_key, rng, timeout) -> str:
    reader, writer = await _open(host, port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    try:
        status = await _status(reader, timeout)
        return "ok" if status == 408 else "failed"
    except asyncio.TimeoutError:
        return "hung"
    except ConnectionError:
        return "failed"
    finally:
        writer.close()


async def bad_input(host, port, api_key, rng, timeout) -> str:
    path, body = rng.choice(BAD_BODIES)
    return await _expect(host, port, api_key, path, body, range(400, 500), timeout)


async def grammar_ok(host, port, api_key, rng, timeout) -> str:
    body = {"prompt": "A phone number:", "max_tokens": 12,
            "structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}}
    return await _expect(host, port, api_key, "/v1/completions", body, (200,), timeout)


async def _expect(host, port, api_key, path, body, statuses, timeout) -> str:
    reader, writer = await _open(host, port)
    writer.write(_request(host, port, path, body, api_key))
    await writer.drain()
    try:
        status = await _status(reader, timeout)
        return "ok" if status in statuses else "failed"
    except asyncio.TimeoutError:
        return "hung"
    except ConnectionError:
        return "failed"
    finally:
        writer.close()


KINDS = [(slow_reader, 0.3), (slow_headers, 0.1), (bad_input, 0.45), (grammar_ok, 0.15)]


async def hostile_clients(base: str, api_key: str | None, clients: int, t_end: float,
                          timeout: float, seed: int) -> list[dict]:
    """Run ``clients`` hostile loops until ``t_end``; one record per attempt."""
    host, port = base.split("//")[1].rsplit(":", 1)
    records: list[dict] = []

    async def loop(i: int):
        rng = random.Random(seed * 7919 + i)
        while time.time() < t_end:
            fn = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
            try:
                outcome = await fn(host, int(port), api_key, rng, timeout)
            except Exception as e:  # noqa: BLE001 - recorded
                outcome = f"failed ({type(e).__name__})"
            records.append({"kind": fn.__name__, "outcome": outcome.split(" ")[0]})

    await asyncio.gather(*(loop(i) for i in range(clients)))
    return records


def summary(records: list[dict]) -> dict:
    out: dict = {}
    for r in records:
        d = out.setdefault(r["kind"], {"ok": 0, "failed": 0, "hung": 0})
        d[r["outcome"]] = d.get(r["outcome"], 0) + 1
    return out

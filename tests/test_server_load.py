"""Bounded load: 32 concurrent streaming clients for 30 s on loopback; nothing hangs, no page leaks."""

from __future__ import annotations

import asyncio
import time

import pytest

pytestmark = pytest.mark.slow

CLIENTS = 32
DURATION_S = 30.0


def test_concurrent_streaming_clients(server):
    stats = {"ok": 0, "dropped": 0, "failed": [], "tokens": 0}

    async def client_loop(i: int, client, t_end: float):
        k = 0
        while time.time() < t_end:
            k += 1
            drop = (i % 8 == 0) and k % 2 == 1  # some clients walk away mid-stream
            try:
                stream = await client.completions.create(
                    model=server.model, prompt=f"Client {i} request {k}: once upon a time",
                    max_tokens=6 + (i % 5), temperature=0.8, seed=i * 100 + k, stream=True,
                    stream_options={"include_usage": True})
                n_chunks, finish, usage = 0, None, None
                async for chunk in stream:
                    n_chunks += 1
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for ch in chunk.choices:
                        finish = ch.finish_reason or finish
                    if drop and n_chunks == 2:
                        await stream.close()
                        break
                if drop:
                    stats["dropped"] += 1
                else:
                    assert finish in ("stop", "length") and usage is not None, (finish, usage)
                    stats["ok"] += 1
                    stats["tokens"] += usage.completion_tokens
            except Exception as e:  # noqa: BLE001 - must be a clear error, recorded
                stats["failed"].append(f"{type(e).__name__}: {e}")

    async def main():
        client = server.async_client(timeout=120.0)
        t_end = time.time() + DURATION_S
        await asyncio.wait_for(
            asyncio.gather(*(client_loop(i, client, t_end) for i in range(CLIENTS))),
            timeout=DURATION_S + 150)
        await client.close()

    t0 = time.time()
    asyncio.run(main())
    elapsed = time.time() - t0
    print(f"load: {stats['ok']} ok, {stats['dropped']} dropped, {len(stats['failed'])} failed, "
          f"{stats['tokens']} tokens in {elapsed:.1f}s")
    assert elapsed >= DURATION_S
    assert not stats["failed"], stats["failed"][:5]
    assert stats["ok"] >= CLIENTS - CLIENTS // 8 and stats["dropped"] >= CLIENTS // 8
    m = server.wait_idle(timeout=60)
    assert m["pagedjax:kv_pages_held"] == 0
    st, body = server.raw("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert st == 200, body

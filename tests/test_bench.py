"""The load generator against a scripted SGLang-like server on loopback.

The fake server streams chunks carrying known token counts at known moments, so the
test can check what the generator derives (TTFT, ITLs, output tokens, failures,
concurrency) against what it was sent.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from aiohttp import web

from dynspec.live.bench import (Prompt, PromptError, file_prompts, output_digest, random_prompts, read_requests,
                                run_level_async, write_requests)
from dynspec.results import summarize

# Cumulative token counts of the chunks of one normal request: chunk 2 carries 2 tokens,
# chunk 3 carries 3 (a speculative step's accepted tokens arrive together).
CHUNKS = [1, 3, 6, 7]
GAP = 0.02


def greedy_ids(prompt: list[int], n: int, wrong: bool = False) -> list[int]:
    """The fake server's greedy tokens: a function of the prompt (cumulative, as SGLang streams)."""
    ids = [(sum(prompt) + 7 * k) % 101 for k in range(n)]
    if wrong and ids:
        ids[-1] += 1
    return ids


class FakeServer:
    def __init__(self, mode=lambda body: "ok"):
        self.mode = mode
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict] = []

    async def generate(self, request: web.Request):
        body = await request.json()
        self.bodies.append(body)
        mode = self.mode(body)
        if mode == "http500":
            return web.Response(status=500, text="boom: out of memory")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if mode == "hang":
                await asyncio.sleep(5)
            n = body["sampling_params"]["max_new_tokens"]
            counts = [c for c in CHUNKS if c < n] + [n]
            for i, c in enumerate(counts):
                await asyncio.sleep(GAP)
                # Cumulative text that contains the key we search for, escaped as JSON does.
                meta = {"prompt_tokens": len(body.get("input_ids", [])) or 5, "completion_tokens": c,
                        "finish_reason": None}
                if i == len(counts) - 1:
                    meta["finish_reason"] = ({"type": "abort", "message": "evicted"} if mode == "abort"
                                             else {"type": "length", "length": n})
                chunk = {"text": '"completion_tokens": 999 ' * c, "meta_info": meta,
                         "output_ids": greedy_ids(body.get("input_ids", []), c, wrong=mode == "wrong")}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.in_flight -= 1

    async def completions(self, request: web.Request):
        body = await request.json()
        self.bodies.append(body)
        n = body["max_tokens"]
        per_chunk_usage = self.mode(body) == "usage"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for c in range(1, n + 1):
            await asyncio.sleep(GAP / 4)
            chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
            if per_chunk_usage:
                chunk["usage"] = {"prompt_tokens": 9, "completion_tokens": c, "total_tokens": 9 + c}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        final = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": n, "total_tokens": 9 + n}}
        await resp.write(b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    async def chat(self, request: web.Request):
        body = await request.json()
        self.bodies.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        # The role chunk carries no token (empty content); then one token per content chunk.
        deltas = [{"role": "assistant", "content": ""}] + [{"content": "y"}] * body["max_tokens"]
        for d in deltas:
            await asyncio.sleep(GAP / 4)
            await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": d}]}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def with_server(fake: FakeServer, fn):
    app = web.Application()
    app.router.add_post("/generate", fake.generate)
    app.router.add_post("/v1/completions", fake.completions)
    app.router.add_post("/v1/chat/completions", fake.chat)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        return await fn(f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


def run(fake, prompts, concurrency, **kw):
    return asyncio.run(with_server(fake, lambda url: run_level_async(url, prompts, concurrency, **kw)))


def test_token_counts_ttft_and_itls_follow_bench_serving():
    fake = FakeServer()
    prompts = random_prompts(6, 16, 7, seed=1)
    res = run(fake, prompts, 3)
    assert len(res.requests) == 6 and res.failed == 0 and not res.timed_out
    for r in res.requests:
        assert r.ok and r.output_tokens == 7 and r.input_tokens == 16
        # One ITL per token after the first; a chunk of k tokens gives k equal gaps.
        assert len(r.itls) == 6
        assert r.itls[0] == r.itls[1] and r.itls[2] == r.itls[3] == r.itls[4]
        assert r.ttft >= GAP * 0.9
        assert sum(r.itls) >= 3 * GAP * 0.9
        assert r.ttft + sum(r.itls) <= r.e2e + 1e-9
    m = summarize(res.requests)
    assert m["completed"] == 6 and m["total_output_tokens"] == 42
    tpots = [(r.e2e - r.ttft) / 6 for r in res.requests]
    assert m["mean_tpot_ms"] == pytest.approx(1000 * sum(tpots) / 6)
    # The request carried what bench_serving sends: ids, greedy, ignore_eos, streaming.
    body = fake.bodies[0]
    assert body["input_ids"] == list(prompts[0].input_ids) and body["stream"] is True
    assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 7, "ignore_eos": True}


def test_closed_loop_holds_exactly_c_in_flight():
    fake = FakeServer()
    res = run(fake, random_prompts(12, 4, 7, seed=2), 4)
    assert fake.max_in_flight == 4
    assert len(res.requests) == 12
    # Closed loop: each of the 4 workers starts its next request when its last one ends.
    starts = sorted(r.start for r in res.requests)
    assert starts[4] >= min(r.end for r in res.requests) - 1e-6


def test_warmup_requests_are_sent_but_not_measured():
    fake = FakeServer()
    res = run(fake, random_prompts(3, 4, 40, seed=3), 2, warmup=2)
    assert len(fake.bodies) == 5 and len(res.requests) == 3 and len(res.warmup) == 2
    assert sorted(b["sampling_params"]["max_new_tokens"] for b in fake.bodies) == [32, 32, 40, 40, 40]


def test_failures_are_counted_never_hidden():
    def mode(body):
        return {0: "ok", 1: "http500", 2: "abort"}[body["input_ids"][0] % 3]

    prompts = [Prompt(7, input_ids=(i, 5, 5)) for i in range(9)]
    res = run(FakeServer(mode), prompts, 3)
    assert len(res.requests) == 9 and res.failed == 6
    by_kind = {p.input_ids[0] % 3: r for p, r in zip(prompts, res.requests)}
    assert by_kind[0].ok
    assert not by_kind[1].ok and by_kind[1].error.startswith("HTTP 500: boom")
    assert not by_kind[2].ok and "aborted by server: evicted" in by_kind[2].error
    m = summarize(res.requests, error=res.error_summary())
    assert m["completed"] == 3 and m["failed"] == 6
    assert m["error"].startswith("6 of 9 requests failed")


def test_request_timeout_and_level_timeout():
    fake = FakeServer(lambda body: "hang" if body["input_ids"][0] == 0 else "ok")
    res = run(fake, [Prompt(3, input_ids=(0,)), Prompt(3, input_ids=(1,))], 2, request_timeout=0.3)
    assert [r.ok for r in res.requests] == [False, True]
    assert res.requests[0].error == "request timed out after 0.3s"

    res = run(FakeServer(lambda body: "hang"), [Prompt(3, input_ids=(i,)) for i in range(5)], 2,
              level_timeout=0.4)
    assert res.timed_out and len(res.requests) == 2 and res.not_sent == 3
    assert all(not r.ok and r.error == "cancelled: level timed out" for r in res.requests)
    assert res.error_summary(0.4).startswith("level timed out after 0.4s; 3 requests not sent; 2 of 2")


def test_should_stop_ends_the_level_early():
    calls = []

    def stop():
        calls.append(1)
        return len(calls) > 2

    res = run(FakeServer(), random_prompts(10, 4, 3, seed=4), 1, should_stop=stop)
    assert res.stopped and len(res.requests) == 2 and res.not_sent == 8


def test_connection_refused_is_a_failed_request():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    res = asyncio.run(run_level_async(f"http://127.0.0.1:{port}", random_prompts(3, 4, 3), 2))
    assert len(res.requests) == 3 and res.failed == 3
    assert "ClientConnectorError" in res.requests[0].error or "Connect" in res.requests[0].error


@pytest.mark.parametrize("mode, itl_count", [("usage", 4), ("plain", 4)])
def test_openai_completions(mode, itl_count):
    fake = FakeServer(lambda body: mode)
    res = run(fake, [Prompt(5, text="hello there")], 1, api="openai", model="m")
    (r,) = res.requests
    assert r.ok and r.output_tokens == 5 and r.input_tokens == 9 and len(r.itls) == itl_count
    body = fake.bodies[0]
    assert body["prompt"] == "hello there" and body["max_tokens"] == 5 and body["model"] == "m"
    assert body["stream_options"]["include_usage"] is True


def test_chat_completions_count_content_chunks_not_the_role_chunk():
    fake = FakeServer()
    res = run(fake, [Prompt(4, text="hi")], 1, api="chat")
    (r,) = res.requests
    assert r.ok and r.output_tokens == 4 and len(r.itls) == 3 and r.ttft >= GAP / 2 * 0.9
    assert fake.bodies[0]["messages"] == [{"role": "user", "content": "hi"}]


def test_open_loop_sends_at_the_arrival_times_and_respects_the_cap():
    fake = FakeServer()
    prompts = random_prompts(6, 4, 3, seed=5)
    arrivals = [0.0, 0.0, 0.0, 0.0, 0.3, 0.3]
    res = run(fake, prompts, 2, arrivals=arrivals)
    assert res.failed == 0 and len(res.requests) == 6 and fake.max_in_flight == 2
    t0 = min(r.start for r in res.requests)
    starts = [r.start - t0 for r in res.requests]
    # Held back by the cap of 2: requests 2 and 3 start when 0 and 1 end (2 chunks, GAP apart).
    assert starts[2] >= 1.8 * GAP and starts[3] >= 1.8 * GAP
    assert all(s >= 0.3 - 0.01 for s in starts[4:])  # never before their arrival time

    fake = FakeServer()
    res = run(fake, prompts, 0, arrivals=[0.0] * 6)  # 0: no cap, every request at once
    assert res.failed == 0 and fake.max_in_flight == 6


def test_random_prompts_are_seeded_and_exact():
    a, b, c = random_prompts(4, 100, 9, seed=7), random_prompts(4, 100, 9, seed=7), random_prompts(4, 100, 9, seed=8)
    assert a == b and a != c
    assert all(len(p.input_ids) == 100 and p.output_len == 9 for p in a)
    assert all(1000 <= t < 32000 for p in a for t in p.input_ids)
    assert len({p.input_ids for p in a}) == 4


def test_file_prompts(tmp_path):
    j = tmp_path / "p.jsonl"
    j.write_text('{"prompt": "a"}\n\n{"input_ids": [1, 2, 3], "output_len": 4}\n')
    ps = file_prompts("jsonl", j, 5, 8, seed=0)
    assert len(ps) == 5 and {p.text for p in ps} >= {"a"} and any(p.input_ids == (1, 2, 3) for p in ps)
    assert {p.output_len for p in ps if p.text} == {8} and {p.output_len for p in ps if p.input_ids} == {4}

    s = tmp_path / "share.json"
    s.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a"}]},
                             {"conversations": [{"from": "human", "value": "lonely"}]}]))
    ps = file_prompts("sharegpt", s, 3, 16)
    assert [p.text for p in ps] == ["q1", "q1", "q1"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"promt": "typo"}\n')
    with pytest.raises(PromptError, match=r"bad.jsonl:2: needs a non-empty prompt"):
        file_prompts("jsonl", bad, 1, 8)
    bad.write_text("not json\n")
    with pytest.raises(PromptError, match=r"bad.jsonl:1: not JSON"):
        file_prompts("jsonl", bad, 1, 8)


def test_generate_records_a_digest_of_the_greedy_tokens():
    """Same prompt, same tokens: same digest; another prompt or one wrong token: another."""
    prompts = random_prompts(4, 8, 5, seed=3)
    right, wrong = run(FakeServer(), prompts, 2), run(FakeServer(lambda body: "wrong"), prompts, 2)
    for p, r, w in zip(prompts, right.requests, wrong.requests):
        assert r.output_digest == output_digest(greedy_ids(list(p.input_ids), 5))
        assert len(r.output_digest) == 16 and w.output_digest != r.output_digest
    assert len({r.output_digest for r in right.requests}) == 4
    # The OpenAI APIs stream text deltas, not ids: no digest rather than a wrong one.
    res = asyncio.run(with_server(FakeServer(), lambda url: run_level_async(
        url, prompts[:1], 1, api="openai")))
    assert res.requests[0].ok and res.requests[0].output_digest == ""


def test_request_records_round_trip(tmp_path):
    res = run(FakeServer(), random_prompts(3, 4, 5), 2)
    path = write_requests(tmp_path / "r" / "x.jsonl", res.requests)
    back = read_requests(path)
    assert len(back) == 3 and min(r.start for r in back) == 0.0
    assert [r.output_tokens for r in back] == [5, 5, 5]
    assert [r.output_digest for r in back] == [r.output_digest for r in res.requests] and back[0].output_digest
    m1, m2 = summarize(res.requests), summarize(back)
    for k in ("output_throughput", "mean_ttft_ms", "p99_itl_ms"):
        assert math.isclose(m1[k], m2[k], rel_tol=1e-9)


# What the generator's HTTP path (aiohttp) and SSE reader must survive ---------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dynspec.live.bench import _SSEReader  # noqa: E402
from dynspec.results import RequestRecord  # noqa: E402


def _event(count: int) -> bytes:
    return b'data: {"text":"x","meta_info":{"prompt_tokens":3,"completion_tokens":%d}}\n\n' % count


async def _read_request(reader) -> bool:
    """Read one POST (head and body); False when the client closed the connection instead."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    n = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(b":")[1])
    await reader.readexactly(n)
    return True


def _reply(status: str, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status.encode(), len(body), body)


def run_raw(reply: bytes, prompts, concurrency=1, **kw):
    """The generator against a server that answers every request with `reply` and closes."""
    async def handle(reader, writer):
        if await _read_request(reader):
            writer.write(reply)
            await writer.drain()
        writer.close()

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        try:
            return await run_level_async(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", prompts,
                                         concurrency, **kw)
        finally:
            server.close()

    return asyncio.run(go())


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.integers(1, 400), min_size=1, max_size=8), cuts=st.lists(st.integers(0, 10_000), max_size=12),
       done=st.booleans(), newline=st.booleans())
def test_sse_reader_gives_the_same_tokens_for_any_split_of_the_stream(counts, cuts, done, newline):
    counts = sorted(set(counts))
    raw = b"".join(_event(c) for c in counts) + (b"data: [DONE]\n\n" if done else b"")
    if not newline:
        raw = raw.rstrip(b"\n")  # a last line without its newline still counts

    def read(pieces):
        rec = RequestRecord(start=0.0, end=0.0, input_tokens=0)
        sse = _SSEReader(rec, 0.0, False)
        for t, piece in enumerate(pieces, 1):
            sse.feed(piece, float(t))
        sse.close(float(len(pieces) + 1))
        return sse, rec

    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    sse, rec = read([raw[a:b] for a, b in zip(points, points[1:])])
    whole, _ = read([raw])
    assert sse.tokens == whole.tokens == counts[-1]
    assert sse.last_line == whole.last_line == _event(counts[-1]).rstrip(b"\n")
    # The first chunk sets TTFT; each later one gives one gap per token it carries.
    assert rec.ttft is not None and len(rec.itls) == counts[-1] - counts[0]


def test_a_truncated_stream_is_a_failed_request():
    # One token, then the server closes inside the chunked body.
    ev = _event(1)
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n40\r\nab" % (len(ev), ev)
    (r,) = run_raw(reply, [Prompt(4, input_ids=(1,))]).requests
    assert not r.ok and r.error.startswith("ClientPayloadError:") and r.ttft is not None


@pytest.mark.parametrize("reply, error", [
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "ClientResponseError:"),  # not HTTP
    (_reply("200 OK", b'data: {"meta_info": {}}\n\n'), "stream ended without a token"),  # framed, no token
    (_reply("503 Service Unavailable", b"loading\n  model" + b"." * 386),
     "HTTP 503: loading model" + "." * 285),  # a non-200's body: its first 300 characters, whitespace folded
])
def test_malformed_replies_are_failed_requests_with_a_reason(reply, error):
    res = run_raw(reply, [Prompt(4, input_ids=(1,)), Prompt(4, input_ids=(2,))])
    assert res.failed == 2 and all(r.error.startswith(error) for r in res.requests), res.requests[0].error
    if error.startswith("HTTP"):
        assert res.requests[0].error == error


def test_connections_are_reused_across_requests():
    class PeerRecording(FakeServer):
        def __init__(self):
            super().__init__()
            self.seen = set()

        async def generate(self, request):
            self.seen.add(request.transport.get_extra_info("peername"))
            return await super().generate(request)

    fake = PeerRecording()
    res = run(fake, random_prompts(12, 4, 3), 3)
    assert res.failed == 0 and len(fake.seen) == 3  # one keep-alive connection per worker


@pytest.mark.parametrize("url", ["127.0.0.1:30000", "ftp://h:1", "http://", "http://h:port"])
def test_a_bad_base_url_is_a_one_line_error(url):
    with pytest.raises(ValueError, match=r"not an http://host:port URL"):
        asyncio.run(run_level_async(url, random_prompts(1, 4, 3), 1))


def test_a_kept_alive_connection_closed_by_the_server_is_retried_once():
    # Each connection answers one request, then reads the next and closes without a word
    # (a keep-alive timeout racing the reuse): the generator must resend on a fresh connection.
    served, dropped = [], []

    async def handle(reader, writer):
        await _read_request(reader)
        served.append(1)
        ev = _event(1)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(ev), ev))
        await writer.drain()
        if await _read_request(reader):
            dropped.append(1)
        writer.close()

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        try:
            return await run_level_async(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}",
                                         random_prompts(3, 4, 1), 1)
        finally:
            server.close()

    res = asyncio.run(go())
    assert res.failed == 0 and len(res.requests) == 3, res.error_summary()
    assert len(served) == 3 and len(dropped) == 2


def test_a_load_that_moves_follows_each_prompts_cap():
    fake = FakeServer()
    caps = [1] * 2 + [4] * 8 + [1] * 2  # C 1 -> 4 -> 1
    res = run(fake, random_prompts(12, 4, 3, seed=6), 4, caps=caps)
    assert res.failed == 0 and len(res.requests) == 12 and fake.max_in_flight == 4
    r = res.requests  # in prompt order
    assert r[1].start >= r[0].end - 1e-6  # one at a time in the first phase
    assert max(x.start for x in r[2:5]) < r[1].end  # the load rises at once: 1, 2, 3, 4 in flight together
    assert r[10].start >= max(x.end for x in r[:10]) - 1e-6  # the load drops back to one
    assert r[11].start >= r[10].end - 1e-6
    with pytest.raises(ValueError, match="one cap of at least 1 per prompt"):
        run(fake, random_prompts(3, 4, 3, seed=6), 2, caps=[1, 0, 1])

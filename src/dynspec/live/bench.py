"""The load generator: closed-loop streaming requests against SGLang's /generate or /v1/completions.

C workers, each with its own keep-alive connection, take the next prompt as soon as
their last request ends (closed loop at maximum concurrency C, like sglang.bench_serving
with --max-concurrency C and an infinite request rate).  Per request it keeps what
bench_serving keeps: dispatch and completion times, TTFT, inter-token latencies (a
chunk carrying k tokens gives k gaps of gap/k) and the output tokens as the server
counts them (meta_info.completion_tokens / usage.completion_tokens), so no tokenizer
is needed; from /generate also a digest of the generated token ids, so greedy outputs can be
compared across arms (dynspec.live.identity).  Failed and timed-out requests are recorded as
such, never dropped.

HTTP is aiohttp's client: one ClientSession per level, the body read with readany() (all
bytes that have arrived, in one await) and handed to an SSE reader that splits lines
itself.  Chunks are not JSON-parsed on the hot path (the token count is found with a byte
search); only a request's last chunk is parsed.  Client CPU per token is measured by
benchmarks/bench_loadgen.py (docs/GPU_NODE.md, "Load generator").
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import aiohttp

from dynspec.results import RequestRecord

# Matched unescaped (quote, name, quote, colon), so generated text containing it -- which
# JSON escapes as \"completion_tokens\": -- cannot fool the search.
_KEY = b'"completion_tokens":'
_DATA = b"data:"
_DONE = b"[DONE]"
_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
_MAX_ERROR_BODY = 64 * 1024


def _leading_int(b: bytes, i: int) -> int:
    """The integer at b[i:] (spaces skipped): the token count after the key; -1 if none."""
    n = len(b)
    while i < n and b[i] == 32:
        i += 1
    j = i
    while j < n and 48 <= b[j] <= 57:
        j += 1
    return int(b[i:j]) if j > i else -1


# Prompts live in dynspec.live.prompts; imported here for the callers that know them from here.
from dynspec.live.prompts import Prompt, PromptError, build_prompts, file_prompts, random_prompts  # noqa: E402,F401


API_PATHS = {"generate": "/generate", "openai": "/v1/completions", "chat": "/v1/chat/completions"}


# Requests --------------------------------------------------------------------------------

def _payload(api: str, prompt: Prompt, model: str | None) -> dict:
    if api == "generate":
        body: dict = {"sampling_params": {"temperature": 0.0, "max_new_tokens": prompt.output_len,
                                          "ignore_eos": True},
                      "stream": True}
        if prompt.input_ids is not None:
            body["input_ids"] = list(prompt.input_ids)
        else:
            body["text"] = prompt.text
        return body
    if api == "chat":
        if prompt.text is None:
            raise ValueError("api chat sends text prompts, not token ids")
        body = {"messages": [{"role": "user", "content": prompt.text}]}
    else:
        body = {"prompt": list(prompt.input_ids) if prompt.input_ids is not None else prompt.text}
    body.update({"max_tokens": prompt.output_len, "temperature": 0.0, "ignore_eos": True, "stream": True,
            # Per-chunk token counts where the server gives them (vLLM, SGLang), else the final usage.
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    if model:
        body["model"] = model
    return body


def output_digest(ids: list) -> str:
    """16 hex digits naming a token-id sequence (two differ only by chance: 2^-64)."""
    return hashlib.blake2b(json.dumps(ids, separators=(",", ":")).encode(), digest_size=8).hexdigest()


def _final_check(api: str, last: bytes, rec: RequestRecord) -> None:
    """Read what only the last chunk says: abort/error, prompt tokens, final token count."""
    try:
        obj = json.loads(last)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, a 5000-digit number, nesting: nothing to read
        return
    if not isinstance(obj, dict):
        return
    if "error" in obj:
        rec.ok, rec.error = False, f"server error: {json.dumps(obj['error'])[:300]}"
        return
    if api == "generate":
        meta = obj.get("meta_info") or {}
        rec.input_tokens = int(meta.get("prompt_tokens") or rec.input_tokens)
        ids = obj.get("output_ids")  # SGLang streams the ids generated so far in every chunk
        if isinstance(ids, list):
            rec.output_digest = output_digest(ids)
        fr = meta.get("finish_reason")
        if isinstance(fr, dict) and fr.get("type") == "abort":
            rec.ok, rec.error = False, f"aborted by server: {str(fr.get('message', ''))[:300]}"
    else:
        usage = obj.get("usage") or {}
        if usage.get("prompt_tokens"):
            rec.input_tokens = int(usage["prompt_tokens"])
        if usage.get("completion_tokens"):
            rec.output_tokens = int(usage["completion_tokens"])


class _SSEReader:
    """Turns a streamed body into token counts and inter-token gaps, as bytes arrive.

    Handles every complete `data:` line of each read; lines that arrived together share
    one timestamp, exactly as they would read line by line.
    """

    __slots__ = ("rec", "start", "openai", "pending", "tokens", "last_t", "last_line")

    def __init__(self, rec: RequestRecord, start: float, openai: bool):
        self.rec, self.start, self.openai = rec, start, openai
        self.pending = b""
        self.tokens = 0
        self.last_t = start
        self.last_line = b""  # only the last data line is ever JSON-parsed

    def feed(self, data: bytes, now: float) -> None:
        lines = (self.pending + data).split(b"\n") if self.pending else data.split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            if not line.startswith(_DATA):
                continue
            i = line.rfind(_KEY)
            if i >= 0:
                n = _leading_int(line, i + len(_KEY))
                self.last_line = line
            elif line[5:].strip() in (b"", _DONE):
                continue
            else:
                self.last_line = line
                if self.openai and _has_text(line):
                    n = self.tokens + 1  # no per-chunk usage: one token per text chunk
                else:
                    continue
            new = n - self.tokens
            if new <= 0:
                continue
            rec = self.rec
            if rec.ttft is None:
                rec.ttft = now - self.start
            else:
                gap = (now - self.last_t) / new
                rec.itls.extend([gap] * new)
            self.tokens, self.last_t = n, now

    def close(self, now: float) -> None:
        if self.pending:  # a last line without its newline
            self.feed(b"\n", now)


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> aiohttp.ClientResponse:
    try:
        return await session.post(url, data=body, headers=_HEADERS)
    except aiohttp.ClientConnectorError:
        raise  # could not connect at all: nothing to retry
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
        # A kept-alive connection the server closed just as it was reused: no response head came.
        # aiohttp retries that only for idempotent methods (the same two errors), so resend this POST once.
        return await session.post(url, data=body, headers=_HEADERS)


async def _one_request(session: aiohttp.ClientSession, url: str, api: str, prompt: Prompt, model: str | None,
                       timeout: float | None) -> RequestRecord:
    clock = time.perf_counter
    start = clock()  # dispatch: the clock runs from here, connection set-up included
    rec = RequestRecord(start=start, end=start, input_tokens=prompt.input_len)
    sse = _SSEReader(rec, start, api != "generate")
    try:
        resp = await _post(session, url, json.dumps(_payload(api, prompt, model)).encode())
        try:
            if resp.status != 200:
                text = (await resp.content.read(_MAX_ERROR_BODY)).decode(errors="replace")[:300]
                rec.ok, rec.error = False, f"HTTP {resp.status}: {' '.join(text.split())}"
            else:
                read = resp.content.readany  # everything that has arrived: lines read together share a time
                while data := await read():
                    sse.feed(data, clock())
                sse.close(clock())
                rec.output_tokens = sse.tokens
                if sse.last_line:
                    _final_check(api, sse.last_line[5:].strip(), rec)
                if rec.ok and rec.output_tokens == 0:
                    rec.ok, rec.error = False, "stream ended without a token"
        except BaseException:
            resp.close()  # timed out, cancelled or broken mid-body: this connection is not reusable
            raise
        resp.release()
    except asyncio.TimeoutError:  # before OSError: on Python 3.11 it is the builtin TimeoutError, an OSError
        rec.ok, rec.error = False, f"request timed out after {timeout:g}s"
    except asyncio.CancelledError:
        rec.end = clock()
        rec.ok, rec.error = False, "cancelled: level timed out"
        raise _Cancelled(rec) from None
    except (OSError, aiohttp.ClientError) as exc:  # refused, reset, truncated or not HTTP: a failed request
        rec.ok, rec.error = False, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    rec.end = clock()
    return rec


def _has_text(line: bytes) -> bool:
    """A completion chunk with text, or a chat chunk with content (not the role chunk's empty one)."""
    for key in (b'"text"', b'"content"'):
        if key in line and key + b':""' not in line and key + b': ""' not in line:
            return True
    return False


class _Cancelled(Exception):
    def __init__(self, rec: RequestRecord):
        self.rec = rec


@dataclass
class LevelResult:
    """What one level produced: the measured requests (dispatch order) and how it ended."""

    requests: list[RequestRecord]
    warmup: list[RequestRecord] = field(default_factory=list)
    timed_out: bool = False
    stopped: bool = False  # should_stop said so (e.g. the server died)
    not_sent: int = 0

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.requests)

    def error_summary(self, level_timeout: float | None = None) -> str:
        """One line for the results row's error column; empty when every request succeeded."""
        parts = []
        if self.timed_out:
            parts.append(f"level timed out after {level_timeout:g}s" if level_timeout else "level timed out")
        if self.stopped:
            parts.append("level stopped early")
        if self.not_sent:
            parts.append(f"{self.not_sent} requests not sent")
        bad = [r for r in self.requests if not r.ok]
        if bad:
            parts.append(f"{len(bad)} of {len(self.requests)} requests failed (first: {bad[0].error})")
        return "; ".join(parts)


async def run_level_async(base_url: str, prompts: Sequence[Prompt], concurrency: int, *, api: str = "generate",
                          model: str | None = None, warmup: int = 0, request_timeout: float = 600.0,
                          level_timeout: float | None = None, progress: bool = False, desc: str = "",
                          should_stop: Callable[[], bool] | None = None,
                          arrivals: Sequence[float] | None = None,
                          caps: Sequence[int] | None = None) -> LevelResult:
    """Run one level: warm-up requests first (not measured), then every prompt once.

    Closed loop (arrivals None): `concurrency` workers, each sending its next prompt when its last
    request ends; with `caps`, prompt i is sent as soon as fewer than caps[i] requests are in flight
    (a load that moves: the config's load_phases).  Open loop: prompt i is sent `arrivals[i]` seconds
    after the level starts (dynspec.sim.arrivals), at most `concurrency` in flight when it is >= 1
    (0: no cap); a request held back by the cap starts its clock when it is sent, as bench_serving's.
    """
    if api not in API_PATHS:
        raise ValueError(f"unknown api {api!r} ({', '.join(API_PATHS)})")
    if arrivals is None and concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if arrivals is not None and len(arrivals) != len(prompts):
        raise ValueError(f"{len(arrivals)} arrival times for {len(prompts)} prompts")
    if caps is not None and (arrivals is not None or len(caps) != len(prompts) or min(caps, default=1) < 1):
        raise ValueError("caps: one cap of at least 1 per prompt, closed loop only")
    url = _level_url(base_url, api)
    timeout = request_timeout
    result = LevelResult(requests=[])
    # The pool covers every request this level has in flight at once, so none waits inside aiohttp for
    # a connection (that wait would count as TTFT); 0 is no limit, for an open loop without a cap.
    limit = 0 if concurrency < 1 else max(concurrency, warmup)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit),
                                    timeout=aiohttp.ClientTimeout(total=timeout))  # the whole request, body included
    try:
        if warmup and prompts:
            wp = [Prompt(min(p.output_len, 32), p.input_ids, p.text) for p in prompts[:warmup]]
            while len(wp) < warmup:
                wp.append(wp[len(wp) % len(prompts)])
            result.warmup = await asyncio.gather(
                *(_one_request(session, url, api, p, model, timeout) for p in wp))

        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(prompts), desc=desc or f"C={concurrency}", unit="req", leave=False,
                       mininterval=0.5)
        slots: list[RequestRecord | None] = [None] * len(prompts)

        async def send(i: int) -> None:
            try:
                slots[i] = await _one_request(session, url, api, prompts[i], model, timeout)
            except _Cancelled as c:
                slots[i] = c.rec
                raise asyncio.CancelledError from None
            if bar is not None:
                bar.update(1)

        if caps is not None:
            tasks = [asyncio.ensure_future(_phased_loop(send, caps, should_stop, result))]
        elif arrivals is None:
            todo = iter(range(len(prompts)))

            async def worker() -> None:
                for i in todo:
                    if should_stop is not None and should_stop():
                        result.stopped = True
                        return
                    await send(i)

            tasks = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(prompts)))]
        else:
            tasks = [asyncio.ensure_future(_open_loop(send, arrivals, concurrency, should_stop, result))]
        done, pending = await asyncio.wait(tasks, timeout=level_timeout)
        if pending:
            result.timed_out = True
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            if not t.cancelled() and (exc := t.exception()) is not None:
                raise exc
        if bar is not None:
            bar.close()
    finally:
        await session.close()
    result.requests = [r for r in slots if r is not None]
    result.not_sent = len(prompts) - len(result.requests)
    return result


def _level_url(base_url: str, api: str) -> str:
    """The endpoint's URL; a base URL that is not http(s)://host[:port][/prefix] is a one-line error."""
    from urllib.parse import urlsplit

    u = urlsplit(base_url)
    try:
        u.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
    except ValueError:
        u = u._replace(netloc="")
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{base_url}: not an http://host:port URL")
    return base_url.rstrip("/") + API_PATHS[api]


async def _cancel_all(tasks: list[asyncio.Future]) -> None:
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


async def _open_loop(send, arrivals: Sequence[float], cap: int, should_stop, result: LevelResult) -> None:
    """Send request i at arrivals[i] (s from now), at most `cap` in flight (0: no cap)."""
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(cap) if cap >= 1 else None
    t0 = loop.time()
    tasks: list[asyncio.Future] = []

    async def one(i: int) -> None:
        if sem is None:
            return await send(i)
        async with sem:
            if should_stop is not None and should_stop():
                result.stopped = True
                return
            await send(i)

    try:
        for i, at in enumerate(arrivals):
            if should_stop is not None and should_stop():
                result.stopped = True
                break
            delay = t0 + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(i)))
        if tasks:
            await asyncio.gather(*tasks)
    finally:  # cancelled (level timeout) or failed: no request left running
        await _cancel_all(tasks)


async def _phased_loop(send, caps: Sequence[int], should_stop, result: LevelResult) -> None:
    """Closed loop whose concurrency moves: prompt i is sent once fewer than caps[i] are in flight."""
    in_flight = 0
    freed = asyncio.Event()
    tasks: list[asyncio.Future] = []

    async def one(i: int) -> None:
        nonlocal in_flight
        try:
            await send(i)
        finally:
            in_flight -= 1
            freed.set()

    try:
        for i, cap in enumerate(caps):
            while in_flight >= cap:
                freed.clear()
                await freed.wait()
            if should_stop is not None and should_stop():
                result.stopped = True
                break
            in_flight += 1
            tasks.append(asyncio.ensure_future(one(i)))
        if tasks:
            await asyncio.gather(*tasks)
    finally:  # cancelled (level timeout) or failed: no request left running
        await _cancel_all(tasks)


def run_level(base_url: str, prompts: Sequence[Prompt], concurrency: int, **kwargs) -> LevelResult:
    """Synchronous wrapper of run_level_async (its own event loop)."""
    return asyncio.run(run_level_async(base_url, prompts, concurrency, **kwargs))


def write_requests(path: str | Path, requests: Iterable[RequestRecord]) -> Path:
    """Per-request records as JSONL, times relative to the level's first dispatch; atomic."""
    from dynspec.io.atomic import write_text

    reqs = list(requests)
    t0 = min((r.start for r in reqs), default=0.0)
    lines = []
    for r in reqs:
        d = r.to_dict()
        d["start"], d["end"] = r.start - t0, r.end - t0
        lines.append(json.dumps(d) + "\n")
    return write_text(path, "".join(lines))


def read_requests(path: str | Path) -> list[RequestRecord]:
    """A level's per-request records, as write_requests wrote them (or gzipped: .jsonl.gz)."""
    import gzip

    path = Path(path)
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        return [RequestRecord(**json.loads(line)) for line in f if line.strip()]

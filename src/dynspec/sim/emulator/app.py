"""SGLang's HTTP routes over one Emulator: an EmulatorApp holds what the handlers share (the
emulator, its config, the generated text) and each route is one of its methods.

aiohttp is imported where it is used, so that `dynspec --help` (which imports every
subcommand's module) does not load it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from functools import lru_cache, partial

from dynspec.sim.emulator.api import (MAX_BODY_BYTES, BadRequest, Body, error_response, read_chat, read_completion,
                                  read_generate, read_json, usage_options)
from dynspec.sim.emulator.clock import Emulator, EmulatorConfig, Stream
from dynspec.sim.emulator.text import Text, openai_usage


@lru_cache(maxsize=1)
def emulator_key():
    """The application key under which make_app's app holds its Emulator."""
    from aiohttp import web

    return web.AppKey("dynspec_emulator", Emulator)


def make_app(profile, arm: str, *, time_scale: float = 1.0, seed: int = 0, host: str = "127.0.0.1",
             port: int = 30000, model_name: str | None = None, context_length: int = 131072,
             max_running_requests: int | None = None):
    """The aiohttp application; its engine loop starts and stops with the app."""
    cfg = EmulatorConfig(profile=profile.name, arm=arm, host=host, port=port, time_scale=time_scale, seed=seed,
                         model_name=model_name, context_length=context_length,
                         max_running_requests=max_running_requests)
    return EmulatorApp(Emulator(profile, cfg)).application()


async def _json_errors(request, handler):
    """Middleware: unknown paths and methods answer JSON, as every other error."""
    from aiohttp import web

    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, f"{request.method} {request.path}: {exc.reason}")


class EmulatorApp:
    """The routes of one emulated server; application() builds its aiohttp app."""

    def __init__(self, emu: Emulator):
        self.emu = emu
        self.cfg = emu.cfg
        self.text = Text()  # every request's output: the same words, sliced

    def application(self):
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[web.middleware(_json_errors)])
        app[emulator_key()] = self.emu
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        r = app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        for path in ("/get_model_info", "/model_info"):
            r.add_get(path, self.model_info)
        for path in ("/get_server_info", "/server_info"):
            r.add_get(path, self.server_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_post("/set_internal_state", self.set_internal_state)
        r.add_put("/set_internal_state", self.set_internal_state)
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        return app

    async def _on_startup(self, _app) -> None:
        await self.emu.start()

    async def _on_cleanup(self, _app) -> None:
        await self.emu.stop()

    # Info endpoints ---------------------------------------------------------------------
    async def health(self, _request):
        from aiohttp import web

        return web.Response(status=200 if self.emu.healthy else 503)

    async def model_info(self, _request):
        from aiohttp import web

        name = self.emu.model_name
        return web.json_response({
            "model_path": name, "tokenizer_path": name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": "dynspec-emulated", "architectures": None})

    async def server_info(self, _request):
        from aiohttp import web

        return web.json_response(self.emu.server_info())

    async def models(self, _request):
        from aiohttp import web

        name = self.emu.model_name
        return web.json_response({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
            "root": name, "parent": None, "max_model_len": self.cfg.context_length}]})

    async def metrics(self, _request):
        from aiohttp import web

        return web.Response(text=self.emu.metrics_text(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def flush_cache(self, _request):
        from aiohttp import web

        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. "
                                 "(When there are running or waiting requests, the operation will not be performed.)\n")

    async def set_internal_state(self, request):
        from aiohttp import web

        try:
            body = await read_json(request, Body)
        except BadRequest as exc:
            return error_response(exc.status, str(exc))
        args = (body.model_extra or {}).get("server_args")
        allowed = {"pp_max_micro_batch_size", "speculative_accept_threshold_single",
                   "speculative_accept_threshold_acc"}
        ok = isinstance(args, dict) and set(args) <= allowed
        if ok:
            self.emu.reset_accept_length()  # SGLang zeroes its accept-length accumulators here
        return web.json_response([ok])

    # Generation: shared steps -----------------------------------------------------------
    def _start(self, rid: str, input_len: int, output_len: int) -> Stream:
        """A new request's stream, submitted to the engine."""
        self.text.grow(output_len)
        stream = Stream(rid, input_len)
        self.emu.submit(stream, input_len, output_len)
        return stream

    async def _run_stream(self, request, stream: Stream, output_len: int, chunk):
        """Stream chunks as the engine publishes tokens; abort the request if the client goes."""
        from aiohttp import web

        emu = self.emu
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        sent = 0
        try:
            while True:
                if stream.visible > sent:
                    n = stream.visible
                    await resp.write(chunk(sent, n, stream.finished))
                    sent = n
                if stream.finished:
                    break
                await stream.wait()
            if sent < output_len:  # the engine failed under us
                await resp.write(b'data: {"error": {"message": "the emulator engine failed"}}\n\n')
            tail = chunk(sent, sent, True, final=True)
            await resp.write(tail + b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionError, RuntimeError, asyncio.CancelledError):
            emu.abort(stream)  # the client went away: stop generating for it
            raise
        finally:
            if not stream.finished:
                emu.abort(stream)
        return resp

    async def _wait_done(self, request, stream: Stream) -> bool:
        """Wait for a non-streamed request; False (aborted) if its client disconnects.  The
        connection is checked at every step's tokens and, between them, every second."""
        while not stream.finished:
            if request.transport is None or request.transport.is_closing():
                self.emu.abort(stream)
                return False
            try:
                await asyncio.wait_for(stream.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
        return True

    async def _whole(self, request, stream: Stream, output_len: int):
        """A non-streamed OpenAI request to its end: (tokens, None), or (0, the error response)."""
        from aiohttp import web

        if not await self._wait_done(request, stream):
            return 0, web.Response(status=499)
        if stream.visible < output_len:
            return 0, error_response(500, "the emulator engine failed", openai=True)
        return stream.visible, None

    def _meta(self, stream: Stream, n: int, finished: bool) -> str:
        fr = '{"type":"length","length":%d}' % n if finished else "null"
        return ('{"id":%s,"finish_reason":%s,"prompt_tokens":%d,"weight_version":"default",'
                '"total_retractions":0,"completion_tokens":%d,"cached_tokens":0' % (json.dumps(stream.rid), fr,
                                                                                  stream.prompt_tokens, n))

    def _meta_done(self, stream: Stream, n: int) -> dict:
        req = stream.req
        out = {"id": stream.rid, "finish_reason": {"type": "length", "length": n},
               "prompt_tokens": stream.prompt_tokens, "weight_version": "default", "total_retractions": 0,
               "completion_tokens": n, "cached_tokens": 0, "e2e_latency": time.time() - stream.created}
        if self.emu.policy_spec is not None and req is not None and req.spec_steps:
            # SGLang's per-request figures over this request's verify (speculative) steps
            out.update(spec_verify_ct=req.spec_steps, spec_accept_length=req.spec_tokens / req.spec_steps)
        return out

    # Generation endpoints ---------------------------------------------------------------
    async def generate(self, request):
        from aiohttp import web

        try:
            body, input_len, output_len = await read_generate(request, self.cfg.context_length)
        except BadRequest as exc:
            return error_response(exc.status, str(exc))
        text, stream = self.text, self._start(body.rid or uuid.uuid4().hex, input_len, output_len)
        if not body.stream:
            if not await self._wait_done(request, stream):
                return web.Response(status=499)
            n = stream.visible
            if n < output_len:
                return error_response(500, "the emulator engine failed")
            return web.json_response({"text": text.text_of(0, n), "output_ids": json.loads(f"[{text.ids_of(n)}]"),
                                      "meta_info": self._meta_done(stream, n)})

        def chunk(lo: int, hi: int, finished: bool, final: bool = False) -> bytes:
            if final:
                return b""  # SGLang's native stream has no separate usage chunk
            m = (self._meta(stream, hi, False) if not finished
                 else json.dumps(self._meta_done(stream, hi), separators=(",", ":"))[:-1])
            return ('data: {"text":"%s","output_ids":[%s],"meta_info":%s}}\n\n'
                    % (text.text_of(0, hi), text.ids_of(hi), m)).encode()

        return await self._run_stream(request, stream, output_len, chunk)

    async def _openai(self, request, read, rid_prefix: str, objects: tuple[str, str], whole, pieces):
        """The OpenAI routes' one shape: read and start, then either one JSON body, whose choice
        `whole(text)` gives, or SSE chunks, `pieces(lo, hi, finish_reason, usage)` giving each
        chunk's text after its common head.  `objects`: the body's and the chunks' "object"."""
        from aiohttp import web

        try:
            body, input_len, output_len = await read(request, self.cfg.context_length)
        except BadRequest as exc:
            return error_response(exc.status, str(exc), openai=True)
        text, stream = self.text, self._start(rid_prefix + uuid.uuid4().hex, input_len, output_len)
        created, model = int(time.time()), body.model or self.emu.model_name
        usage = partial(openai_usage, input_len)

        if not body.stream:
            n, failed = await self._whole(request, stream, output_len)
            if failed is not None:
                return failed
            return web.json_response({
                "id": stream.rid, "object": objects[0], "created": created, "model": model,
                "choices": [whole(text.text_of(0, n))], "usage": json.loads(usage(n)), "metadata": None})

        per_chunk, final_usage = usage_options(body.stream_options)
        head = ('data: {"id":%s,"object":"%s","created":%d,"model":%s,'
                % (json.dumps(stream.rid), objects[1], created, json.dumps(model)))

        def chunk(lo: int, hi: int, finished: bool, final: bool = False) -> bytes:
            if final:
                if not final_usage:
                    return b""
                return (head + '"choices":[],"usage":%s}\n\n' % usage(hi)).encode()
            fr = '"length"' if finished else "null"
            u = usage(hi) if per_chunk else "null"
            return "".join(head + p for p in pieces(text.text_of(lo, hi), fr, u)).encode()

        return await self._run_stream(request, stream, output_len, chunk)

    async def completions(self, request):
        def whole(content: str) -> dict:
            return {"index": 0, "text": content, "logprobs": None, "finish_reason": "length", "matched_stop": None}

        def pieces(content: str, fr: str, u: str) -> list[str]:
            return ['"choices":[{"index":0,"text":"%s","logprobs":null,"finish_reason":%s,'
                    '"matched_stop":null}],"usage":%s}\n\n' % (content, fr, u)]

        return await self._openai(request, read_completion, "", ("text_completion", "text_completion"),
                                  whole, pieces)

    async def chat_completions(self, request):
        def whole(content: str) -> dict:
            return {"index": 0, "message": {"role": "assistant", "content": content, "reasoning_content": None,
                                            "tool_calls": None},
                    "logprobs": None, "finish_reason": "length", "matched_stop": None}

        # As SGLang: the first chunk carries the role (and no content), then content deltas.
        first = [True]

        def pieces(content: str, fr: str, u: str) -> list[str]:
            out = []
            if first[0]:
                first[0] = False
                out.append('"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                           '"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n')
            out.append('"choices":[{"index":0,"delta":{"content":"%s"},"logprobs":null,'
                       '"finish_reason":%s,"matched_stop":null}],"usage":%s}\n\n' % (content, fr, u))
            return out

        return await self._openai(request, read_chat, "chatcmpl-", ("chat.completion", "chat.completion.chunk"),
                                  whole, pieces)

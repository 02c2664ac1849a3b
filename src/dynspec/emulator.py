"""An SGLang-compatible HTTP server running the step engine in real time.

`dynspec emulate` serves enough of SGLang 0.5.9's HTTP API that its own benchmark
client (`python -m sglang.bench_serving --backend sglang|sglang-oai`) and dynspec's
load generator work against it unchanged:

    GET  /health /health_generate /get_model_info /model_info /get_server_info
         /server_info /v1/models /metrics
    POST /generate          text or input_ids; sampling_params.max_new_tokens; streamed or not
    POST /v1/completions    prompt (text or token ids); max_tokens; streamed or not; usage,
                            stream_options.include_usage / continuous_usage_stats
    POST /v1/chat/completions  messages (text content); max_tokens / max_completion_tokens;
                            streamed (role, content deltas, finish) or not; usage as above
    POST /set_internal_state  (resets the accept-length average, as SGLang does)
    GET|POST /flush_cache

One asyncio task steps the engine: it computes a step, sleeps until the step's end
(profile time / time_scale), then publishes the step's tokens to every stream.  A
request arriving mid-step joins at the next step, as in SGLang.  If the server
falls behind (it cannot stream as fast as the scaled profile asks), the virtual
clock is re-based to the wall clock and the delay is counted in
dynspec_emulator_lag_seconds_total, so the emulator never bursts to catch up.

What it does not model: no tokenizer (a text prompt counts one token per 4 UTF-8
bytes, at least 1; token ids count one each); no EOS (every request generates
exactly max_new_tokens, finish_reason "length"); no sampling (temperature and the
like are accepted and ignored); generated text is a fixed cycle of English words,
one word per token.  A chat request's prompt is its messages laid out as
"role: content" lines ending in "assistant: ", counted as any text prompt.  Batch requests (lists of prompts) and n > 1 are refused.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import signal
import sys
import time
import uuid
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, field_validator

from dynspec.engine import Engine, Request
from dynspec.models import Model, validation_message
from dynspec.policy import FailSafePolicy, build_policy
from dynspec.sim import SIM_ARMS, arm_policy_spec

log = logging.getLogger("dynspec.emulator")

API_VERSION = "0.5.9"  # the SGLang release whose API is emulated
MAX_BODY_BYTES = 32 * 1024 * 1024  # larger request bodies get 413
GEN_THROUGHPUT_INTERVAL = 40  # decode steps per gen_throughput sample (SGLang's decode_log_interval)


class EmulatorConfig(Model):
    """What the emulator runs; served at /get_server_info under dynspec_emulator."""

    profile: str
    arm: str
    host: str = "127.0.0.1"
    port: int = Field(30000, ge=0, le=65535)
    time_scale: float = Field(1.0, gt=0, allow_inf_nan=False)  # X: X times faster than the profile
    seed: int = 0
    model_name: str | None = None  # default: the profile's model
    context_length: int = Field(131072, ge=2)
    max_running_requests: int | None = Field(None, ge=1)

    @field_validator("arm")
    @classmethod
    def _arm(cls, arm: str) -> str:
        arm_policy_spec(arm)
        return arm


# --- synthetic output ------------------------------------------------------------------

_WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which "
          "but have an they you were her she there can all their one has been if more when will would "
          "who so no time up out about into than them only new some could these two may first then do "
          "any like my now over such our man me even most made after also did many before must through "
          "back years where much your way well down should because each just those people how too little "
          "state good very make world still own see men work long get here between both life being under "
          "never day same another know while last might us great old year off come since against go came "
          "right used take three").split()


class _Text:
    """Cumulative text and token ids of n tokens as string slices: O(1) work per chunk."""

    def __init__(self):
        self.text = ""
        self.ids = ""
        self.text_off = [0]
        self.ids_off = [0]

    def grow(self, n: int) -> None:
        if n < len(self.text_off):
            return
        words, ids = [self.text], [self.ids]
        toff, ioff = self.text_off, self.ids_off
        tlen, ilen = len(self.text), len(self.ids)
        for i in range(len(toff) - 1, max(n, 2 * len(toff))):
            w = " " + _WORDS[i % len(_WORDS)]
            tid = ("," if i else "") + str(1000 + (i * 7919) % 31000)
            words.append(w)
            ids.append(tid)
            tlen += len(w)
            ilen += len(tid)
            toff.append(tlen)
            ioff.append(ilen)
        self.text = "".join(words)
        self.ids = "".join(ids)

    def text_of(self, lo: int, hi: int) -> str:
        return self.text[self.text_off[lo]:self.text_off[hi]]

    def ids_of(self, n: int) -> str:
        return self.ids[:self.ids_off[n]]


# --- request bodies --------------------------------------------------------------------

class BadRequest(ValueError):
    """A request the emulator refuses; the message names what is wrong."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send many fields the emulator ignores


class SamplingParams(_Body):
    max_new_tokens: StrictInt | None = None
    ignore_eos: StrictBool = False
    n: StrictInt = 1


class GenerateBody(_Body):
    text: StrictStr | list | None = None
    input_ids: list | None = None
    sampling_params: SamplingParams = SamplingParams()
    stream: StrictBool = False
    rid: StrictStr | None = None


class StreamOptions(_Body):
    include_usage: StrictBool | None = False
    continuous_usage_stats: StrictBool | None = False


class CompletionBody(_Body):
    model: StrictStr | None = None
    prompt: StrictStr | list
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    best_of: StrictInt | None = None
    ignore_eos: StrictBool = False


class ChatBody(_Body):
    model: StrictStr | None = None
    messages: list = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    ignore_eos: StrictBool = False


def chat_prompt(messages: list) -> str:
    """The text a chat request is counted as: one "role: content" line per message, then
    "assistant: " (no tokenizer, so no model's chat template).  BadRequest names a bad message."""
    lines = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages.{i} must be an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant", "developer", "tool"):
            raise BadRequest(f"messages.{i}.role must be system, user, assistant, developer or tool, got {role!r}")
        if isinstance(content, list):  # OpenAI content parts: text only in the emulator
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise BadRequest(f"messages.{i}.content.{j}: only text parts are supported by the emulator")
                parts.append(part["text"])
            content = "".join(parts)
        elif content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise BadRequest(f"messages.{i}.content must be a string or a list of text parts")
        lines.append(f"{role}: {content}\n")
    return "".join(lines) + "assistant: "


def count_text_tokens(text: str) -> int:
    """Prompt tokens of a text without a tokenizer: one per 4 UTF-8 bytes, at least one."""
    return max(1, math.ceil(len(text.encode("utf-8")) / 4))


def _token_ids(value: list, where: str) -> int:
    if not value:
        raise BadRequest(f"{where} is empty")
    if any(isinstance(x, list) for x in value):
        raise BadRequest(f"{where}: batch requests (a list of prompts) are not supported by the emulator")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
        raise BadRequest(f"{where} must be a list of non-negative integer token ids")
    return len(value)


def _output_len(value: int | None, name: str) -> int:
    if value is None:
        raise BadRequest(f"{name} is required (the emulator generates exactly that many tokens)")
    if value < 1:
        raise BadRequest(f"{name} must be >= 1, got {value}")
    return value


# --- the server ------------------------------------------------------------------------

class _Stream:
    """A request's channel from the engine loop to its HTTP handler."""

    __slots__ = ("req", "visible", "finished", "waiter", "rid", "prompt_tokens", "created")

    def __init__(self, rid: str, prompt_tokens: int):
        self.req: Request | None = None
        self.visible = 0  # tokens published so far (at their step's end)
        self.finished = False
        self.waiter: asyncio.Future | None = None
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.created = time.time()

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class Emulator:
    """The engine, its clock and its counters; one per server."""

    def __init__(self, profile, cfg: EmulatorConfig):
        self.profile = profile
        self.cfg = cfg
        self.policy_spec = arm_policy_spec(cfg.arm)
        policy = FailSafePolicy(build_policy(self.policy_spec), log) if self.policy_spec else None
        self.engine = Engine(profile, policy, seed=cfg.seed, max_running_requests=cfg.max_running_requests)
        self.model_name = cfg.model_name or f"dynspec/{profile.name}"
        self.port = cfg.port  # the bound port once serving (the config may say 0)
        self.text = _Text()
        self.scale = cfg.time_scale
        self.t0 = 0.0  # loop time at virtual time 0
        self.lag_s = 0.0
        self.healthy = True
        self.requests_total = 0
        self._work: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._accept_base = (0, 0)  # (spec tokens, request-steps) at the last /set_internal_state
        self._gen_mark = (0, 0.0, 0)  # (tokens, loop time, decode steps) of the last sample
        self.gen_throughput = 0.0

    # Clock and loop ---------------------------------------------------------------------
    def virtual_now(self) -> float:
        return (asyncio.get_running_loop().time() - self.t0) * self.scale

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        self._gen_mark = (0, self.t0, 0)
        self._work = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="dynspec-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass

    def submit(self, stream: _Stream, input_len: int, output_len: int) -> None:
        eng = self.engine
        if not eng.has_work():
            eng.advance_to(self.virtual_now())  # idle: the next step starts now
        stream.req = eng.submit(input_len, output_len, context=stream)
        self.requests_total += 1
        self._work.set()

    def abort(self, stream: _Stream) -> None:
        if stream.req is not None and not stream.finished:
            self.engine.abort(stream.req)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        eng = self.engine
        try:
            while True:
                if not eng.has_work():
                    self._work.clear()
                    await self._work.wait()
                    continue
                step = eng.step()
                deadline = self.t0 + step.end / self.scale
                delay = deadline - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    if delay < -0.002:  # behind: re-base rather than burst to catch up
                        self.t0 -= delay
                        self.lag_s -= delay
                    await asyncio.sleep(0)  # let the streams write before the next step
                for req in step.emitted:
                    s = req.context
                    s.visible = req.generated
                    if req.finish_time is not None:
                        s.finished = True
                    s.wake()
                if step.kind == "decode" and eng.stats.decode_steps - self._gen_mark[2] >= GEN_THROUGHPUT_INTERVAL:
                    now, (tok0, t0, _) = loop.time(), self._gen_mark
                    if now > t0:
                        self.gen_throughput = (eng.stats.tokens_out - tok0) / (now - t0)
                    self._gen_mark = (eng.stats.tokens_out, now, eng.stats.decode_steps)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - an engine bug: fail loudly, stop serving
            log.exception("dynspec emulator: the engine loop failed")
            self.healthy = False
            for req in list(eng.running) + list(eng.waiting):
                req.context.finished = True
                req.context.wake()

    # Reports ----------------------------------------------------------------------------
    def accept_length(self) -> float | None:
        st = self.engine.stats
        tok, steps = st.spec_tokens - self._accept_base[0], st.spec_request_steps - self._accept_base[1]
        return tok / steps if steps else None

    def reset_accept_length(self) -> None:
        st = self.engine.stats
        self._accept_base = (st.spec_tokens, st.spec_request_steps)

    def dynspec_block(self) -> dict:
        st, mode = self.engine.stats, self.engine.mode
        return {"policy": self.policy_spec or "none", "steps_spec": st.steps_spec, "steps_plain": st.steps_plain,
                "switches": st.switches, "mode": "spec" if mode else "plain"}

    def server_info(self) -> dict:
        cfg, prof, spec = self.cfg, self.profile, self.profile.speculative
        speculative = self.policy_spec is not None
        internal = {"last_gen_throughput": self.gen_throughput,
                    "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": cfg.context_length * 64,
                                     "graph": 0.0},
                    "effective_max_running_requests_per_dp": cfg.max_running_requests or 4096}
        if speculative and self.accept_length() is not None:
            internal["avg_spec_accept_length"] = self.accept_length()
        internal["dynspec"] = self.dynspec_block()  # where the patched SGLang reports it
        return {
            "model_path": self.model_name, "tokenizer_path": self.model_name, "served_model_name": self.model_name,
            "host": cfg.host, "port": self.port, "context_length": cfg.context_length,
            "max_running_requests": cfg.max_running_requests, "chunked_prefill_size": prof.prefill.chunk_tokens,
            "stream_interval": 1, "stream_output": False, "skip_tokenizer_init": False,
            "speculative_algorithm": spec.algorithm if speculative else None,
            "speculative_num_steps": spec.num_steps if speculative else None,
            "speculative_eagle_topk": spec.topk if speculative else None,
            "speculative_num_draft_tokens": spec.num_draft_tokens if speculative else None,
            "speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 1.0,
            "internal_states": [internal],
            "version": API_VERSION,
            "dynspec_emulator": {**cfg.model_dump(), "profile_name": prof.name, "lag_s": self.lag_s,
                                 "steps_extrapolated": self.engine.stats.steps_extrapolated},
        }

    def metrics_text(self) -> str:
        eng, st = self.engine, self.engine.stats
        label = '{model_name="%s"}' % self.model_name.replace("\\", "\\\\").replace('"', '\\"')
        acc = self.accept_length()
        rows = [
            ("sglang:num_running_reqs", "gauge", "The number of running requests.", len(eng.running)),
            ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", len(eng.waiting)),
            ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", self.gen_throughput),
            ("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
             acc if acc is not None else 0.0),
            ("sglang:token_usage", "gauge", "The token usage.", 0.0),
            ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", st.prompt_tokens),
            ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", st.tokens_out),
            ("sglang:num_requests_total", "counter", "Number of requests processed.", self.requests_total),
            ("dynspec_steps_speculative_total", "counter", "Decode steps that speculated.", st.steps_spec),
            ("dynspec_steps_plain_total", "counter", "Decode steps without speculation.", st.steps_plain),
            ("dynspec_switches_total", "counter", "Changes between plain and speculative decode steps.", st.switches),
            ("dynspec_mode", "gauge", "1 while speculating, 0 while decoding plainly.", 1 if eng.mode else 0),
            ("dynspec_steps_prefill_total", "counter", "Prefill steps.", st.steps_prefill),
            ("dynspec_steps_extrapolated_total", "counter",
             "Decode steps whose batch size lies beyond the profile's measured range.", st.steps_extrapolated),
            ("dynspec_requests_aborted_total", "counter", "Requests dropped when their client went away.",
             st.requests_aborted),
            ("dynspec_emulator_lag_seconds_total", "counter",
             "Wall time the emulator fell behind the scaled profile.", self.lag_s),
        ]
        out = []
        for name, kind, doc, value in rows:
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n{name}{label} {float(value)!r}\n")
        return "".join(out)


def _error(status: int, message: str, openai: bool = False):
    from aiohttp import web

    if openai:  # SGLang's OpenAI-compatible ErrorResponse
        body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status}
    else:  # SGLang's native endpoints: {"error": {"message": ...}}
        body = {"error": {"message": message}}
    return web.json_response(body, status=status)


async def _read_json(request, model: type[BaseModel]):
    from aiohttp import web

    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BadRequest(f"request body exceeds {MAX_BODY_BYTES} bytes", status=413) from None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # bad syntax, bad UTF-8, a 5000-digit integer, deep nesting
        why = "nested too deeply" if isinstance(exc, RecursionError) else " ".join(str(exc).split())[:200]
        raise BadRequest(f"malformed JSON body: {why}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(data).__name__}")
    try:  # a "\ud800" escape decodes to a lone surrogate, which no response or tokenizer can encode
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("the body holds a lone surrogate (an unpaired \\ud800-\\udfff escape)") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(validation_message(exc)) from None


@lru_cache(maxsize=1)
def emulator_key():
    """The application key under which make_app's app holds its Emulator."""
    from aiohttp import web

    return web.AppKey("dynspec_emulator", Emulator)


def _openai_usage(prompt_tokens: int, n: int) -> str:
    """The OpenAI `usage` object as SGLang writes it, for n generated tokens."""
    return ('{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":null,'
            '"reasoning_tokens":0}' % (prompt_tokens, prompt_tokens + n, n))


def _usage_options(opts) -> tuple[bool, bool]:
    """(usage in every chunk, usage in a final chunk) from a request's stream_options."""
    return bool(opts and opts.continuous_usage_stats), bool(opts and opts.include_usage)


def make_app(profile, arm: str, *, time_scale: float = 1.0, seed: int = 0, host: str = "127.0.0.1",
             port: int = 30000, model_name: str | None = None, context_length: int = 131072,
             max_running_requests: int | None = None):
    """The aiohttp application; its engine loop starts and stops with the app."""
    from aiohttp import web

    cfg = EmulatorConfig(profile=profile.name, arm=arm, host=host, port=port, time_scale=time_scale, seed=seed,
                         model_name=model_name, context_length=context_length,
                         max_running_requests=max_running_requests)
    emu = Emulator(profile, cfg)

    @web.middleware
    async def json_errors(request, handler):
        try:
            return await handler(request)
        except web.HTTPException as exc:  # unknown paths and methods: JSON, as every other error
            if exc.status < 400:
                raise
            return _error(exc.status, f"{request.method} {request.path}: {exc.reason}")

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[json_errors])
    app[emulator_key()] = emu

    async def on_startup(_app):
        await emu.start()

    async def on_cleanup(_app):
        await emu.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)

    def check_lengths(input_len: int, output_len: int) -> None:
        if input_len + output_len > cfg.context_length:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {cfg.context_length} "
                f"tokens. You requested a total of {input_len + output_len} tokens: {input_len} tokens from "
                f"the input messages and {output_len} tokens for the completion.")

    # Info endpoints ---------------------------------------------------------------------
    async def health(_request):
        return web.Response(status=200 if emu.healthy else 503)

    async def model_info(_request):
        return web.json_response({
            "model_path": emu.model_name, "tokenizer_path": emu.model_name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": "dynspec-emulated", "architectures": None})

    async def server_info(_request):
        return web.json_response(emu.server_info())

    async def models(_request):
        return web.json_response({"object": "list", "data": [{
            "id": emu.model_name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
            "root": emu.model_name, "parent": None, "max_model_len": cfg.context_length}]})

    async def metrics(_request):
        return web.Response(text=emu.metrics_text(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def flush_cache(_request):
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. "
                                 "(When there are running or waiting requests, the operation will not be performed.)\n")

    async def set_internal_state(request):
        try:
            body = await _read_json(request, _Body)
        except BadRequest as exc:
            return _error(exc.status, str(exc))
        args = (body.model_extra or {}).get("server_args")
        allowed = {"pp_max_micro_batch_size", "speculative_accept_threshold_single",
                   "speculative_accept_threshold_acc"}
        ok = isinstance(args, dict) and set(args) <= allowed
        if ok:
            emu.reset_accept_length()  # SGLang zeroes its accept-length accumulators here
        return web.json_response([ok])

    # Generation -------------------------------------------------------------------------
    async def run_stream(request, stream: _Stream, output_len: int, chunk) -> web.StreamResponse:
        """Stream chunks as the engine publishes tokens; abort the request if the client goes."""
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

    async def wait_done(request, stream: _Stream) -> bool:
        """Wait for a non-streamed request; False (aborted) if its client disconnects.  The
        connection is checked at every step's tokens and, between them, every second."""
        while not stream.finished:
            if request.transport is None or request.transport.is_closing():
                emu.abort(stream)
                return False
            try:
                await asyncio.wait_for(stream.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
        return True

    def start(rid: str, input_len: int, output_len: int) -> _Stream:
        """A new request's stream, submitted to the engine."""
        emu.text.grow(output_len)
        stream = _Stream(rid, input_len)
        emu.submit(stream, input_len, output_len)
        return stream

    async def whole(request, stream: _Stream, output_len: int):
        """A non-streamed OpenAI request to its end: (tokens, None), or (0, the error response)."""
        if not await wait_done(request, stream):
            return 0, web.Response(status=499)
        if stream.visible < output_len:
            return 0, _error(500, "the emulator engine failed", openai=True)
        return stream.visible, None

    def meta(stream: _Stream, n: int, finished: bool) -> str:
        fr = '{"type":"length","length":%d}' % n if finished else "null"
        return ('{"id":%s,"finish_reason":%s,"prompt_tokens":%d,"weight_version":"default",'
                '"total_retractions":0,"completion_tokens":%d,"cached_tokens":0' % (json.dumps(stream.rid), fr,
                                                                                  stream.prompt_tokens, n))

    def meta_done(stream: _Stream, n: int) -> dict:
        req = stream.req
        out = {"id": stream.rid, "finish_reason": {"type": "length", "length": n},
               "prompt_tokens": stream.prompt_tokens, "weight_version": "default", "total_retractions": 0,
               "completion_tokens": n, "cached_tokens": 0, "e2e_latency": time.time() - stream.created}
        if emu.policy_spec is not None and req is not None and req.spec_steps:
            # SGLang's per-request figures over this request's verify (speculative) steps
            out.update(spec_verify_ct=req.spec_steps, spec_accept_length=req.spec_tokens / req.spec_steps)
        return out

    async def generate(request):
        try:
            body = await _read_json(request, GenerateBody)
            if body.text is not None and body.input_ids is not None:
                raise BadRequest("give either text or input_ids, not both")
            if isinstance(body.text, list):
                raise BadRequest("text: batch requests (a list of prompts) are not supported by the emulator")
            if body.text is not None:
                if not body.text:
                    raise BadRequest("text is empty")
                input_len = count_text_tokens(body.text)
            elif body.input_ids is not None:
                input_len = _token_ids(body.input_ids, "input_ids")
            else:
                raise BadRequest("text or input_ids is required")
            sp = body.sampling_params
            output_len = _output_len(sp.max_new_tokens, "sampling_params.max_new_tokens")
            if sp.n != 1:
                raise BadRequest(f"sampling_params.n must be 1 in the emulator, got {sp.n}")
            check_lengths(input_len, output_len)
        except BadRequest as exc:
            return _error(exc.status, str(exc))
        text = emu.text
        text.grow(output_len)
        stream = _Stream(body.rid or uuid.uuid4().hex, input_len)
        emu.submit(stream, input_len, output_len)
        if not body.stream:
            if not await wait_done(request, stream):
                return web.Response(status=499)
            n = stream.visible
            if n < output_len:
                return _error(500, "the emulator engine failed")
            return web.json_response({"text": text.text_of(0, n), "output_ids": json.loads(f"[{text.ids_of(n)}]"),
                                      "meta_info": meta_done(stream, n)})

        def chunk(lo: int, hi: int, finished: bool, final: bool = False) -> bytes:
            if final:
                return b""  # SGLang's native stream has no separate usage chunk
            m = meta(stream, hi, False) if not finished else json.dumps(meta_done(stream, hi), separators=(",", ":"))[:-1]
            return ('data: {"text":"%s","output_ids":[%s],"meta_info":%s}}\n\n'
                    % (text.text_of(0, hi), text.ids_of(hi), m)).encode()

        return await run_stream(request, stream, output_len, chunk)

    async def completions(request):
        try:
            body = await _read_json(request, CompletionBody)
            if isinstance(body.prompt, list):
                input_len = _token_ids(body.prompt, "prompt")
            else:
                if not body.prompt:
                    raise BadRequest("prompt is empty")
                input_len = count_text_tokens(body.prompt)
            wanted = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
            output_len = _output_len(wanted, "max_tokens")
            if body.n != 1 or body.best_of not in (None, 1):
                raise BadRequest("n and best_of must be 1 in the emulator")
            check_lengths(input_len, output_len)
        except BadRequest as exc:
            return _error(exc.status, str(exc), openai=True)
        text, stream = emu.text, start(uuid.uuid4().hex, input_len, output_len)
        created, model = int(time.time()), body.model or emu.model_name
        usage = functools.partial(_openai_usage, input_len)

        if not body.stream:
            n, failed = await whole(request, stream, output_len)
            if failed is not None:
                return failed
            return web.json_response({
                "id": stream.rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text.text_of(0, n), "logprobs": None, "finish_reason": "length",
                             "matched_stop": None}],
                "usage": json.loads(usage(n)), "metadata": None})

        per_chunk, final_usage = _usage_options(body.stream_options)
        head = ('data: {"id":%s,"object":"text_completion","created":%d,"model":%s,'
                % (json.dumps(stream.rid), created, json.dumps(model)))

        def chunk(lo: int, hi: int, finished: bool, final: bool = False) -> bytes:
            if final:
                if not final_usage:
                    return b""
                return (head + '"choices":[],"usage":%s}\n\n' % usage(hi)).encode()
            fr = '"length"' if finished else "null"
            u = usage(hi) if per_chunk else "null"
            return (head + '"choices":[{"index":0,"text":"%s","logprobs":null,"finish_reason":%s,'
                    '"matched_stop":null}],"usage":%s}\n\n' % (text.text_of(lo, hi), fr, u)).encode()

        return await run_stream(request, stream, output_len, chunk)

    async def chat_completions(request):
        try:
            body = await _read_json(request, ChatBody)
            input_len = count_text_tokens(chat_prompt(body.messages))
            wanted = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
            output_len = _output_len(wanted, "max_tokens")
            if body.n != 1:
                raise BadRequest("n must be 1 in the emulator")
            check_lengths(input_len, output_len)
        except BadRequest as exc:
            return _error(exc.status, str(exc), openai=True)
        text, stream = emu.text, start("chatcmpl-" + uuid.uuid4().hex, input_len, output_len)
        created, model = int(time.time()), body.model or emu.model_name
        usage = functools.partial(_openai_usage, input_len)

        if not body.stream:
            n, failed = await whole(request, stream, output_len)
            if failed is not None:
                return failed
            return web.json_response({
                "id": stream.rid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text.text_of(0, n),
                                                     "reasoning_content": None, "tool_calls": None},
                             "logprobs": None, "finish_reason": "length", "matched_stop": None}],
                "usage": json.loads(usage(n)), "metadata": None})

        per_chunk, final_usage = _usage_options(body.stream_options)
        head = ('data: {"id":%s,"object":"chat.completion.chunk","created":%d,"model":%s,'
                % (json.dumps(stream.rid), created, json.dumps(model)))
        # As SGLang: the first chunk carries the role (and no content), then content deltas.
        first = [True]

        def chunk(lo: int, hi: int, finished: bool, final: bool = False) -> bytes:
            if final:
                if not final_usage:
                    return b""
                return (head + '"choices":[],"usage":%s}\n\n' % usage(hi)).encode()
            role = b""
            if first[0]:
                first[0] = False
                role = (head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                        '"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n').encode()
            fr = '"length"' if finished else "null"
            u = usage(hi) if per_chunk else "null"
            return role + (head + '"choices":[{"index":0,"delta":{"content":"%s"},"logprobs":null,'
                           '"finish_reason":%s,"matched_stop":null}],"usage":%s}\n\n'
                           % (text.text_of(lo, hi), fr, u)).encode()

        return await run_stream(request, stream, output_len, chunk)

    r = app.router
    for path in ("/health", "/health_generate"):
        r.add_get(path, health)
    for path in ("/get_model_info", "/model_info"):
        r.add_get(path, model_info)
    for path in ("/get_server_info", "/server_info"):
        r.add_get(path, server_info)
    r.add_get("/v1/models", models)
    r.add_get("/metrics", metrics)
    r.add_route("GET", "/flush_cache", flush_cache)
    r.add_route("POST", "/flush_cache", flush_cache)
    r.add_post("/set_internal_state", set_internal_state)
    r.add_put("/set_internal_state", set_internal_state)
    r.add_post("/generate", generate)
    r.add_put("/generate", generate)
    r.add_post("/v1/completions", completions)
    r.add_post("/v1/chat/completions", chat_completions)
    return app


async def _serve_async(app, host: str, port: int, ready) -> None:
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = runner.addresses[0][1] if runner.addresses else port
    app[emulator_key()].port = bound
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread: the caller stops us
            pass
    ready(bound)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def serve(profile, arm: str, host: str = "127.0.0.1", port: int = 30000, time_scale: float = 1.0, *,
          seed: int = 0, model_name: str | None = None, context_length: int = 131072,
          max_running_requests: int | None = None, ready=None) -> None:
    """Serve until SIGTERM or SIGINT; ready(port) is called once the port is bound."""
    app = make_app(profile, arm, time_scale=time_scale, seed=seed, host=host, port=port, model_name=model_name,
                   context_length=context_length, max_running_requests=max_running_requests)
    asyncio.run(_serve_async(app, host, port, ready or (lambda _p: None)))


def _run(args) -> int:
    from dynspec.profile import ProfileError, load_profile

    prog = "dynspec emulate"
    try:
        cfg = EmulatorConfig(profile=args.profile, arm=args.arm, host=args.host, port=args.port,
                             time_scale=args.time_scale, seed=args.seed, model_name=args.model_name,
                             context_length=args.context_length, max_running_requests=args.max_running_requests)
        profile = load_profile(cfg.profile)
    except ValidationError as exc:
        print(f"{prog}: {validation_message(exc)}", file=sys.stderr)
        return 2
    except (ValueError, ProfileError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if cfg.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"{prog}: note: listening on {cfg.host}, not loopback only", file=sys.stderr)

    def ready(port: int) -> None:
        print(f"dynspec emulate: ready on http://{cfg.host}:{port} (profile {profile.name}, arm {cfg.arm}, "
              f"time-scale {cfg.time_scale:g})", flush=True)

    try:
        serve(profile, cfg.arm, cfg.host, cfg.port, cfg.time_scale, seed=cfg.seed, model_name=cfg.model_name,
              context_length=cfg.context_length, max_running_requests=cfg.max_running_requests, ready=ready)
    except OSError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("emulate", help="serve SGLang's HTTP API from a profile, in real time")
    p.add_argument("--profile", required=True, help="a shipped profile name or a .yaml path")
    p.add_argument("--arm", required=True, help=f"{', '.join(SIM_ARMS)} or policy:SPEC")
    p.add_argument("--host", default="127.0.0.1", help="default loopback only")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed when ready)")
    p.add_argument("--time-scale", type=float, default=1.0, help="run X times faster than the profile")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-name", default=None, help="served model name (default: dynspec/PROFILE)")
    p.add_argument("--context-length", type=int, default=131072)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.set_defaults(func=_run)



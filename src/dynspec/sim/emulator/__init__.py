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

The package, by concern:

    api      request bodies (pydantic), reading and checking them, the one-line error bodies
    text     the synthetic output: words and token ids, OpenAI usage
    clock    EmulatorConfig; the engine loop on the wall clock, its counters, /metrics text
    app      EmulatorApp (one method per route) and make_app
    server   serve() and `dynspec emulate`
"""

from __future__ import annotations

from dynspec.sim.emulator.api import (MAX_BODY_BYTES, BadRequest, ChatBody, CompletionBody, GenerateBody, SamplingParams,
                                  StreamOptions, chat_prompt, count_text_tokens)
from dynspec.sim.emulator.app import EmulatorApp, emulator_key, make_app
from dynspec.sim.emulator.clock import API_VERSION, GEN_THROUGHPUT_INTERVAL, Emulator, EmulatorConfig
from dynspec.sim.emulator.server import add_cli, serve

__all__ = ["API_VERSION", "GEN_THROUGHPUT_INTERVAL", "MAX_BODY_BYTES", "BadRequest", "ChatBody", "CompletionBody",
           "Emulator", "EmulatorApp", "EmulatorConfig", "GenerateBody", "SamplingParams", "StreamOptions", "add_cli",
           "chat_prompt", "count_text_tokens", "emulator_key", "make_app", "serve"]

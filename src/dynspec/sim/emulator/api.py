"""What a request may say: the request bodies, how one is read and checked, and the one-line
4xx error bodies (SGLang's native and OpenAI-compatible shapes).

Every refusal is a BadRequest whose message names what is wrong; a handler turns it into
`error_response(exc.status, str(exc), openai=...)`.  Nothing here needs the engine.
"""

from __future__ import annotations

import json
import math

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from dynspec.models import validation_message

MAX_BODY_BYTES = 8 * 1024 * 1024  # larger request bodies get 413 (a 128k-token prompt as ids is about 1 MB)


class BadRequest(ValueError):
    """A request the emulator refuses; the message names what is wrong."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


# --- request bodies --------------------------------------------------------------------

class Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send many fields the emulator ignores


class SamplingParams(Body):
    max_new_tokens: StrictInt | None = None
    ignore_eos: StrictBool = False
    n: StrictInt = 1


class GenerateBody(Body):
    text: StrictStr | list | None = None
    input_ids: list | None = None
    sampling_params: SamplingParams = SamplingParams()
    stream: StrictBool = False
    rid: StrictStr | None = None


class StreamOptions(Body):
    include_usage: StrictBool | None = False
    continuous_usage_stats: StrictBool | None = False


class CompletionBody(Body):
    model: StrictStr | None = None
    prompt: StrictStr | list
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    best_of: StrictInt | None = None
    ignore_eos: StrictBool = False


class ChatBody(Body):
    model: StrictStr | None = None
    messages: list = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    ignore_eos: StrictBool = False


def usage_options(opts: StreamOptions | None) -> tuple[bool, bool]:
    """(usage in every chunk, usage in a final chunk) from a request's stream_options."""
    return bool(opts and opts.continuous_usage_stats), bool(opts and opts.include_usage)


# --- prompts and lengths ---------------------------------------------------------------

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


def check_lengths(input_len: int, output_len: int, context_length: int) -> None:
    if input_len + output_len > context_length:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {context_length} "
            f"tokens. You requested a total of {input_len + output_len} tokens: {input_len} tokens from "
            f"the input messages and {output_len} tokens for the completion.")


# --- reading a request -----------------------------------------------------------------

async def read_json(request, model: type[BaseModel]):
    """The request's body validated as `model`; BadRequest (413 when too large) otherwise."""
    from aiohttp import web

    if (request.content_length or 0) > MAX_BODY_BYTES:  # refused before a byte of it is read
        raise BadRequest(f"request body exceeds {MAX_BODY_BYTES} bytes", status=413)
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


async def read_generate(request, context_length: int) -> tuple[GenerateBody, int, int]:
    """A /generate request: (body, prompt tokens, tokens to generate), or BadRequest."""
    body = await read_json(request, GenerateBody)
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
    check_lengths(input_len, output_len, context_length)
    return body, input_len, output_len


async def read_completion(request, context_length: int) -> tuple[CompletionBody, int, int]:
    """A /v1/completions request: (body, prompt tokens, tokens to generate), or BadRequest."""
    body = await read_json(request, CompletionBody)
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
    check_lengths(input_len, output_len, context_length)
    return body, input_len, output_len


async def read_chat(request, context_length: int) -> tuple[ChatBody, int, int]:
    """A /v1/chat/completions request: (body, prompt tokens, tokens to generate), or BadRequest."""
    body = await read_json(request, ChatBody)
    input_len = count_text_tokens(chat_prompt(body.messages))
    wanted = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    output_len = _output_len(wanted, "max_tokens")
    if body.n != 1:
        raise BadRequest("n must be 1 in the emulator")
    check_lengths(input_len, output_len, context_length)
    return body, input_len, output_len


# --- error bodies ----------------------------------------------------------------------

def error_response(status: int, message: str, openai: bool = False):
    """The one-line JSON error body SGLang answers with: OpenAI's shape or its native one."""
    from aiohttp import web

    body: dict[str, object]
    if openai:  # SGLang's OpenAI-compatible ErrorResponse
        body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status}
    else:  # SGLang's native endpoints: {"error": {"message": ...}}
        body = {"error": {"message": message}}
    return web.json_response(body, status=status)

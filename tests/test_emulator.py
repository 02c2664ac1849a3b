"""The emulator as a real HTTP server on an ephemeral loopback port, driven by a real client."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from dynspec.live.bench import random_prompts, run_level_async
from dynspec.sim.emulator import MAX_BODY_BYTES, chat_prompt, count_text_tokens, make_app
from dynspec.sim.profile import parse_profile
from dynspec.results import summarize
from dynspec.live.servers import parse_prometheus
from dynspec.sim.run import simulate_level


def profile(plain_ms=(2.0, 3.0), spec_ms=(3.0, 6.0), accept=2.5):
    return parse_profile({
        "name": "emu-test",
        "speculative": {"num_steps": 3},
        "acceptance": {"accept_length": accept},
        "steps": {"batch_size": [1, 16], "plain_ms": list(plain_ms), "spec_ms": list(spec_ms)},
        "prefill": {"fixed_ms": 1.0, "per_token_ms": 0.001},
        "provenance": {"kind": "derived", "source": "test"},
    })


@asynccontextmanager
async def serving(prof, arm="eagle3", time_scale=20.0, **kw):
    """The emulator app on 127.0.0.1:<free port>; yields (base url, client session)."""
    app = make_app(prof, arm, time_scale=time_scale, **kw)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            yield f"http://127.0.0.1:{port}", session
    finally:
        await runner.cleanup()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


async def sse(resp) -> list:
    """The data: payloads of an event stream, '[DONE]' kept as a string."""
    out = []
    async for line in resp.content:
        line = line.strip()
        if line.startswith(b"data: "):
            data = line[6:]
            out.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return out


def test_info_endpoints_answer_what_clients_read():
    async def go():
        async with serving(profile(), "eagle3") as (url, s):
            for path in ("/health", "/health_generate"):
                async with s.get(url + path) as r:
                    assert r.status == 200
            async with s.get(url + "/v1/models") as r:
                models = await r.json()
            model = models["data"][0]["id"]
            assert model == "dynspec/emu-test" and models["object"] == "list"
            async with s.get(url + "/get_model_info") as r:
                info = await r.json()
            assert info["model_path"] == model and info["is_generation"] is True
            async with s.get(url + "/get_server_info") as r:
                si = await r.json()
            # Before any speculative step SGLang leaves avg_spec_accept_length out.
            assert "avg_spec_accept_length" not in si["internal_states"][0]
            assert si["speculative_algorithm"] == "EAGLE3" and si["speculative_num_steps"] == 3
            assert si["internal_states"][0]["dynspec"] == {"policy": "always", "steps_spec": 0, "steps_plain": 0, "switches": 0,
                                     "mode": "plain", "policy_swaps": 0}
            async with s.post(url + "/generate", json={"input_ids": [1] * 10, "stream": False,
                                                       "sampling_params": {"max_new_tokens": 40}}) as r:
                assert r.status == 200
            async with s.get(url + "/get_server_info") as r:
                si = await r.json()
            acc = si["internal_states"][0]["avg_spec_accept_length"]
            assert 1.0 < acc <= 4.0
            assert si["internal_states"][0]["dynspec"]["steps_spec"] > 0 and si["internal_states"][0]["dynspec"]["mode"] == "spec"
            async with s.get(url + "/metrics") as r:
                assert r.status == 200 and r.content_type == "text/plain"
                m = parse_prometheus(await r.text())
            assert m["sglang:generation_tokens_total"] == 40
            assert m["sglang:prompt_tokens_total"] == 10
            assert m["sglang:num_requests_total"] == 1
            assert m["sglang:spec_accept_length"] == pytest.approx(acc)
            assert m["dynspec_steps_speculative_total"] == si["internal_states"][0]["dynspec"]["steps_spec"]
            assert m["dynspec_steps_plain_total"] == 0 and m["dynspec_mode"] == 1
            # sweep.servers resets the accept length between levels this way.
            async with s.post(url + "/set_internal_state",
                              json={"server_args": {"speculative_accept_threshold_single": 1.0}}) as r:
                assert await r.json() == [True]
            async with s.get(url + "/get_server_info") as r:
                assert "avg_spec_accept_length" not in (await r.json())["internal_states"][0]
            async with s.post(url + "/set_internal_state", json={"server_args": {"tp_size": 2}}) as r:
                assert await r.json() == [False]

    run(go())


def test_baseline_server_reports_no_speculation():
    async def go():
        async with serving(profile(), "baseline") as (url, s):
            async with s.post(url + "/generate", json={"text": "hello there", "sampling_params":
                                                       {"max_new_tokens": 5}}) as r:
                body = await r.json()
            assert "spec_verify_ct" not in body["meta_info"]
            async with s.get(url + "/get_server_info") as r:
                si = await r.json()
            assert si["speculative_algorithm"] is None
            assert "avg_spec_accept_length" not in si["internal_states"][0]
            assert si["internal_states"][0]["dynspec"]["policy"] == "none" and si["internal_states"][0]["dynspec"]["steps_plain"] == 4

    run(go())


def test_generate_counts_tokens_as_the_server_does_streamed_or_not():
    async def go():
        async with serving(profile(), "eagle3") as (url, s):
            text = "a prompt of some thirty-three b"
            async with s.post(url + "/generate", json={"text": text, "sampling_params":
                                                       {"max_new_tokens": 12, "ignore_eos": True}}) as r:
                full = await r.json()
            meta = full["meta_info"]
            assert meta["prompt_tokens"] == count_text_tokens(text) == 8
            assert meta["completion_tokens"] == 12 and len(full["output_ids"]) == 12
            assert meta["finish_reason"] == {"type": "length", "length": 12}
            assert len(full["text"].split()) == 12

            async with s.post(url + "/generate", json={"input_ids": list(range(7)), "stream": True,
                                                       "sampling_params": {"max_new_tokens": 30}}) as r:
                assert r.headers["Content-Type"].startswith("text/event-stream")
                events = await sse(r)
            assert events[-1] == "[DONE]"
            chunks = events[:-1]
            counts = [c["meta_info"]["completion_tokens"] for c in chunks]
            assert counts[0] == 1 and counts[-1] == 30
            assert all(a < b for a, b in zip(counts, counts[1:]))
            assert max(b - a for a, b in zip(counts, counts[1:])) > 1  # speculative steps give several
            # SGLang's native stream carries the cumulative text, as bench_serving expects.
            assert all(len(c["text"].split()) == c["meta_info"]["completion_tokens"] for c in chunks)
            assert all(c["meta_info"]["prompt_tokens"] == 7 for c in chunks)
            assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
            assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"

    run(go())


def test_completions_stream_deltas_and_usage():
    async def go():
        async with serving(profile(), "eagle3") as (url, s):
            async with s.post(url + "/v1/completions", json={"prompt": [5, 6, 7, 8], "max_tokens": 9}) as r:
                full = await r.json()
            assert full["object"] == "text_completion"
            assert full["usage"]["completion_tokens"] == 9 and full["usage"]["prompt_tokens"] == 4
            assert full["choices"][0]["finish_reason"] == "length"

            body = {"prompt": "hi there", "max_tokens": 9, "stream": True,
                    "stream_options": {"include_usage": True}}
            async with s.post(url + "/v1/completions", json=body) as r:
                events = await sse(r)
            assert events[-1] == "[DONE]"
            *content, usage = events[:-1]
            assert "".join(e["choices"][0]["text"] for e in content) == full["choices"][0]["text"]
            assert all(e["usage"] is None for e in content)
            assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 9
            assert usage["usage"]["prompt_tokens"] == count_text_tokens("hi there")
            assert content[-1]["choices"][0]["finish_reason"] == "length"

            body["stream_options"] = {"continuous_usage_stats": True}
            async with s.post(url + "/v1/completions", json=body) as r:
                events = await sse(r)
            counts = [e["usage"]["completion_tokens"] for e in events[:-1]]
            assert counts[-1] == 9 and counts == sorted(counts)
            assert all(e["choices"] for e in events[:-1])  # no separate usage chunk without include_usage

    run(go())


def test_chat_completions_stream_and_not_on_the_same_engine():
    async def go():
        async with serving(profile(), "eagle3") as (url, s):
            messages = [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text",
                                                                                         "text": "there"}]}]
            async with s.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 7}) as r:
                assert r.status == 200
                full = await r.json()
            assert full["object"] == "chat.completion"
            msg = full["choices"][0]["message"]
            assert msg["role"] == "assistant" and len(msg["content"].split()) == 7
            assert full["choices"][0]["finish_reason"] == "length"
            want_prompt = count_text_tokens(chat_prompt(messages))
            assert want_prompt == count_text_tokens("system: be brief\nuser: hello there\nassistant: ")
            assert full["usage"] == {**full["usage"], "completion_tokens": 7, "prompt_tokens": want_prompt,
                                     "total_tokens": want_prompt + 7}

            body = {"messages": messages, "max_completion_tokens": 7, "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                assert r.headers["Content-Type"].startswith("text/event-stream")
                events = await sse(r)
            assert events[-1] == "[DONE]"
            role, *content, usage = events[:-1]
            assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
            assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert "".join(e["choices"][0]["delta"]["content"] for e in content) == msg["content"]
            counts = [e["usage"]["completion_tokens"] for e in content]
            assert counts == sorted(counts) and counts[-1] == 7
            assert content[-1]["choices"][0]["finish_reason"] == "length"
            assert all(e["choices"][0]["finish_reason"] is None for e in content[:-1])
            assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7
            async with s.get(url + "/metrics") as r:  # both requests went through the one engine
                m = parse_prometheus(await r.text())
            assert m["sglang:num_requests_total"] == 2 and m["sglang:generation_tokens_total"] == 14
            assert m["sglang:prompt_tokens_total"] == 2 * want_prompt

    run(go())


BAD_REQUESTS = [
    ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": 4}', 400, "malformed JSON"),
    ("/generate", b'[1, 2]', 400, "JSON object"),
    ("/generate", b'{"sampling_params": {"max_new_tokens": 4}}', 400, "text or input_ids is required"),
    ("/generate", b'{"text": "x"}', 400, "max_new_tokens is required"),
    ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": -3}}', 400, "must be >= 1"),
    ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": "4"}}', 400, "max_new_tokens"),
    ("/generate", b'{"text": 5, "sampling_params": {"max_new_tokens": 4}}', 400, "text"),
    ("/generate", b'{"input_ids": [1, "a"], "sampling_params": {"max_new_tokens": 4}}', 400, "input_ids"),
    ("/generate", b'{"input_ids": [[1], [2]], "sampling_params": {"max_new_tokens": 4}}', 400, "batch"),
    ("/generate", b'{"text": "x", "stream": "yes", "sampling_params": {"max_new_tokens": 4}}', 400, "stream"),
    ("/generate", b'{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 99}}', 400, "context length"),
    ("/v1/completions", b'{"max_tokens": 4}', 400, "prompt: Field required"),
    ("/v1/completions", b'{"prompt": "x"}', 400, "max_tokens is required"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', 400, "must be >= 1"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 4, "n": 2}', 400, "n and best_of"),
    # lone surrogates, a huge integer, deep nesting, best_of out of range
    ("/generate", b'{"text": "\\ud800", "sampling_params": {"max_new_tokens": 4}}', 400, "surrogate"),
    ("/v1/completions", b'{"prompt": "\\udfff x", "max_tokens": 4}', 400, "surrogate"),
    ("/generate", b'{"input_ids": [' + b"9" * 5000 + b'], "sampling_params": {"max_new_tokens": 4}}', 400,
     "malformed JSON"),
    ("/generate", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 400, "malformed JSON"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 4, "best_of": 0}', 400, "n and best_of"),
    ("/v1/chat/completions", b'{"max_tokens": 4}', 400, "messages: Field required"),
    ("/v1/chat/completions", b'{"messages": [], "max_tokens": 4}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}', 400, "max_tokens is required"),
    ("/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}], "max_tokens": 4}', 400,
     "messages.0.role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}], "max_tokens": 4}', 400,
     "messages.0.content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}], '
                             b'"max_tokens": 4}', 400, "only text parts"),
    ("/v1/chat/completions", b'{"messages": ["hi"], "max_tokens": 4}', 400, "messages.0 must be an object"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "n": 3}', 400,
     "n must be 1"),
]


def test_bad_requests_get_a_4xx_json_error_and_the_server_keeps_serving():
    async def go():
        async with serving(profile(), "eagle3", context_length=100) as (url, s):
            for path, raw, status, needle in BAD_REQUESTS:
                async with s.post(url + path, data=raw, headers={"Content-Type": "application/json"}) as r:
                    assert r.status == status, (path, raw)
                    body = await r.json()
                message = body["error"]["message"] if "error" in body else body["message"]
                assert needle in message, (raw, message)
                if path.startswith("/v1/"):
                    assert body["object"] == "error" and body["code"] == status
            async with s.post(url + "/generate", data=b"x" * (MAX_BODY_BYTES + 1)) as r:
                assert r.status == 413 and "exceeds" in (await r.json())["error"]["message"]
            async with s.get(url + "/no/such/path") as r:
                assert r.status == 404 and "Not Found" in (await r.json())["error"]["message"]
            async with s.get(url + "/generate") as r:
                assert r.status == 405
            async with s.post(url + "/generate", json={"text": "still", "sampling_params":
                                                       {"max_new_tokens": 3}}) as r:
                assert r.status == 200 and (await r.json())["meta_info"]["completion_tokens"] == 3
            async with s.get(url + "/metrics") as r:
                assert parse_prometheus(await r.text())["sglang:num_requests_total"] == 1

    run(go())


def test_a_body_too_large_is_refused_from_its_length_before_it_is_read():
    """A request that declares 100 MB gets its 413 at once, with nothing of the body sent."""
    async def go():
        async with serving(profile(), "eagle3") as (url, s):
            host, port = url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000000\r\n\r\n")
            await writer.drain()
            t0 = time.perf_counter()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            assert time.perf_counter() - t0 < 1.0
            assert head.startswith(b"HTTP/1.1 413"), head
            writer.close()
            async with s.post(url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}}) as r:
                assert r.status == 200

    run(go())


def test_a_client_that_disconnects_mid_stream_does_not_disturb_the_others():
    async def go():
        async with serving(profile(), "eagle3", time_scale=5.0) as (url, s):
            body = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 60}}

            async def full():
                async with s.post(url + "/generate", json=body) as r:
                    return await sse(r)

            async def quitter():
                async with aiohttp.ClientSession() as own:  # its own connection, closed mid-stream
                    async with own.post(url + "/generate", json=body) as r:
                        n = 0
                        async for line in r.content:
                            n += line.startswith(b"data: ")
                            if n == 3:
                                return n

            results = await asyncio.gather(full(), quitter(), full(), full())
            assert results[1] == 3
            for events in (results[0], results[2], results[3]):
                assert events[-1] == "[DONE]" and events[-2]["meta_info"]["completion_tokens"] == 60
            async with s.get(url + "/metrics") as r:
                m = parse_prometheus(await r.text())
            assert m["dynspec_requests_aborted_total"] == 1
            assert m["sglang:num_running_reqs"] == 0 and m["sglang:num_queue_reqs"] == 0
            # The quitter stopped generating: fewer than 4 x 60 tokens were made.
            assert 3 * 60 < m["sglang:generation_tokens_total"] < 4 * 60

    run(go())


def test_a_rid_is_serialized_never_pasted_into_the_stream():
    async def go():
        async with serving(profile(), "eagle3") as (url, s):
            rid = 'x"}\n\ndata: [DONE]\n\n'
            body = {"input_ids": [1, 2], "stream": True, "rid": rid, "sampling_params": {"max_new_tokens": 5}}
            async with s.post(url + "/generate", json=body) as r:
                events = await sse(r)
            assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
            assert all(e["meta_info"]["id"] == rid for e in events[:-1])

    run(go())


def test_a_non_streamed_request_whose_client_goes_is_aborted_between_tokens():
    async def go():
        # about 3 s of tokens, one every few milliseconds: the old 1 s idle check never fired
        async with serving(profile(), "eagle3", time_scale=1.0) as (url, s):
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2500}}

            async def quitter():
                async with aiohttp.ClientSession() as own:
                    async with own.post(url + "/generate", json=body) as r:
                        return await r.json()

            task = asyncio.create_task(quitter())
            await asyncio.sleep(0.3)
            task.cancel()  # closes its connection mid-request
            await asyncio.sleep(0.4)
            async with s.get(url + "/metrics") as r:
                m = parse_prometheus(await r.text())
            assert m["dynspec_requests_aborted_total"] == 1 and m["sglang:num_running_reqs"] == 0
            assert m["sglang:generation_tokens_total"] < 2500

    run(go())


def test_emulator_agrees_with_the_simulator_at_small_scale():
    # Steps of 10-20 ms of wall time: long against scheduling jitter, short enough for CI.
    prof = profile(plain_ms=(40.0, 60.0), spec_ms=(60.0, 120.0))
    scale, c, n, in_len, out_len = 4.0, 4, 8, 64, 48
    sim, _ = simulate_level(prof, "eagle3", c, num_prompts=n, input_len=in_len, output_len=out_len, seed=1)

    async def go():
        async with serving(prof, "eagle3", time_scale=scale, seed=1) as (url, _s):
            res = await run_level_async(url, random_prompts(n, in_len, out_len, seed=1), c)
        return summarize(res.requests)

    emu = run(go())
    assert emu["failed"] == 0 and emu["total_output_tokens"] == n * out_len
    # The emulator is a little slower: a client's next request lands after its previous one's
    # step ended, so it may wait one step more than in the simulator (as on a real server).
    assert emu["output_throughput"] / scale == pytest.approx(sim["output_throughput"], rel=0.1)


def test_cli_prints_ready_serves_and_exits_cleanly_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "dynspec", "emulate", "--profile", "seed-blackwell",
                             "--arm", "dynamic", "--port", "0", "--time-scale", "1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"ready on http://127\.0\.0\.1:(\d+)", line)
        assert m, line + proc.stderr.read()
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/get_server_info", timeout=10) as r:
            info = json.loads(r.read())
        assert info["internal_states"][0]["dynspec"]["policy"] == "goodput" and info["dynspec_emulator"]["time_scale"] == 1000
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert time.monotonic() - t0 < 20
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("argv,needle", [
    (["--profile", "nope", "--arm", "eagle3"], "no such profile"),
    (["--profile", "seed-blackwell", "--arm", "eagle9"], "unknown arm"),
    (["--profile", "seed-blackwell", "--arm", "eagle3", "--time-scale", "0"], "time_scale"),
])
def test_cli_bad_arguments_exit_2_with_one_line(argv, needle):
    r = subprocess.run([sys.executable, "-m", "dynspec", "emulate", *argv, "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1

"""POST /v1/responses/input_tokens (design.md 8.12) through the real proxy with the openai SDK's
`responses.input_tokens.count`: the upstream's tokenizer counts the chat request the call would
send (SGLang's /v1/tokenize, vLLM's /tokenize), or a 501 says what the upstream lacks."""

from __future__ import annotations

import httpx2 as httpx
import openai
import pytest
from openai.types.responses import ResponseUsage

from proxy.config import parse
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}]


@pytest.mark.parametrize(("dialect", "path"), [("sglang", "/v1/tokenize"), ("vllm", "/tokenize")])
async def test_the_upstreams_tokenizer_counts_the_chat_request(upstream: FakeUpstream, start_proxy, dialect: str, path: str) -> None:
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url], "dialect": dialect}], "store": {"url": "none"}}))
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        counted = await client.responses.input_tokens.count(
            model="qwen3", instructions="Be brief.", input=[{"role": "user", "content": "what is the weather in Paris"}], tools=TOOLS  # type: ignore[list-item]
        )
    assert counted.object == "response.input_tokens"
    (asked,) = upstream.tokenized
    assert asked["path"] == path and asked["add_generation_prompt"] is True and asked["model"] == "qwen3"
    assert asked["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what is the weather in Paris"}]
    assert asked["tools"][0]["function"]["name"] == "get_weather"  # as the chat request has them
    assert counted.input_tokens == 2 + 6 + 4 * 2  # the fake's count: words, four a message
    assert upstream.requests == []  # counted, not generated


@pytest.mark.parametrize("dialect", ["generic", "llama.cpp"])
async def test_an_upstream_without_a_tokenizer_is_a_501_naming_it(upstream: FakeUpstream, start_proxy, dialect: str) -> None:
    """generic: none to ask; llama.cpp: the fake has no /apply-template (the real one is in make e2e)."""
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url], "dialect": dialect}]}))
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.APIStatusError) as refused:
            await client.responses.input_tokens.count(model="qwen3", input="hi")
    assert refused.value.status_code == 501
    assert "upstream u" in refused.value.message and refused.value.body["code"] == "not_implemented"


@pytest.mark.parametrize("dialect", ["generic", "llama.cpp"])
async def test_the_501_tells_the_sdks_not_to_retry(upstream: FakeUpstream, start_proxy, dialect: str) -> None:
    """design.md 8.12: the openai SDKs retry every 5xx twice unless `x-should-retry: false`;
    an upstream without a tokenizer lacks it on every try, so the SDK asks once, and the proxy
    asks the upstream (llama.cpp's /apply-template, a 404 from the fake) once."""
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url], "dialect": dialect}]}))
    sent: list[httpx.Request] = []

    async def count(request: httpx.Request) -> None:
        sent.append(request)

    async with httpx.AsyncClient(event_hooks={"request": [count]}) as http, openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", http_client=http) as client:
        assert client.max_retries == 2  # the SDK's default
        with pytest.raises(openai.APIStatusError) as refused:
            await client.responses.input_tokens.count(model="qwen3", input="hi")
    assert refused.value.status_code == 501 and refused.value.response.headers["x-should-retry"] == "false"
    assert len(sent) == 1


async def test_a_count_without_a_model_takes_the_first_routes(upstream: FakeUpstream, start_proxy) -> None:
    """`model` is optional in the SDK's count: the first route's model, as it goes upstream."""
    routes = [{"model": "qwen-*", "upstream": "u", "rewrite_model": "Qwen/Qwen3-8B"}, {"model": "*", "upstream": "u"}]
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "routes": routes}))
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        counted = await client.responses.input_tokens.count(input="how many tokens")
    assert counted.input_tokens == 3 + 4
    assert upstream.tokenized[0]["model"] == "Qwen/Qwen3-8B"


async def test_every_usage_is_the_newest_sdks_in_strict_mode(upstream: FakeUpstream, proxy: str) -> None:
    """`input_tokens_details.cache_write_tokens` is required by the newest `ResponseUsage`: a
    client that decodes strictly fails on a usage without it (0 where the upstream reports none)."""
    upstream.script(Reply(Generation([Step("text", "hi"), Step("finish", finish_reason="stop")])))
    async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0) as client:
        response = await client.responses.with_raw_response.create(model="m", input="hi")
    usage = response.http_response.json()["usage"]
    ResponseUsage.model_validate(usage, strict=True)
    assert usage["input_tokens_details"]["cache_write_tokens"] == 0

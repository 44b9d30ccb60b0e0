"""The Conversations API (design.md 9.7) through the real proxy, on both backends (a SQLite file,
a real Redis), with the openai SDK's conversations client: a conversation and its items, owned by
the key; responses made in it read its items and add their input and output, streamed, not and
in the background; one writer at a time (a 409 for the second); its id is the session key."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgspec
import openai
import orjson
import pytest
from openai.types.conversations import ConversationItemList, Message

from proxy.appkeys import RUNTIME
from proxy.config import parse
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.harness import Running


def answer(text: str) -> Generation:
    return Generation([Step("text", text), Step("finish", finish_reason="stop")])


@pytest.fixture
async def proxy_url(upstream: FakeUpstream, start_proxy, store: dict[str, Any]) -> str:
    # The session header names a call's session key upstream: a conversation's is its id.
    upstreams = [{"name": "u", "urls": [upstream.url], "session_header": "x-session-id"}]
    config = {"upstreams": upstreams, "store": store, "auth": {"api_keys": ["key-a", "key-b"]}}
    return await start_proxy(parse(config))


def client(url: str, key: str = "key-a") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=10)


async def test_a_conversation_and_its_items(proxy_url: str) -> None:
    async with client(proxy_url) as sdk, client(proxy_url, "key-b") as other:
        made = await sdk.conversations.create(metadata={"topic": "weather"}, items=[{"type": "message", "role": "user", "content": "Hi"}])
        assert made.object == "conversation" and made.metadata == {"topic": "weather"}
        assert (await sdk.conversations.retrieve(made.id)).id == made.id
        updated = await sdk.conversations.update(made.id, metadata={"topic": "rain"})
        assert updated.metadata == {"topic": "rain"}
        added = await sdk.conversations.items.create(made.id, items=[{"type": "message", "role": "assistant", "content": "Hello"}, {"type": "message", "role": "user", "content": "Rain?"}])
        assert len(added.data) == 2
        listed = await sdk.conversations.items.list(made.id, order="asc")
        assert [item.content[0].text for item in listed.data] == ["Hi", "Hello", "Rain?"]  # type: ignore[union-attr]
        page = await sdk.conversations.items.list(made.id, limit=1)  # newest first by default
        assert page.data[0].content[0].text == "Rain?" and page.has_more  # type: ignore[union-attr]
        first = listed.data[0].id  # type: ignore[union-attr]
        assert (await sdk.conversations.items.retrieve(first, conversation_id=made.id)).id == first
        await sdk.conversations.items.delete(first, conversation_id=made.id)
        assert len((await sdk.conversations.items.list(made.id)).data) == 2
        with pytest.raises(openai.NotFoundError):  # the key's own, as responses are
            await other.conversations.retrieve(made.id)
        deleted = await sdk.conversations.delete(made.id)
        assert deleted.deleted is True
        with pytest.raises(openai.NotFoundError):
            await sdk.conversations.retrieve(made.id)


@pytest.mark.parametrize("mode", ["plain", "stream", "background"])
async def test_responses_in_a_conversation_read_it_and_add_to_it(upstream: FakeUpstream, proxy_url: str, mode: str) -> None:
    upstream.script(Reply(answer("Sunny.")), Reply(answer("Yes, all day.")))
    async with client(proxy_url) as sdk:
        conversation = await sdk.conversations.create(items=[{"type": "message", "role": "system", "content": "Be brief."}])

        async def turn(text: str) -> Any:
            if mode == "stream":
                async with sdk.responses.stream(model="m", input=text, conversation=conversation.id) as events:
                    return await events.get_final_response()
            made = await sdk.responses.create(model="m", input=text, conversation=conversation.id, background=mode == "background")
            async with asyncio.timeout(10):
                while made.status in ("queued", "in_progress"):
                    await asyncio.sleep(0.05)
                    made = await sdk.responses.retrieve(made.id)
            return made

        first = await turn("Weather in Paris?")
        assert first.conversation is not None and first.conversation.id == conversation.id
        second = await turn("All day?")
        assert second.output_text == "Yes, all day."
        items = (await sdk.conversations.items.list(conversation.id, order="asc")).data
    said = [(m["role"], m["content"]) for m in upstream.requests[-1]["messages"]]
    assert said == [("system", "Be brief."), ("user", "Weather in Paris?"), ("assistant", "Sunny."), ("user", "All day?")]
    assert [item.role for item in items] == ["system", "user", "assistant", "user", "assistant"]  # type: ignore[union-attr]
    assert {headers["x-session-id"] for headers in upstream.headers} == {conversation.id}  # its session (11.1)


async def test_one_writer_at_a_time(upstream: FakeUpstream, proxy_url: str, http: aiohttp.ClientSession) -> None:
    """A response in progress holds its conversation: a second one, or a change of its items,
    is a 409 until it ends; then the conversation is free again."""
    slow = Generation([*(Step("text", f"w{i} ") for i in range(20)), Step("finish", finish_reason="stop")])
    upstream.script(Reply(slow, delay=0.05), Reply(answer("Done.")))
    headers = {"Authorization": "Bearer key-a"}
    async with client(proxy_url) as sdk:
        conversation = await sdk.conversations.create()
        body = {"model": "m", "input": "long one", "conversation": conversation.id, "stream": True}
        async with http.post(f"{proxy_url}/v1/responses", json=body, headers=headers) as running:
            await running.content.readline()  # under way
            for path, sent in (("/v1/responses", {**body, "input": "meanwhile"}), (f"/v1/conversations/{conversation.id}/items", {"items": [{"role": "user", "content": "x"}]})):
                async with http.post(f"{proxy_url}{path}", json=sent, headers=headers) as refused:
                    assert refused.status == 409, await refused.text()
                    assert (await refused.json())["error"]["code"] == "conversation_locked"
            await running.read()
        after = await sdk.responses.create(model="m", input="next", conversation=conversation.id)
    assert after.output_text == "Done."


async def test_a_turn_that_fails_lets_its_conversation_go(upstream: FakeUpstream, proxy_url: str) -> None:
    upstream.script(Reply(status=500, body={"error": {"message": "boom"}}), Reply(answer("Fine now.")))
    async with client(proxy_url) as sdk:
        conversation = await sdk.conversations.create()
        with pytest.raises(openai.APIStatusError):
            await sdk.responses.create(model="m", input="first", conversation=conversation.id)
        again = await sdk.responses.create(model="m", input="again", conversation=conversation.id)
        assert again.output_text == "Fine now."
        items = (await sdk.conversations.items.list(conversation.id, order="asc")).data
    assert [item.content[0].text for item in items] == ["again", "Fine now."]  # type: ignore[union-attr]


async def test_bad_uses_are_clear_400s(proxy_url: str) -> None:
    async with client(proxy_url) as sdk:
        conversation = await sdk.conversations.create()
        for kwargs, param in (
            ({"conversation": "conv_unknown"}, "conversation"),
            ({"conversation": conversation.id, "previous_response_id": "resp_1"}, "conversation"),
        ):
            with pytest.raises(openai.BadRequestError) as refused:
                await sdk.responses.create(model="m", input="hi", **kwargs)
            assert refused.value.param == param


async def test_a_compaction_and_a_token_count_read_a_conversation_and_hold_nothing(
    upstream: FakeUpstream, proxy_url: str, http: aiohttp.ClientSession
) -> None:
    """design.md 9.7: while a response holds the conversation, /v1/responses/compact and
    /v1/responses/input_tokens read its items and answer; nothing is added to it."""
    slow = Generation([*(Step("text", f"w{i} ") for i in range(20)), Step("finish", finish_reason="stop")])
    upstream.script(Reply(slow, delay=0.05), Reply(answer("A summary.")))
    headers = {"Authorization": "Bearer key-a"}
    async with client(proxy_url) as sdk:
        conversation = await sdk.conversations.create(items=[{"type": "message", "role": "user", "content": "Earlier question"}])
        body = {"model": "m", "input": "long one", "conversation": conversation.id, "stream": True}
        async with http.post(f"{proxy_url}/v1/responses", json=body, headers=headers) as running:
            await running.content.readline()  # under way: the conversation is held
            read = {"model": "m", "input": "now", "conversation": conversation.id}
            async with http.post(f"{proxy_url}/v1/responses/compact", json=read, headers=headers) as compacted:
                assert compacted.status == 200, await compacted.text()
            assert [m["content"] for m in upstream.requests[-1]["messages"]][:2] == ["Earlier question", "now"]
            async with http.post(f"{proxy_url}/v1/responses/input_tokens", json=read, headers=headers) as counted:
                assert counted.status == 200, await counted.text()
            await running.read()
        items = (await sdk.conversations.items.list(conversation.id, order="asc")).data
    assert [item.content[0].text for item in items] == ["Earlier question", "long one", "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 "]  # type: ignore[union-attr]


async def test_another_key_cannot_hold_a_conversation_it_cannot_see(upstream: FakeUpstream, proxy_url: str) -> None:
    """design.md 9.7, 9.5: the hold is its owner's. Key B, answered 404 or 400 for everything
    of key A's conversation, loops on its id while A adds items and makes responses: A never
    meets a 409 (B's attempts took the hold before its owner was checked)."""
    upstream.script(*(Reply(answer(f"Answer {n}.")) for n in range(5)))
    async with client(proxy_url) as sdk, client(proxy_url, "key-b") as other:
        conversation = await sdk.conversations.create()
        stop = asyncio.Event()
        refused: list[int] = []

        async def intrude() -> None:
            item = [{"type": "message", "role": "user", "content": "mine now"}]
            while not stop.is_set():
                for attempt in (
                    other.conversations.items.create(conversation.id, items=item),  # type: ignore[arg-type]
                    other.conversations.update(conversation.id, metadata={"x": "y"}),
                    other.responses.create(model="m", input="hi", conversation=conversation.id),
                ):
                    with pytest.raises(openai.APIStatusError) as answer_:
                        await attempt
                    refused.append(answer_.value.status_code)

        intruders = [asyncio.create_task(intrude()) for _ in range(4)]
        try:
            for n in range(20):
                await sdk.conversations.items.create(conversation.id, items=[{"type": "message", "role": "user", "content": f"item {n}"}])
                if n % 4 == 0:
                    await sdk.responses.create(model="m", input=f"turn {n}", conversation=conversation.id)
        finally:
            stop.set()
            await asyncio.gather(*intruders)
        assert refused and set(refused) <= {400, 404}
        assert len((await sdk.conversations.items.list(conversation.id, limit=100)).data) == 30


async def test_a_turn_reads_its_conversation_once_it_holds_it(upstream: FakeUpstream, tmp_path) -> None:
    """design.md 9.7: a response takes the hold, then reads the conversation, so that a turn
    that starts while another ends either meets its hold (a 409) or reads what it added: never
    an answer without the other's items, appended after them. The store's own statements, in
    order, show it."""
    running = await Running.start(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "store": {"url": f"sqlite:{tmp_path}/r.db"}}))
    try:
        statements: list[str] = []
        store = running.runner.app[RUNTIME].store
        store.backend._connection().set_trace_callback(statements.append)  # type: ignore[union-attr]
        upstream.script(Reply(answer("One.")))
        async with client(running.url) as sdk:
            conversation = await sdk.conversations.create()
            statements.clear()
            await sdk.responses.create(model="m", input="one", conversation=conversation.id)
            held = next(n for n, statement in enumerate(statements) if statement.startswith("UPDATE conversations SET holder = 'hold_"))
            read = next(n for n, statement in enumerate(statements) if statement.startswith("SELECT record FROM conversations"))
            assert held < read
            await store.hold(conversation.id, "", "another writer", 10.0)  # type: ignore[union-attr]
            with pytest.raises(openai.ConflictError):
                await sdk.responses.create(model="m", input="two", conversation=conversation.id)
    finally:
        await running.runner.cleanup()


async def test_a_conversations_messages_carry_their_status(upstream: FakeUpstream, proxy_url: str) -> None:
    """The SDK's conversation `Message` requires `status`: the messages a client added (as items,
    or as a response's input) carry it, as the model's do."""
    upstream.script(Reply(answer("Hello.")))
    async with client(proxy_url) as sdk:
        conversation = await sdk.conversations.create(items=[{"type": "message", "role": "user", "content": "Hi"}])
        await sdk.conversations.items.create(conversation.id, items=[{"type": "message", "role": "developer", "content": "Be brief."}])
        await sdk.responses.create(model="m", input="Go on", conversation=conversation.id)
        listed = await sdk.conversations.items.with_raw_response.list(conversation.id, order="asc")
        # The SDK builds what it parses without validating it: validated here, as its types say.
        items = ConversationItemList.model_validate(listed.http_response.json()).data
        assert [type(item) for item in items] == [Message] * 4
        assert [item.status for item in items] == ["completed"] * 4  # type: ignore[union-attr]
        assert [item.status for item in listed.parse().data] == ["completed"] * 4  # type: ignore[union-attr]
        found = await sdk.conversations.items.with_raw_response.retrieve(items[0].id, conversation_id=conversation.id)  # type: ignore[union-attr]
        assert Message.model_validate(found.http_response.json()).status == "completed"


async def test_a_conversations_items_are_named_where_they_were_sent(proxy_url: str) -> None:
    """design.md 5.3: what is wrong in a conversation's items names `items[i]`, as a response's
    input names `input[i]` (msgspec's path alone named `[0].content`)."""
    headers = {"Authorization": "Bearer key-a"}
    async with aiohttp.ClientSession() as http:
        for items, param in (
            ([{"role": "user", "content": 5}], "items[0].content"),
            ([{"role": "user", "content": "a"}, {"role": "user"}], "items[1].content"),
            ([{"type": "message", "role": "critic", "content": "a"}], "items[0].role"),
        ):
            async with http.post(f"{proxy_url}/v1/conversations", json={"items": items}, headers=headers) as answer:
                assert answer.status == 400 and (await answer.json())["error"]["param"] == param, items


async def test_an_item_kept_with_an_id_that_is_no_string_is_still_read(upstream: FakeUpstream, store: dict[str, Any]) -> None:
    """design.md 8.2: an id that is no string is refused where it is sent, not where it is kept: a
    conversation that kept one before that rule goes on (each of its turns was a 400 naming the
    turn's own `input[0].id`), the id ignored as every id is."""
    running = await Running.start(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "store": store}))
    try:
        upstream.script(Reply(answer("Again.")))
        async with client(running.url) as sdk:
            conversation = await sdk.conversations.create()
            kept = running.runner.app[RUNTIME].store
            found = await kept.conversation(conversation.id, "")
            earlier = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Earlier"}], "id": 123}
            await kept.keep_conversation(msgspec.structs.replace(found, items=[msgspec.Raw(orjson.dumps(earlier))]))
            made = await sdk.responses.create(model="m", input="Now", conversation=conversation.id)
        assert made.output_text == "Again."
        assert [m["content"] for m in upstream.requests[-1]["messages"]] == ["Earlier", "Now"]
    finally:
        await running.runner.cleanup()


async def test_a_message_kept_before_it_had_a_status_is_listed_with_one(upstream: FakeUpstream, store: dict[str, Any]) -> None:
    """A message a conversation kept before messages were kept with `status` is read back with
    one, listed and retrieved alike: the SDK's `Message` requires it."""
    running = await Running.start(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "store": store}))
    try:
        async with client(running.url) as sdk:
            conversation = await sdk.conversations.create()
            kept = running.runner.app[RUNTIME].store
            found = await kept.conversation(conversation.id, "")
            earlier = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Earlier"}], "id": "msg_old"}
            await kept.keep_conversation(msgspec.structs.replace(found, items=[msgspec.Raw(orjson.dumps(earlier))]))
            listed = await sdk.conversations.items.with_raw_response.list(conversation.id)
            retrieved = await sdk.conversations.items.with_raw_response.retrieve("msg_old", conversation_id=conversation.id)
        assert listed.http_response.json()["data"][0]["status"] == "completed"
        assert retrieved.http_response.json()["status"] == "completed"
    finally:
        await running.runner.cleanup()

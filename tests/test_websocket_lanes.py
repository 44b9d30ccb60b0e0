"""WebSocket lanes and steering (design.md 8.14) through the real proxy: the openai SDK's own
`AsyncResponsesWebSocketSession` (lanes named by `stream_id`) and a bare aiohttp WebSocket for
`response.steer`, the fake upstream behind, slowed where a turn must still be running."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import orjson
import pydantic
from openai.lib.responses_websocket import AsyncResponsesWebSocketSession, ResponsesWebSocketLimits
from openai.types.responses import ResponsesServerEvent

from tests.client import validate_event
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score, sglang_error
from tests.harness import config, scrape

LIMITS = ResponsesWebSocketLimits(max_lanes=4, max_events_per_lane=256, max_events=512, max_bytes_per_lane=1 << 22, max_bytes=1 << 23)
# The SDK's own type of whatever the server sends on its WebSocket, steering's events among them.
SERVER_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponsesServerEvent)
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


def words(text: str, n: int = 1) -> Generation:
    return Generation([*(Step("text", f"{text}{i} ", [score(f"{text}{i}")]) for i in range(n)), Step("finish", finish_reason="stop")])


def slow(generation: Generation) -> Reply:
    return Reply(generation, delay=0.05)


async def until(socket: aiohttp.ClientWebSocketResponse, kind: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Read events into `events` up to the first of type `kind`."""
    while True:
        event = await socket.receive_json(timeout=10)
        events.append(event)
        if event["type"] == kind:
            return event


async def test_lanes_run_at_once_each_in_order_and_every_event_names_its_lane(upstream: FakeUpstream, proxy: str) -> None:
    upstream.choose = lambda body: slow(words("slow", 20)) if body["messages"][-1]["content"] == "slow" else Reply(words("fast"))
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=10)
    async with client.responses.connect() as connection, AsyncResponsesWebSocketSession(connection, limits=LIMITS) as session:
        slow_lane, fast_lane = session.lane("slow"), session.lane("fast")
        await slow_lane.send({"type": "response.create", "model": "m", "input": "slow", "store": False})
        await fast_lane.send({"type": "response.create", "model": "m", "input": "fast", "store": False})
        fast = await asyncio.wait_for(fast_lane.get_final_response(), 10)
        # The fast lane's turn ended while the slow one still streamed: they ran at once.
        assert fast.output_text == "fast0 " and upstream.active_streams == 1
        slow_answer = await asyncio.wait_for(slow_lane.get_final_response(), 10)
        assert slow_answer.output_text == "".join(f"slow{i} " for i in range(20))
    await client.close()


async def test_a_lanes_turns_run_in_the_order_sent(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.choose = lambda body: slow(words(body["messages"][-1]["content"], 3))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        for text in ("one", "two"):
            await socket.send_json({"type": "response.create", "model": "m", "input": text, "store": False, "stream_id": "lane.1"})
        events: list[dict[str, Any]] = []
        while sum(event["type"] in TERMINAL for event in events) < 2:
            events.append(await socket.receive_json(timeout=10))
    assert {event.get("stream_id") for event in events} == {"lane.1"}
    for event in events:
        validate_event({key: value for key, value in event.items() if key != "stream_id"})
    kinds = [event["type"] for event in events]
    first_end = kinds.index("response.completed")
    assert kinds.index("response.created", 1) == first_end + 1  # the second began after the first ended
    texts = [event["response"]["output"][0]["content"][0]["text"] for event in events if event["type"] == "response.completed"]
    assert texts == ["one0 one1 one2 ", "two0 two1 two2 "]


async def test_lanes_past_the_cap_wait_for_one_to_end(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 8.14: at most `connections.websocket_lanes` lanes run at once on a connection;
    the next lane's turn starts when one ends (here one at a time)."""
    url = await start_proxy(config(upstream.url, connections={"websocket_lanes": 1}))
    upstream.choose = lambda body: slow(words(body["messages"][-1]["content"], 4))
    async with http.ws_connect(f"{url}/v1/responses") as socket:
        for lane in ("a", "b"):
            await socket.send_json({"type": "response.create", "model": "m", "input": lane, "store": False, "stream_id": lane})
        events: list[dict[str, Any]] = []
        while sum(event["type"] == "response.completed" for event in events) < 2:
            events.append(await socket.receive_json(timeout=10))
    marks = [(event["stream_id"], event["type"]) for event in events if event["type"] in ("response.created", "response.completed")]
    assert marks == [("a", "response.created"), ("a", "response.completed"), ("b", "response.created"), ("b", "response.completed")]


async def test_waiting_frames_start_in_the_order_they_came_across_lanes(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    """design.md 8.14: with all `connections.websocket_lanes` (8) running, lane x's frame, sent
    before the eight lanes' second frames, starts at the first lane's end, before any of them
    (it waited for all eight, lanes first seen going first). The eight first turns are held by
    the upstream until the proxy has read every frame (a steer's answer, which comes in the
    order the frames came, says so), then one is let go: one slot frees."""
    lanes = [f"l{i}" for i in range(8)]
    holds = {lane: asyncio.Event() for lane in lanes}
    upstream.choose = lambda body: Reply(words(body["messages"][-1]["content"]), hold=holds.get(body["messages"][-1]["content"]))
    events: list[dict[str, Any]] = []
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:

        async def create(lane: str, text: str) -> None:
            await socket.send_json({"type": "response.create", "model": "m", "input": text, "store": False, "stream_id": lane})

        for lane in lanes:
            await create(lane, lane)
        await create("x", "x")
        for lane in lanes:
            await create(lane, f"{lane} again")
        await socket.send_json({"type": "response.steer", "previous_response_id": "resp_none", "input": "sync"})
        await until(socket, "response.steer.failed", events)
        assert not [event for event in events if event["type"] in TERMINAL]  # every frame read, none ended
        holds["l0"].set()
        while True:  # to the first turn started after the first ended: x's, or a lane's second
            lane = (await until(socket, "response.created", events))["stream_id"]
            if lane == "x" or [event.get("stream_id") for event in events if event["type"] == "response.created"].count(lane) == 2:
                break
        assert lane == "x"
        for hold in holds.values():
            hold.set()
        while sum(event["type"] in TERMINAL for event in events) < 17:
            events.append(await socket.receive_json(timeout=10))
    texts = {event["response"]["output"][0]["content"][0]["text"] for event in events if event["type"] == "response.completed"}
    assert texts == {"x0 ", *(f"{lane}0 " for lane in lanes), *(f"{lane} again0 " for lane in lanes)}


async def test_a_lane_name_outside_the_sdks_rule_is_an_error_frame(proxy: str, http: aiohttp.ClientSession) -> None:
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "x", "stream_id": "no spaces"})
        error = await socket.receive_json(timeout=10)
    assert error["type"] == "error" and error["error"]["param"] == "stream_id" and "stream_id" not in error


async def test_a_steer_stops_the_turn_and_a_successor_takes_its_input(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(slow(words("english", 40)), Reply(words("french")))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "talk", "store": False, "instructions": "Be brief.", "stream_id": "chat"})
        events: list[dict[str, Any]] = []
        created = await until(socket, "response.created", events)
        await until(socket, "response.output_text.delta", events)
        steer = {"type": "response.steer", "previous_response_id": created["response"]["id"], "input": "in French, please"}
        await socket.send_json(steer)
        accepted = SERVER_EVENT.validate_python(await until(socket, "response.steer.accepted", events)).model_dump()
        stopped = await until(socket, "response.incomplete", events)
        successor = await until(socket, "response.created", events)
        done = await until(socket, "response.completed", events)
    assert accepted["steer"]["previous_response_id"] == created["response"]["id"] and accepted["stream_id"] == "chat"
    assert stopped["response"]["incomplete_details"] == {"reason": "steered"}
    validate_event({key: value for key, value in stopped.items() if key != "stream_id"})
    cut = stopped["response"]["output"][0]
    assert cut["status"] == "incomplete" and 0 < len(cut["content"][0]["text"]) < len("".join(f"english{i} " for i in range(40)))
    # The successor continues the steered response, with its settings, and the steer's input.
    assert successor["response"]["previous_response_id"] == created["response"]["id"] and successor["stream_id"] == "chat"
    assert successor["response"]["instructions"] == "Be brief."
    assert done["response"]["output"][0]["content"][0]["text"] == "french0 "
    sent = upstream.requests[-1]["messages"]
    assert sent[-2] == {"role": "assistant", "content": cut["content"][0]["text"]} and sent[-1] == {"role": "user", "content": "in French, please"}
    assert upstream.disconnects == 1  # the steered generation stopped


async def test_a_steered_call_is_no_failed_call(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """design.md 12.1, 12.2: the call a steer stopped is cut short from the client's side, as a
    client's leaving is: not timed as a failure of the upstream's (only its successor, whole)."""
    upstream.script(slow(words("english", 40)), Reply(words("french")))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "talk", "store": False})
        events: list[dict[str, Any]] = []
        created = await until(socket, "response.created", events)
        await until(socket, "response.output_text.delta", events)
        await socket.send_json({"type": "response.steer", "previous_response_id": created["response"]["id"], "input": "stop"})
        await until(socket, "response.completed", events)
    timed = {labels: n for (name, labels), n in (await scrape(http, proxy)).items() if name == "gen_ai_client_operation_duration_seconds_count"}
    assert [(dict(labels)["error_type"], n) for labels, n in timed.items()] == [("", 1.0)]


async def test_a_steer_during_a_client_tool_call_waits_for_its_output(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    arguments = [f'{{"q": "{"x" * 30}' if i == 0 else ("x" * 5 if i < 10 else '"}') for i in range(11)]
    calling = Generation([
        *(Step("tool", part, [score(part)], tool_id="call_9" if i == 0 else None, tool_name="lookup" if i == 0 else None) for i, part in enumerate(arguments)),
        Step("finish", finish_reason="tool_calls"),
    ])
    upstream.script(slow(calling), Reply(words("answer")))
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "find", "tools": [tool], "store": False})
        events: list[dict[str, Any]] = []
        created = await until(socket, "response.created", events)
        await until(socket, "response.function_call_arguments.delta", events)
        await socket.send_json({"type": "response.steer", "previous_response_id": created["response"]["id"], "input": [{"role": "user", "content": "and be quick"}]})
        completed = await until(socket, "response.completed", events)  # the call was not cut
        pending = await until(socket, "response.steer.pending", events)
        assert "response.steer.accepted" in [event["type"] for event in events]
        assert completed["response"]["output"][0]["arguments"] == "".join(arguments)
        SERVER_EVENT.validate_python(pending)  # the SDK's own type, its required fields
        assert pending["reason"] == "waiting_for_required_input"
        assert pending["required_input"] == [{"type": "function_call_output", "call_id": "call_9", "name": "lookup"}]
        output = {"type": "function_call_output", "call_id": "call_9", "output": "found it"}
        await socket.send_json({"type": "response.create", "model": "m", "previous_response_id": created["response"]["id"], "input": [output], "tools": [tool], "store": False})
        await until(socket, "response.completed", events)
    sent = upstream.requests[-1]["messages"]
    assert sent[-2] == {"role": "tool", "tool_call_id": "call_9", "content": "found it"} and sent[-1] == {"role": "user", "content": "and be quick"}


async def test_a_steer_that_cannot_be_taken_comes_back_failed(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(words("done")))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:

        async def steered(target: str, input: Any, **extra: Any) -> dict[str, Any]:
            await socket.send_json({"type": "response.steer", "previous_response_id": target, "input": input, **extra})
            return await until(socket, "response.steer.failed", [])

        unknown = await steered("resp_nowhere", "hi")
        await socket.send_json({"type": "response.create", "model": "m", "input": "hi", "store": False})
        ended = await until(socket, "response.completed", [])
        late = await steered(ended["response"]["id"], "hi")
        wrong = await steered(ended["response"]["id"], [{"role": "assistant", "content": "no"}])
        laned = await steered(ended["response"]["id"], "hi", stream_id="x")
    assert (unknown["error"]["code"], unknown["steer"]["input"]) == ("response_not_found", "hi")
    assert late["error"]["code"] == "response_already_completed"
    assert wrong["error"]["code"] == "invalid_input" and wrong["steer"]["input"] == [{"role": "assistant", "content": "no"}]
    assert laned["error"]["code"] == "invalid_input"
    for event in (unknown, late, laned):
        SERVER_EVENT.validate_python(event)
    # Returned as sent, which the SDK's type cannot hold (it parses events unchecked, and keeps it).
    SERVER_EVENT.validate_python({**wrong, "steer": {**wrong["steer"], "input": "as sent"}})


async def test_a_steer_whose_input_a_request_would_refuse_leaves_the_turn_running(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    """design.md 8.14: a steer's input is read as a request's input is, before the steer is
    taken: a part missing its text fails the steer, and the turn runs on to its end."""
    upstream.script(slow(words("long", 20)))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "talk", "store": False})
        events: list[dict[str, Any]] = []
        created = await until(socket, "response.created", events)
        broken = [{"role": "user", "content": [{"type": "input_text"}]}]
        await socket.send_json({"type": "response.steer", "previous_response_id": created["response"]["id"], "input": broken})
        failed = await until(socket, "response.steer.failed", events)
        await until(socket, "response.completed", events)
    assert failed["error"]["code"] == "invalid_input" and "input[0].content[0].text" in failed["error"]["message"]
    assert "response.steer.accepted" not in [event["type"] for event in events]


async def test_a_create_frame_with_a_previous_response_id_of_another_type_is_refused_as_over_http(
    proxy: str, http: aiohttp.ClientSession
) -> None:
    """design.md 5.3, 8.9: the frame is read as the request body is, a 400's envelope naming the
    field (it was a 500 where the frame's steers are looked up by that id)."""
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "hi", "previous_response_id": ["resp_x"]})
        error = await socket.receive_json(timeout=10)
    assert error["type"] == "error" and error["error"]["param"] == "previous_response_id"
    assert error["error"]["type"] == "invalid_request_error"


async def test_a_conversations_turn_is_not_steered(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(slow(words("long", 30)))
    async with http.post(f"{proxy}/v1/conversations", json={}) as response:
        conversation = orjson.loads(await response.read())["id"]
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "hi", "conversation": conversation})
        created = await until(socket, "response.created", [])
        await socket.send_json({"type": "response.steer", "previous_response_id": created["response"]["id"], "input": "stop"})
        events: list[dict[str, Any]] = []
        refused = await until(socket, "response.steer.failed", events)
        await until(socket, "response.completed", events)
    assert refused["error"]["code"] == "steering_not_supported"


async def test_a_steer_during_an_mcp_call_lets_it_finish_and_the_model_read_it(
    upstream: FakeUpstream, tool_server, start_proxy, http: aiohttp.ClientSession
) -> None:
    """A steer that comes while the proxy runs the round's calls stops the response only once their
    results are the next round's: nothing run is lost (8.14, 14.4)."""
    url = await start_proxy(config(upstream.url, mcp={"allowed_servers": [tool_server.url]}))
    tool = {"type": "mcp", "server_label": "calc", "server_url": tool_server.url, "require_approval": "never"}
    call = Generation([Step("tool", '{"seconds": 0.5}', [score("{")], tool_id="call_1", tool_name="calc__sleep"), Step("finish", finish_reason="tool_calls")])
    upstream.script(Reply(call), slow(words("after", 30)), Reply(words("steered")))
    async with http.ws_connect(f"{url}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "wait", "tools": [tool], "store": False})
        events: list[dict[str, Any]] = []
        created = await until(socket, "response.created", events)
        await until(socket, "response.mcp_call.in_progress", events)
        await socket.send_json({"type": "response.steer", "previous_response_id": created["response"]["id"], "input": "now this"})
        stopped = await until(socket, "response.incomplete", events)
        await until(socket, "response.completed", events)
    ran = next(item for item in stopped["response"]["output"] if item["type"] == "mcp_call")
    assert (ran["status"], ran["output"]) == ("completed", "slept")
    assert stopped["response"]["incomplete_details"] == {"reason": "steered"}
    assert upstream.requests[1]["messages"][-1] == {"role": "tool", "tool_call_id": ran["id"], "content": "slept"}
    assert upstream.requests[-1]["messages"][-1] == {"role": "user", "content": "now this"}


async def test_a_successor_that_cannot_be_made_returns_the_steers(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(slow(words("long", 30)), sglang_error(503, "overloaded"))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "talk", "store": False, "stream_id": "s"})
        events: list[dict[str, Any]] = []
        created = await until(socket, "response.created", events)
        await until(socket, "response.output_text.delta", events)
        await socket.send_json({"type": "response.steer", "previous_response_id": created["response"]["id"], "input": "shorter"})
        await until(socket, "response.incomplete", events)
        failed = await until(socket, "response.steer.failed", events)
        error = await until(socket, "error", events)
    assert failed["error"]["code"] == "successor_creation_failed" and failed["steer"]["input"] == "shorter"
    assert failed["stream_id"] == "s" and error["stream_id"] == "s"

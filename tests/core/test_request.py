"""Unit tests of the request core: `parse_request` (schema, refusals) and `plan_call`
(the Responses request as the chat request sent upstream). No I/O."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.responses.body import load_json
from proxy.responses.plan import Call, TranslationSettings, plan_call
from proxy.responses.schema import parse_request
from tests.client import LOGPROBS

UPSTREAM_MODEL = "upstream-model"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
WEATHER = {"type": "function", "name": "weather", "description": "the weather", "parameters": SCHEMA, "strict": True}
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"a": 1}'}}
CALL_ITEM = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"a": 1}'}
IMAGE = "data:image/png;base64,iVBORw0KGgo="


def plan(body: dict[str, Any], **upstream: Any) -> Call:
    return plan_call(parse_request({"model": "client-model", **body}), TranslationSettings(UPSTREAM_MODEL, **upstream))


def chat(body: dict[str, Any], **upstream: Any) -> dict[str, Any]:
    return plan(body, **upstream).chat


def messages(items: Any, **upstream: Any) -> list[dict]:
    """The chat messages for `input`; keys the chat API lets be null or absent
    (an assistant's `content` beside its tool calls) are dropped when null."""
    sent = chat({"input": items}, **upstream)["messages"]
    return [{k: v for k, v in m.items() if v is not None} for m in sent]


def refusal(body: bytes | dict[str, Any], **upstream: Any) -> InvalidRequest:
    """The refusal of a raw body (read as the HTTP layer reads it) or of request fields."""
    with pytest.raises(InvalidRequest) as caught:
        data = load_json(body, 128) if isinstance(body, bytes) else {"model": "client-model", "input": "hi", **body}
        plan_call(parse_request(data), TranslationSettings(UPSTREAM_MODEL, **upstream))
    return caught.value


def msg(role: str, content: Any, typed: bool = True) -> dict:
    item = {"role": role, "content": content}
    return {"type": "message", **item} if typed else item


def reasoning(text: str, *, summary: bool = False) -> dict:
    if summary:
        return {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
    return {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


# -- input items -> messages -------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        pytest.param("hi", [{"role": "user", "content": "hi"}], id="string"),
        *(
            pytest.param([msg(role, "x")], [{"role": role, "content": "x"}], id=f"{role}-string")
            for role in ("user", "system", "assistant")
        ),
        pytest.param([msg("developer", "x")], [{"role": "system", "content": "x"}], id="developer-is-system"),
        pytest.param([msg("user", "x", typed=False)], [{"role": "user", "content": "x"}], id="easy-message-no-type"),
        pytest.param(
            [msg("user", [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}])],
            [{"role": "user", "content": "ab"}],
            id="input_text-parts",
        ),
        pytest.param(
            [msg("system", [{"type": "input_text", "text": "rules"}])],
            [{"role": "system", "content": "rules"}],
            id="system-parts",
        ),
        pytest.param(
            [msg("user", [
                {"type": "input_text", "text": "what is this?"},
                {"type": "input_image", "image_url": IMAGE, "detail": "high"},
                {"type": "input_image", "image_url": IMAGE},
                {"type": "input_image", "image_url": IMAGE, "detail": "original"},
            ])],
            [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": IMAGE, "detail": "high"}},
                {"type": "image_url", "image_url": {"url": IMAGE}},
                {"type": "image_url", "image_url": {"url": IMAGE, "detail": "high"}},  # chat has no "original"
            ]}],
            id="input_image-parts",
        ),
        pytest.param(
            [
                msg("user", "hi"),
                {**msg("assistant", [{"type": "output_text", "text": "hello", "annotations": [], "logprobs": []}]),
                 "id": "msg_1", "status": "completed"},
                msg("user", "again"),
            ],
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}],
            id="replayed-output_text",
        ),
        pytest.param(
            [msg("assistant", "let me look"), CALL_ITEM],
            [{"role": "assistant", "content": "let me look", "tool_calls": [CALL]}],
            id="text-then-call-merge",
        ),
        pytest.param(
            [CALL_ITEM, msg("assistant", "looking")],
            [{"role": "assistant", "content": "looking", "tool_calls": [CALL]}],
            id="call-then-text-merge",
        ),
        pytest.param(
            [CALL_ITEM, {**CALL_ITEM, "call_id": "call_2", "arguments": "{}"}],
            [{"role": "assistant", "tool_calls": [
                CALL, {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": "{}"}},
            ]}],
            id="two-calls-one-message",
        ),
        pytest.param(
            [msg("user", "q"), CALL_ITEM, {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
            [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
            id="function_call_output",
        ),
        pytest.param(
            [CALL_ITEM, {"type": "function_call_output", "call_id": "call_1",
                         "output": [{"type": "input_text", "text": "sun"}, {"type": "input_text", "text": "ny"}]}],
            [{"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
            id="function_call_output-parts",
        ),
        pytest.param(
            [CALL_ITEM, {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}, msg("assistant", "It is sunny.")],
            [{"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
             {"role": "assistant", "content": "It is sunny."}],
            id="text-after-tool-output-is-new-turn",
        ),
    ],
)
def test_input_items(items, expected):
    assert messages(items) == expected


def test_replayed_tool_only_answer_keeps_tool_message_after_its_call():
    """design.md 3.9: a tool-only answer with logprobs comes back as [function_call, message
    with empty output_text]; replayed, that must still be one assistant turn whose tool
    calls the tool message answers."""
    empty = {**msg("assistant", [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]), "id": "msg_1"}
    sent = messages([msg("user", "q"), CALL_ITEM, empty, {"type": "function_call_output", "call_id": "call_1", "output": "ok"}])
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"] == [CALL]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("summary", [False, True], ids=["content", "summary"])
def test_reasoning_goes_to_next_assistant_message(field, summary):
    items = [msg("user", "q"), reasoning("think", summary=summary), msg("assistant", "answer"), msg("user", "more")]
    assert messages(items, reasoning_field=field) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "answer", field: "think"},
        {"role": "user", "content": "more"},
    ]


def test_reasoning_before_a_tool_call():
    assert messages([reasoning("plan"), CALL_ITEM]) == [
        {"role": "assistant", "reasoning_content": "plan", "tool_calls": [CALL]},
    ]


@pytest.mark.parametrize("field", ["reasoning_content", None])
def test_reasoning_only_turn_keeps_its_reasoning(field):
    """A replayed reasoning-only answer: its reasoning stays with that turn, never with the
    next assistant turn; reasoning with no turn after it is dropped."""
    items = [msg("user", "q1"), reasoning("alone"), msg("user", "q2"), msg("assistant", "a2"), reasoning("trailing")]
    turn = [{"role": "assistant", "content": "", field: "alone"}] if field else []
    assert messages(items, reasoning_field=field) == [
        {"role": "user", "content": "q1"},
        *turn,
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
    ]


def test_reasoning_dropped_when_upstream_takes_none():
    items = [reasoning("think"), msg("assistant", "answer")]
    assert messages(items, reasoning_field=None) == [{"role": "assistant", "content": "answer"}]


def test_instructions_lead_as_system_message():
    sent = chat({"input": "hi", "instructions": "be brief"})["messages"]
    assert sent == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_leading_system_messages_merge_with_instructions():
    """design.md 8.2: many chat templates refuse a second system message."""
    items = [msg("developer", "rules"), msg("system", [{"type": "input_text", "text": "more"}]), msg("user", "hi")]
    assert messages(items) == [{"role": "system", "content": "rules\n\nmore"}, {"role": "user", "content": "hi"}]
    with_instructions = chat({"input": items, "instructions": "be brief"})["messages"]
    assert with_instructions[0] == {"role": "system", "content": "be brief\n\nrules\n\nmore"}


@pytest.mark.parametrize("role", ["system", "user"])
def test_later_system_messages_take_the_upstreams_role(role):
    items = [msg("developer", "rules"), msg("user", "hi"), msg("developer", "now be brief"), msg("user", "again")]
    assert messages(items, late_system_role=role) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "hi"},
        {"role": role, "content": "now be brief"},
        {"role": "user", "content": "again"},
    ]


# -- parameters --------------------------------------------------------------------------


def test_minimal_request_sends_only_what_was_asked():
    assert chat({"input": "hi"}) == {"model": UPSTREAM_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ({"max_output_tokens": 64}, {"max_completion_tokens": 64, "max_tokens": 64}),
        ({"temperature": 0.3}, {"temperature": 0.3}),
        ({"top_p": 0.9}, {"top_p": 0.9}),
        ({"user": "u-1"}, {}),  # accepted, not sent (design.md 8.1)
        ({"parallel_tool_calls": False}, {"parallel_tool_calls": False}),
        ({"presence_penalty": 0.5, "frequency_penalty": -0.5}, {"presence_penalty": 0.5, "frequency_penalty": -0.5}),
        ({"reasoning": {"effort": "low"}}, {"reasoning_effort": "low"}),
        ({"reasoning": {"summary": "auto"}}, {}),
        ({"text": {"format": {"type": "text"}}}, {}),
        ({"text": {"format": {"type": "json_object"}}}, {"response_format": {"type": "json_object"}}),
        (
            {"text": {"format": {"type": "json_schema", "name": "out", "schema": SCHEMA, "strict": True}}},
            {"response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": SCHEMA, "strict": True}}},
        ),
        ({"include": ["reasoning.encrypted_content"]}, {}),  # spec values with no effect here are no-ops
        ({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}),
        ({"stream": False}, {}),
    ],
    ids=lambda value: ",".join(value) if isinstance(value, dict) else None,
)
def test_parameters_pass_through(given, sent):
    base = chat({"input": "hi"})
    assert chat({"input": "hi", **given}) == {**base, **sent}


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        (WEATHER, {"name": "weather", "description": "the weather", "parameters": SCHEMA, "strict": True}),
        ({"type": "function", "name": "ping"}, {"name": "ping"}),
    ],
    ids=["full", "name-only"],
)
def test_function_tools_nested(tool, expected):
    assert chat({"input": "hi", "tools": [tool]})["tools"] == [{"type": "function", "function": expected}]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("none", "none"),
        ("auto", "auto"),
        ("required", "required"),
        ({"type": "function", "name": "weather"}, {"type": "function", "function": {"name": "weather"}}),
    ],
)
def test_tool_choice(choice, expected):
    assert chat({"input": "hi", "tools": [WEATHER], "tool_choice": choice})["tool_choice"] == expected


def _nulls(value: Any, path: str = "$") -> list[str]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in ([f"{path}.{k}"] if v is None else _nulls(v, f"{path}.{k}"))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _nulls(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize(
    "body",
    [
        {"input": "hi"},
        {"input": "hi", "instructions": None, "temperature": None, "top_p": None, "user": None, "tools": None,
         "tool_choice": None, "parallel_tool_calls": None, "text": None, "reasoning": None, "stream": None,
         "max_output_tokens": None, "top_logprobs": None, "include": None, "presence_penalty": None},
        {"input": "hi", "tools": [{"type": "function", "name": "ping", "description": None, "parameters": None, "strict": None}],
         "text": {"format": {"type": "json_schema", "name": "out", "schema": SCHEMA}}, "reasoning": {"effort": None},
         "include": LOGPROBS},
    ],
    ids=["minimal", "explicit-nulls", "nested-optionals"],
)
def test_no_null_values_sent(body):
    sent = chat(body)
    assert _nulls({k: v for k, v in sent.items() if k != "messages"}) == []


def test_route_model_replaces_clients():
    call = plan({"input": "hi"})
    assert call.chat["model"] == UPSTREAM_MODEL
    assert call.echo["model"] == "client-model"


def test_route_defaults_fill_in_what_request_leaves_out():
    """An upstream's config `defaults` apply to every request that does not set the key;
    the request wins where it does."""
    defaults = {"temperature": 0.6, "top_k": 20}
    assert chat({"input": "hi"}, defaults=defaults) == {**chat({"input": "hi"}), **defaults}
    assert chat({"input": "hi", "temperature": 0.1}, defaults=defaults)["temperature"] == 0.1


@pytest.mark.parametrize(
    ("given", "defaults", "echoed"),
    [
        ({}, {}, (1.0, 1.0, None, True)),
        ({"top_p": 0.5, "max_output_tokens": 64}, {"temperature": 0.6, "top_p": 0.9, "max_tokens": 256}, (0.6, 0.5, 64, True)),
        ({}, {"max_tokens": 256, "parallel_tool_calls": False}, (1.0, 1.0, 256, False)),
    ],
)
def test_the_response_repeats_the_sampling_settings_as_sent(given, defaults, echoed):
    """The route's defaults are what applied where the request left a setting out."""
    echo = plan({"input": "hi", **given}, defaults=defaults).echo
    assert (echo["temperature"], echo["top_p"], echo["max_output_tokens"], echo["parallel_tool_calls"]) == echoed


# -- logprobs (design.md 3.1-3.4 and 3.10) ----------------------------------------


@pytest.mark.parametrize(
    ("include", "requested", "cap", "sent", "echo"),
    [
        (True, 15, 20, 15, 15),
        (True, None, 20, 0, 0),
        (True, 0, 20, 0, 0),
        (False, 5, 20, None, 5),
        (False, None, 20, None, 0),
        (True, 21, 20, 20, 20),
        (False, 21, 20, None, 20),
        (True, 15, 3, 3, 3),
        (True, 2, 3, 2, 2),
        (False, 5, 3, None, 3),
    ],
)
def test_logprobs_rules(include, requested, cap, sent, echo):
    body: dict[str, Any] = {"input": "hi"}
    if include:
        body["include"] = ["reasoning.encrypted_content", *LOGPROBS]
    if requested is not None:
        body["top_logprobs"] = requested
    call = plan(body, max_top_logprobs=cap)
    expected = {} if sent is None else {"logprobs": True, "top_logprobs": sent}
    assert {k: call.chat[k] for k in ("logprobs", "top_logprobs") if k in call.chat} == expected
    assert call.logprobs is include
    assert call.echo["top_logprobs"] == echo


def test_logprobs_refused_on_route_without_support():
    error = refusal({"include": LOGPROBS, "top_logprobs": 2}, logprobs=False)
    assert error.param == "include"
    assert error.status == 400


def test_route_without_logprob_support_serves_plain_requests():
    call = plan({"input": "hi", "top_logprobs": 2}, logprobs=False)
    assert "logprobs" not in call.chat and "top_logprobs" not in call.chat
    assert call.echo["top_logprobs"] == 2


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param(b'{"model": "m", "input": ', None, id="malformed-json"),
        pytest.param(b"", None, id="empty-body"),
        pytest.param(b'[{"model": "m", "input": "hi"}]', None, id="array-body"),
        pytest.param(b'"hi"', None, id="string-body"),
        pytest.param(b'{"input": "hi"}', "model", id="no-model"),
        pytest.param(b'{"model": "m"}', "input", id="no-input"),
        pytest.param({"include": ["message.output_text.logprob"]}, "include[0]", id="include-typo"),
        pytest.param({"include": [*LOGPROBS, "output_text.logprobs"]}, "include[1]", id="include-unknown-second"),
        *(
            pytest.param({"top_logprobs": value}, "top_logprobs", id=f"top_logprobs-{value!r}")
            for value in (-1, 1.5, "3", True)
        ),
        pytest.param({"max_output_tokens": 0}, "max_output_tokens", id="max_output_tokens-0"),
        pytest.param({"max_output_tokens": -5}, "max_output_tokens", id="max_output_tokens-negative"),
        pytest.param({"temperature": 3}, "temperature", id="temperature-3"),
        pytest.param({"text": {"format": {"type": "json_schema", "name": "out"}}}, "text.format.schema", id="json_schema-no-schema"),
        pytest.param({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name", id="tool_choice-undeclared"),
        pytest.param({"tool_choice": {"type": "function", "name": "weather"}}, "tool_choice.name", id="tool_choice-no-tools"),
        pytest.param({"tools": [{"type": "function", "parameters": SCHEMA}]}, "tools[0].name", id="tool-without-name"),
        pytest.param({"tools": [{"type": "function", "name": "f", "parameters": ["a"]}]}, "tools[0].parameters", id="tool-parameters-array"),
        pytest.param({"input": []}, "input", id="empty-input-list"),
        pytest.param({"input": [{"type": "hologram", "id": "x"}]}, "input[0].type", id="unknown-item-type"),
        pytest.param({"input": [msg("user", "a"), {"type": "hologram"}]}, "input[1].type", id="unknown-item-type-second"),
        # Found by tests/test_fuzz.py: a type that cannot be a key was a TypeError, a 500.
        pytest.param({"input": [{"type": ["additional_tools"]}]}, "input[0].type", id="item-type-a-list"),
        pytest.param({"input": [{"type": {"a": 1}}]}, "input[0].type", id="item-type-an-object"),
        pytest.param({"input": [msg("user", "a"), msg("moderator", "b")]}, "input[1].role", id="unknown-role"),
        pytest.param(
            {"input": [msg("user", [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}])]},
            "input[0].content[0].type",
            id="unknown-content-part",
        ),
        pytest.param({"stream_options": {"include_usage": True}}, "stream_options", id="stream_options-without-stream"),
    ],
)
def test_refused(body, param):
    error = refusal(body)
    assert error.param == param
    assert error.status == 400
    envelope = error.envelope()["error"]
    assert envelope["type"] == "invalid_request_error"
    assert envelope["param"] == param
    assert envelope["message"]


@pytest.mark.parametrize("body", [{"background": False}, {"include": ["web_search_call.results", "file_search_call.results"]}])
def test_accepted_no_ops(body):
    assert chat({"input": "hi", **body}) == chat({"input": "hi"})


def update(effort: Any = ..., text: Any = None) -> dict[str, Any]:
    """A `configuration_update` item: an effort (left out by default), a text format."""
    item: dict[str, Any] = {"type": "configuration_update"}
    if effort is not ...:
        item["reasoning"] = {"effort": effort}
    if text is not None:
        item["text"] = {"format": text}
    return item


JSON_SCHEMA = {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}


def test_a_configuration_update_sets_what_the_generations_after_it_use():
    """design.md 8.2: each setting of the last update that sets it applies, over the request's
    own; the chat's messages are those sent without it, byte for byte."""
    said = [msg("user", "hi"), msg("assistant", "Hello."), msg("user", "again")]
    plain = chat({"input": said, "reasoning": {"effort": "low"}})
    items = [said[0], update("high", JSON_SCHEMA), said[1], update(text={"type": "text"}), said[2]]
    updated = chat({"input": items, "reasoning": {"effort": "low"}})
    assert updated["messages"] == plain["messages"]
    assert plain["reasoning_effort"] == "low" and updated["reasoning_effort"] == "high"
    assert "response_format" not in updated  # the later update set the text format back to text
    formatted = chat({"input": [said[0], update(text=JSON_SCHEMA), said[1], update("minimal"), said[2]]})
    assert formatted["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    assert formatted["reasoning_effort"] == "low"  # minimal, as chat servers take it (8.1)
    # An effort of null gives the request's own back; an update that sets no effort keeps it.
    assert chat({"input": [update("high"), update(None), said[0]], "reasoning": {"effort": "medium"}})["reasoning_effort"] == "medium"
    assert "reasoning_effort" not in chat({"input": [update("high"), update(None), said[0]]})
    assert chat({"input": [update("high"), {"type": "configuration_update", "reasoning": {}}, said[0]]})["reasoning_effort"] == "high"
    echo = plan({"input": items, "reasoning": {"effort": "low"}}).echo
    assert echo["reasoning"]["effort"] == "high" and echo["text"]["format"] == {"type": "text"}  # as applied


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "configuration_update", "text": {}}, "input[0].text.format"),
        ({"type": "configuration_update", "text": {"format": {"type": "yaml"}}}, "input[0].text.format.type"),
        ({"type": "configuration_update", "reasoning": {"effort": 3}}, "input[0].reasoning.effort"),
        ({"type": "configuration_update", "reasoning": "high"}, "input[0].reasoning"),
    ],
)
def test_a_malformed_configuration_update_is_a_400_naming_its_field(item: dict[str, Any], param: str):
    assert refusal({"input": [item, msg("user", "hi")]}).param == param


def test_additional_tools_join_the_requests_tools():
    """design.md 8.2: an `additional_tools` item's tools are offered with the request's own
    (Codex sends them for newer model names); its hosted tools go as the request's do."""
    more = {"type": "additional_tools", "role": "developer", "tools": [
        {"type": "function", "name": "g", "parameters": SCHEMA}, {"type": "web_search"},
    ]}
    body = {"input": [msg("user", "hi"), more], "tools": [WEATHER], "tool_choice": {"type": "function", "name": "g"}}
    call = plan(body)
    assert [tool["function"]["name"] for tool in call.chat["tools"]] == ["weather", "g"]
    assert call.chat["tool_choice"] == {"type": "function", "function": {"name": "g"}}
    assert [message["role"] for message in call.chat["messages"]] == ["user"]
    assert [tool["name"] for tool in call.echo["tools"]] == ["weather", "g"]
    assert "tool:web_search" in call.ignored
    assert refusal({**body, "input": [msg("user", "hi")]}).param == "tool_choice.name"  # g came with the item


@pytest.mark.parametrize("role", ["developer", "assistant"])
def test_an_image_where_chat_takes_text_only_is_refused_not_dropped(role):
    """design.md 8.2: the leading system message is merged as text, an assistant turn is text."""
    image = {"type": "input_image", "image_url": IMAGE}
    error = refusal({"input": [msg(role, [{"type": "input_text", "text": "look"}, image]), msg("user", "hi")]})
    assert (error.param, error.code) == ("input", "unsupported_parameter") and role in error.message


def test_image_without_url_refused():
    """An input_image by `file_id` needs OpenAI's file store: refused, not sent as an empty image."""
    error = refusal({"input": [msg("user", [{"type": "input_image", "file_id": "file-123", "detail": "auto"}])]})
    assert error.param is not None and error.param.startswith("input[0].content[0]")

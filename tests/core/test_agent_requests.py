"""What agent clients send, planned into chat requests (design.md 8.1-8.4, 8.6). No I/O."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest
from openai._utils import PropertyInfo
from openai.types.beta.beta_response_input_item_param import BetaResponseInputItemParam
from openai.types.beta.response_create_params import ResponseCreateParamsBase as BetaResponseCreateParamsBase
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from openai.types.responses.response_input_item_param import ResponseInputItemParam

from proxy.errors import InvalidRequest
from proxy.responses.plan import Call, TranslationSettings, plan_call
from proxy.responses.schema import KNOWN_FIELDS, NO_CHAT_FORM, InputItem, parse_request, unknown_fields
from proxy.responses.sealing import Sealer, derive_key
from tests.agents import codex_turn, namespace, web_search
from tests.core.test_request import CALL, CALL_ITEM, IMAGE, WEATHER, msg

SEALER = Sealer(derive_key("test key"))


def plan(body: dict[str, Any], **settings: Any) -> Call:
    return plan_call(parse_request({"model": "m", **body}), TranslationSettings("upstream-model", **settings))


def sent(body: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return plan(body, **settings).chat


def function_names(chat: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in chat.get("tools", [])]


def call_item(name: str, namespace: str | None = None, call_id: str = "call_1", arguments: str = "{}") -> dict:
    item = {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
    return item if namespace is None else {**item, "namespace": namespace}


def chat_call(name: str, call_id: str = "call_1", arguments: str = "{}") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# -- fields that cannot change the tokens (8.1) ---------------------------------------------------

HARMLESS = {
    "client_metadata": {"turn_id": "t", "session_id": "s"},
    "prompt_cache_key": "0000",
    "prompt_cache_retention": "24h",
    "service_tier": "priority",
    "user": None,
    "safety_identifier": "someone",
    "metadata": {"k": "v"},
    "store": False,
    "max_tool_calls": 3,
    "truncation": "auto",
    "text": {"verbosity": "loud"},
}


@pytest.mark.parametrize(("field", "value"), HARMLESS.items(), ids=HARMLESS.keys())
def test_fields_that_cannot_change_the_tokens_are_accepted_and_not_sent(field: str, value: Any) -> None:
    assert sent({"input": "hi", field: value}) == sent({"input": "hi"})


def test_unknown_fields_are_ignored_or_refused() -> None:
    data = {"model": "m", "input": "hi", "frobnicate": 1, "seed": 7}
    assert unknown_fields(data, reject=False) == ["frobnicate", "seed"]
    assert unknown_fields({"model": "m", "input": "hi", **HARMLESS}, reject=True) == []
    with pytest.raises(InvalidRequest) as refused:
        unknown_fields(data, reject=True)
    assert (refused.value.param, refused.value.code) == ("frobnicate", "unknown_parameter")
    assert sent(data) == sent({"input": "hi"})  # parsing itself never trips on them


@pytest.mark.parametrize(
    ("effort", "upstream"),
    [("low", "low"), ("medium", "medium"), ("high", "high"), ("minimal", "low"), ("none", "low"), ("xhigh", "high"), ("max", "high")],
)
def test_any_effort_maps_to_one_the_upstream_takes(effort: str, upstream: str) -> None:
    call = plan({"input": "hi", "reasoning": {"effort": effort, "summary": "auto"}})
    assert call.chat["reasoning_effort"] == upstream
    assert call.echo["reasoning"] == {"effort": upstream, "summary": "auto"}


# -- input items (8.2) ----------------------------------------------------------------------------


def test_the_deprecated_generate_summary_asks_for_summaries() -> None:
    """design.md 8.5: older clients name `reasoning.summary` by its deprecated name."""
    call = plan({"input": "hi", "reasoning": {"generate_summary": "concise"}})
    assert call.summary and call.echo["reasoning"]["summary"] == "concise"


@pytest.mark.parametrize("kind", sorted(NO_CHAT_FORM))
def test_items_with_no_chat_form_are_dropped_and_reported(kind: str) -> None:
    call = plan({"input": [msg("user", "q"), {"type": kind, "id": "x", "status": "completed"}, msg("user", "more")]})
    assert call.chat["messages"] == [{"role": "user", "content": "q"}, {"role": "user", "content": "more"}]
    assert call.ignored == (f"input:{kind}",)


def test_ids_statuses_and_phases_are_ignored() -> None:
    items = [
        {**msg("user", "q"), "id": "msg_1"},
        {**msg("assistant", [{"type": "output_text", "text": "a", "annotations": [], "logprobs": []}]), "id": "msg_2", "status": "completed", "phase": "final_answer"},
        {**CALL_ITEM, "id": "fc_1", "status": "completed"},
        {"type": "function_call_output", "id": "fco_1", "call_id": "call_1", "output": "ok", "status": "completed"},
    ]
    assert sent({"input": items})["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]


def test_images_a_tool_returned_follow_the_tool_messages_of_their_turn() -> None:
    """design.md 8.2: chat tool messages take text; a user message after them carries the images."""
    image = {"type": "input_image", "image_url": IMAGE}
    items = [
        call_item("view_image", call_id="a"),
        call_item("view_image", call_id="b"),
        {"type": "function_call_output", "call_id": "a", "output": [{"type": "input_text", "text": "first"}, image]},
        {"type": "function_call_output", "call_id": "b", "output": [image]},
        msg("assistant", "two images"),
    ]
    messages = sent({"input": items})["messages"]
    assert [m["role"] for m in messages] == ["assistant", "tool", "tool", "user", "assistant"]
    assert messages[1]["content"] == "first" and messages[2]["content"] == ""
    assert messages[3]["content"] == [{"type": "image_url", "image_url": {"url": IMAGE}}] * 2


# -- namespaces (8.3) -----------------------------------------------------------------------------


def test_namespace_members_become_functions_with_names_the_chat_api_accepts() -> None:
    tools = [WEATHER, namespace("multi_agent_v1", "spawn_agent", "wait_agent"), namespace("mcp.git hub", "log")]
    chat = sent({"input": "hi", "tools": tools})
    names = function_names(chat)
    assert names == ["weather", "multi_agent_v1__spawn_agent", "multi_agent_v1__wait_agent", "mcp_git_hub__log"]
    described = chat["tools"][1]["function"]["description"]
    assert described.startswith("the multi_agent_v1 tools") and described.endswith("spawn_agent does its job")


def test_namespaced_names_yield_to_plain_functions_and_stay_under_64() -> None:
    plain = {**WEATHER, "name": "team__weather"}
    long = namespace("n" * 60, "tool_with_a_long_name")
    chat = sent({"input": "hi", "tools": [namespace("team", "weather"), plain, long]})
    clashed, kept, shortened = function_names(chat)
    assert kept == "team__weather"
    assert clashed != "team__weather" and clashed.startswith("team__weather_")
    assert len(shortened) == 64 and len(clashed) <= 64
    for name in function_names(chat):
        assert name.replace("_", "").replace("-", "").isalnum()


def test_a_replayed_namespaced_call_maps_to_the_name_the_model_saw() -> None:
    tools = [namespace("team", "weather"), {**WEATHER, "name": "team__weather"}]
    items = [msg("user", "q"), call_item("weather", namespace="team"), call_item("team__weather", call_id="call_2")]
    chat = sent({"input": items, "tools": tools})
    offered = function_names(chat)
    calls = chat["messages"][1]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == [offered[0], "team__weather"]
    # Without the tools on this turn, the name is still the one the namespace alone gets.
    alone = sent({"input": items})["messages"][1]["tool_calls"][0]["function"]["name"]
    assert alone == "team__weather"


def test_the_translator_gets_the_client_names_back() -> None:
    table = plan({"input": "hi", "tools": [WEATHER, namespace("team", "weather")]}).tools
    plain, member = (table.lookup(function["function"]["name"]) for function in table.functions)
    assert (plain.name, plain.namespace) == ("weather", None)
    assert (member.name, member.namespace) == ("weather", "team")
    assert table.lookup("made_up").name == "made_up" and table.lookup("made_up").namespace is None


def test_tool_choice_names_a_namespaced_function_by_its_chat_name() -> None:
    chat = sent({"input": "hi", "tools": [namespace("team", "weather")], "tool_choice": {"type": "function", "name": "weather", "namespace": "team"}})
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "team__weather"}}


# -- custom tools (8.4) ---------------------------------------------------------------------------

GRAMMAR = {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /.+/'}
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.", "format": GRAMMAR}


def test_a_custom_tool_is_a_function_of_one_string() -> None:
    (tool,) = sent({"input": "hi", "tools": [APPLY_PATCH]})["tools"]
    function = tool["function"]
    assert function["name"] == "apply_patch"
    assert function["parameters"]["required"] == ["input"]
    assert function["parameters"]["properties"] == {"input": {"type": "string"}}
    assert function["description"].startswith("Edit files.")
    assert "lark grammar" in function["description"] and GRAMMAR["definition"] in function["description"]


def test_replayed_custom_tool_calls_and_outputs() -> None:
    items = [
        msg("user", "patch it"),
        {"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "c1", "name": "apply_patch", "input": 'a "quoted"\nline'},
        {"type": "custom_tool_call_output", "id": "ctco_1", "call_id": "c1", "output": "Success."},
    ]
    messages = sent({"input": items, "tools": [APPLY_PATCH]})["messages"]
    arguments = orjson.dumps({"input": 'a "quoted"\nline'}).decode()
    assert messages[1:] == [
        {"role": "assistant", "tool_calls": [chat_call("apply_patch", "c1", arguments)]},
        {"role": "tool", "tool_call_id": "c1", "content": "Success."},
    ]


# -- hosted tools (8.4) ---------------------------------------------------------------------------


def test_hosted_tools_are_dropped_by_default() -> None:
    tools = [WEATHER, web_search(), {"type": "image_generation"}]
    call = plan({"input": "hi", "tools": tools, "tool_choice": {"type": "web_search"}})
    assert function_names(call.chat) == ["weather"]
    assert "tool_choice" not in call.chat
    assert call.ignored == ("tool:web_search", "tool:image_generation", "tool_choice:web_search")
    assert [tool["name"] for tool in call.echo["tools"]] == ["weather"]
    assert call.echo["tool_choice"] == "auto"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [WEATHER, web_search()]}, "tools[1].type"),
        ({"tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ],
)
def test_hosted_tools_are_refused_when_the_route_says_so(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        plan({"input": "hi", **body}, hosted_tools="reject")
    assert refused.value.param == param
    assert "hosted_tools: drop" in refused.value.message


@pytest.mark.parametrize(
    "body",
    [{}, {"tools": []}, {"tools": [web_search()]}, {"tools": [web_search()], "tool_choice": {"type": "web_search"}}],
    ids=["no-tools", "empty-tools", "hosted-only", "hosted-choice"],
)
@pytest.mark.parametrize("choice", ["auto", "none"])
def test_a_tool_choice_with_no_function_to_offer_is_not_sent(body: dict, choice: str) -> None:
    """design.md 8.4: chat servers refuse `tool_choice` without `tools` (vLLM every value,
    SGLang `required`)."""
    call = plan({"input": "hi", "tool_choice": choice, **body})
    assert "tools" not in call.chat and "tool_choice" not in call.chat
    assert call.echo["tool_choice"] == ("auto" if "tool_choice" in body else choice)  # a hosted choice leaves the model its own


@pytest.mark.parametrize("tools", [[], [web_search()]], ids=["no-tools", "hosted-only"])
def test_a_required_tool_call_with_no_function_to_offer_is_refused(tools: list) -> None:
    with pytest.raises(InvalidRequest) as refused:
        plan({"input": "hi", "tools": tools, "tool_choice": "required"})
    assert refused.value.param == "tool_choice"


ALLOWED_TOOLS = [WEATHER, namespace("team", "lookup"), {"type": "custom", "name": "patch"}, web_search()]


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_allowed_tools_offer_the_model_only_those(mode: str) -> None:
    """`tool_choice: allowed_tools` narrows what the model may call, in the mode given; the
    response repeats the choice as sent."""
    choice = {"type": "allowed_tools", "mode": mode, "tools": [{"type": "function", "name": "lookup", "namespace": "team"}, {"type": "custom", "name": "patch"}, {"type": "web_search"}]}
    call = plan({"input": "hi", "tools": ALLOWED_TOOLS, "tool_choice": choice})
    assert function_names(call.chat) == ["team__lookup", "patch"]
    assert call.chat["tool_choice"] == mode
    assert call.echo["tool_choice"] == choice
    assert "tool_choice:web_search" in call.ignored


def test_an_allowed_namespace_allows_all_its_functions() -> None:
    """design.md 8.4: an allowed_tools entry may name a namespace (not a hosted tool)."""
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "namespace", "name": "team"}]}
    call = plan({"input": "hi", "tools": [WEATHER, namespace("team", "lookup", "find")], "tool_choice": choice}, hosted_tools="reject")
    assert function_names(call.chat) == ["team__lookup", "team__find"] and call.chat["tool_choice"] == "required"


@pytest.mark.parametrize(
    ("allowed", "param"),
    [
        ([{"type": "function", "name": "nowhere"}], "tool_choice.tools[0].name"),
        ([{"type": "function", "name": "weather"}, {"type": "function", "name": "lookup"}], "tool_choice.tools[1].name"),  # its namespace left out
        ([{"name": "weather"}], "tool_choice.tools[0].type"),
        ([{"type": "namespace", "name": "lookup"}], "tool_choice.tools[0].name"),  # a function's name, no namespace's
        ([{"type": "function", "name": ["weather"]}], "tool_choice.tools[0].name"),  # was a TypeError, a 500
        ([{"type": "function", "name": "lookup", "namespace": {}}], "tool_choice.tools[0].namespace"),
        ([{"type": "web_search"}], "tool_choice"),  # required, and nothing left to call
    ],
)
def test_allowed_tools_that_cannot_be_honoured_are_refused(allowed: list, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        plan({"input": "hi", "tools": ALLOWED_TOOLS, "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": allowed}})
    assert refused.value.param == param


def test_an_allowed_hosted_tool_is_refused_where_the_route_refuses_hosted_tools() -> None:
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "weather"}, {"type": "image_generation"}]}
    with pytest.raises(InvalidRequest) as refused:
        plan({"input": "hi", "tools": [WEATHER], "tool_choice": choice}, hosted_tools="reject")
    assert refused.value.param == "tool_choice.tools[1].type"


# -- sealed reasoning (8.6) -----------------------------------------------------------------------


def reasoning_item(**fields: Any) -> dict:
    return {"type": "reasoning", "id": "rs_1", "summary": [], **fields}


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"content": [{"type": "reasoning_text", "text": "in the clear"}], "encrypted_content": SEALER.seal("sealed")}, "in the clear"),
        ({"encrypted_content": SEALER.seal("sealed"), "summary": [{"type": "summary_text", "text": "summed up"}]}, "sealed"),
        ({"encrypted_content": None, "summary": [{"type": "summary_text", "text": "summed up"}]}, "summed up"),
    ],
    ids=["content-first", "sealed-next", "summary-last"],
)
def test_replayed_reasoning_text(fields: dict, text: str) -> None:
    call = plan({"input": [msg("user", "q"), reasoning_item(**fields), CALL_ITEM]}, sealer=SEALER)
    assert call.chat["messages"][1]["reasoning_content"] == text
    assert call.ignored == ()


@pytest.mark.parametrize(
    "blob",
    [Sealer(derive_key("another key")).seal("theirs"), SEALER.seal("mine")[:-4] + "AAAA", "gAAAAABopaque", "rp1.!!!", "rp1."],
    ids=["other-key", "tampered", "foreign", "not-base64", "empty"],
)
def test_a_blob_that_does_not_open_is_dropped_not_refused(blob: str) -> None:
    call = plan({"input": [msg("user", "q"), reasoning_item(encrypted_content=blob), CALL_ITEM]}, sealer=SEALER)
    assert "reasoning_content" not in call.chat["messages"][1]
    assert call.ignored == ("input:unreadable_encrypted_content",)


def test_reasoning_is_sealed_only_when_asked() -> None:
    assert plan({"input": "hi"}, sealer=SEALER).seal is None
    seal = plan({"input": "hi", "include": ["reasoning.encrypted_content"]}, sealer=SEALER).seal
    assert seal is not None
    assert SEALER.open(seal("my thoughts")) == "my thoughts"
    assert seal("my thoughts") != seal("my thoughts")  # a fresh nonce each time


# -- a whole Codex turn ---------------------------------------------------------------------------


def test_codex_first_turn() -> None:
    call = plan(codex_turn(1))
    messages = call.chat["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "user"]
    assert messages[0]["content"] == "You are Codex.\n\nSkills and permissions."
    assert function_names(call.chat) == ["exec_command", "multi_agent_v1__spawn_agent", "multi_agent_v1__wait_agent"]
    assert call.summary and call.seal is None  # no sealer configured here
    assert call.ignored == ("tool:web_search",)


def test_codex_turn_after_a_tool_call() -> None:
    messages = plan(codex_turn(2)).chat["messages"]
    assert messages[-2:] == [
        {"role": "assistant", "reasoning_content": "I will run ls.", "tool_calls": [chat_call("exec_command", "call_1", '{"cmd":"ls"}')]},
        {"role": "tool", "tool_call_id": "call_1", "content": "hello.txt\n"},
    ]


# -- compaction items read back (8.8) -------------------------------------------------------------


@pytest.mark.parametrize("readable", [True, False], ids=["sealed-here", "another-keys"])
def test_a_readable_compaction_item_stands_for_what_came_before_it_but_the_users_messages(readable: bool) -> None:
    summary = "The user asked for the weather; it was sunny."
    blob = (SEALER if readable else Sealer(derive_key("another key"))).seal(summary)
    items = [
        msg("developer", "be brief"),
        msg("user", "weather?"),
        CALL_ITEM,
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        msg("assistant", "Sunny."),
        {"type": "compaction", "encrypted_content": blob},
        msg("user", "and tomorrow?"),
    ]
    roles = [m["role"] for m in sent({"input": items}, sealer=SEALER)["messages"]]
    assert roles == (["system", "user", "user", "user"] if readable else ["system", "user", "assistant", "tool", "assistant", "user"])


def test_an_agent_message_is_a_user_message_naming_its_author() -> None:
    """design.md 8.2: Codex's multi-agent v2 sends another agent's words as `agent_message`;
    an encrypted part (OpenAI's) cannot be read, and is dropped and counted."""
    item = {
        "type": "agent_message",
        "author": "/root/worker",
        "recipient": "/root",
        "content": [{"type": "input_text", "text": "tests pass"}, {"type": "encrypted_content", "encrypted_content": "gAAAA"}],
    }
    call = plan({"input": [msg("user", "delegate it"), item]})
    assert call.chat["messages"][1] == {"role": "user", "content": "[message from /root/worker to /root]\ntests pass"}
    assert call.ignored == ("input:encrypted_agent_message_content",)
    image = {"type": "input_image", "image_url": IMAGE}
    with_image = sent({"input": [{**item, "content": [image]}]})["messages"][0]["content"]
    assert with_image == [{"type": "text", "text": "[message from /root/worker to /root]\n"}, {"type": "image_url", "image_url": {"url": IMAGE}}]


def _item_types(union: Any) -> set[str]:
    """The `type` values of an SDK union of input item TypedDicts."""
    found = set()
    for member in typing.get_args(union):
        kind = typing.get_type_hints(member)["type"]
        while typing.get_origin(kind) is not Literal:
            kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        found.update(typing.get_args(kind))
    return found


def _body_fields(params: Any) -> set[str]:
    """The body fields of an SDK `ResponseCreateParams`: those not sent as a header."""
    hints = typing.get_type_hints(params, include_extras=True)
    return {
        name
        for name, hint in hints.items()
        if not any(isinstance(extra, PropertyInfo) and extra.alias and "-" in extra.alias for extra in getattr(hint, "__metadata__", ()))
    }


def _listed() -> dict[str, set[str]]:
    """design.md 8.15's block: `fields honoured: ...`, `items dropped: ...`, each a set of names."""
    text = (Path(__file__).parents[2] / "docs" / "design.md").read_text()
    block = re.search(r"^### 8\.15 .*?^```text\n(.*?)^```", text, re.S | re.M)
    assert block is not None, "design.md 8.15 holds the block"
    lines = [line.partition(":") for line in block[1].splitlines()]
    return {head: set(names.split()) for head, _, names in lines}


# A value of each field design.md 8.15 lists as ignored or refused, as a client sends it.
SENT = {
    **HARMLESS,
    "user": "someone",
    "prompt_cache_options": {"mode": "explicit", "ttl": "12h", "comparison_response_id": "resp_1"},
    "access_programs": {"cyber": "standard"},
    "background_options": {"completion_window": "2h", "continuation_id": "c1"},
    "image": {"context_compression": "disabled"},
    "prompt": {"id": "pmpt_1"},
    "moderation": {"model": "omni-moderation-latest"},
    "multi_agent": {"enabled": True, "max_concurrent_subagents": 3},
}
REFUSED_AT = {"multi_agent": "multi_agent.enabled"}


@pytest.mark.parametrize(
    ("params", "union"),
    [
        pytest.param(ResponseCreateParamsBase, ResponseInputItemParam, id="responses"),
        pytest.param(BetaResponseCreateParamsBase, BetaResponseInputItemParam, id="beta"),
    ],
)
def test_every_field_and_input_item_type_of_the_installed_sdk_is_one_that_design_8_15_names(params: Any, union: Any) -> None:
    """design.md 8.15: each field and item type the SDK defines is honoured, ignored or refused
    on purpose; a new SDK release with a new name fails here first."""
    listed = _listed()
    fields = listed["fields honoured"] | listed["fields ignored"] | listed["fields refused"]
    assert _body_fields(params) - fields == set()
    # Each the schema reads: none is an unknown field, which `unknown_fields: reject` refuses.
    assert fields - KNOWN_FIELDS == set()
    known = {struct.__struct_config__.tag for struct in typing.get_args(InputItem)} - {"dropped"}
    assert listed["items read"] == known and listed["items dropped"] == NO_CHAT_FORM
    assert _item_types(union) - listed["items read"] - listed["items dropped"] - listed["items refused"] == set()


@pytest.mark.parametrize("field", sorted(_listed()["fields ignored"]))
def test_a_field_design_8_15_lists_as_ignored_changes_nothing_sent(field: str) -> None:
    assert sent({"input": "hi", field: SENT[field]}) == sent({"input": "hi"})


@pytest.mark.parametrize("field", sorted(_listed()["fields refused"]))
def test_a_field_design_8_15_lists_as_refused_is_a_400_naming_it(field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        plan({"input": "hi", field: SENT[field]})
    assert (refused.value.param, refused.value.code) == (REFUSED_AT.get(field, field), "unsupported_parameter")


def test_what_cannot_be_honoured_is_refused_where_it_asks_for_it() -> None:
    """An image's compression asked for (none is made here), a multi-agent run enabled: a 400
    naming it; left to the server, or turned off, they change nothing (design.md 8.1)."""
    with pytest.raises(InvalidRequest) as refused:
        plan({"input": "hi", "image": {"context_compression": "enabled"}})
    assert refused.value.param == "image.context_compression"
    for value in ({"image": {"context_compression": "auto"}}, {"multi_agent": {"enabled": False}}):
        assert sent({"input": "hi", **value}) == sent({"input": "hi"})


def test_a_content_parts_cache_breakpoint_is_accepted_and_changes_nothing_sent() -> None:
    """design.md 8.1: OpenAI's explicit cache breakpoint marks a prefix; it cannot change the tokens."""
    part = {"type": "input_text", "text": "hi", "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"}}
    assert sent({"input": [{"role": "user", "content": [part]}]}) == sent({"input": "hi"})


@pytest.mark.parametrize(
    "reasoning",
    [
        pytest.param({"summary": [{"type": "summary_text", "text": "Paris is sunny today.\n\nParis is sunny today."}]}, id="summary-joined"),
        pytest.param({"content": [{"type": "reasoning_text", "text": "Paris is sunny today."}] * 2}, id="content-twice"),
        pytest.param({"summary": [{"type": "summary_text", "text": "Paris is sunny today."}], "content": [{"type": "reasoning_text", "text": "Paris is sunny today."}]}, id="both"),
    ],
)
def test_reasoning_sent_back_with_its_summary_joined_is_replayed_once(reasoning: dict[str, Any]) -> None:
    """A client that joins a reasoning item's content and summary (LlamaIndex), which the proxy
    sends alike (design.md 8.5), sends the text twice: the model gets it once."""
    items = [msg("user", "weather?"), {"type": "reasoning", **reasoning}, msg("assistant", "Sunny.")]
    assert sent({"input": items})["messages"][1] == {"role": "assistant", "content": "Sunny.", "reasoning_content": "Paris is sunny today."}
    different = [msg("user", "q"), {"type": "reasoning", "summary": [{"type": "summary_text", "text": "first half, then another"}]}, msg("assistant", "a")]
    assert sent({"input": different})["messages"][1]["reasoning_content"] == "first half, then another"
    short = [msg("user", "q"), {"type": "reasoning", "summary": [{"type": "summary_text", "text": "no no"}]}, msg("assistant", "a")]
    assert sent({"input": short})["messages"][1]["reasoning_content"] == "no no"  # halves under 8 characters: as sent

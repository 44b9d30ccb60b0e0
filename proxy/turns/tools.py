"""A turn's MCP servers (design.md 14): before the model's first round, each server the request
names found under the operator's policy, its tools listed (or read from the history), and the
calls the request approves run; after a round, the calls the model made run, their results the
next round's tool messages."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidRequest, McpUnavailable
from ..responses.lifecycle import new_id
from ..responses.mcp import (
    Builtin,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
    McpTool,
    Servers,
    offered,
    tool_message,
)
from ..responses.schema import CreateResponse, HostedTool
from ..upstream.mcp import Endpoint, McpFailure, McpServers

# A call's outcome: its output, or its error (design.md 14.4); neither: it did not run.
Outcome = tuple[str | None, dict[str, Any] | None]


async def prepare(
    mcp: McpServers, owner: str, request: CreateResponse, *, runs: bool = True
) -> tuple[Servers, dict[str, Endpoint]]:
    """The request's MCP servers, by label, and what planning takes of them: a server outside
    the policy is a 400 before any is contacted (14.1); one that cannot list its tools a 424
    (14.3); the calls the request approves run, each once (14.5), where the turn `runs` (a token
    count or a turn that generates nothing runs none)."""
    servers: dict[str, tuple[McpTool, Endpoint]] = {}
    builtins: dict[str, Builtin] = {}
    endpoints: dict[str, Endpoint] = {}
    for index, tool in enumerate(request.tools or ()):
        mapped = mcp.builtin(tool.kind) if isinstance(tool, HostedTool) else None
        if mapped is not None:  # a built-in type the operator answers with its own server's tool (14.8)
            builtins[mapped[0].kind], endpoints[mapped[0].server_label] = mapped
        if not isinstance(tool, McpTool):
            continue
        if tool.server_label in servers:
            raise InvalidRequest(
                f"Two MCP tools are labelled '{tool.server_label}'.", param=f"tools[{index}].server_label"
            )
        servers[tool.server_label] = (tool, mcp.endpoint(tool, index))
    if not servers:
        return Servers(builtins=builtins), endpoints
    items = request.items()
    # Listed in its history: the last listing of each server that did not fail.
    known = {item.server_label: item.tools for item in items if isinstance(item, McpListTools) and item.error is None}
    unlisted = [label for label in servers if label not in known]
    try:  # one listing that fails lets go of the others
        async with asyncio.TaskGroup() as listing:
            tasks = [listing.create_task(mcp.list_tools(servers[label][1], owner)) for label in unlisted]
    except* McpUnavailable as failed:
        raise failed.exceptions[0] from None
    known |= {label: task.result() for label, task in zip(unlisted, tasks, strict=True)}
    tools = {label: offered(tool, known[label]) for label, (tool, _) in servers.items()}
    # A new listing shows what the model is offered of it (14.3).
    listings = [
        {"id": new_id("mcpl"), "type": "mcp_list_tools", "server_label": label, "tools": tools[label]}
        for label in unlisted
    ]
    endpoints |= {label: endpoint for label, (_, endpoint) in servers.items()}
    answers, calls = await _approved(mcp, owner, items, endpoints, tool_call_cap(mcp, request)) if runs else ({}, [])
    return Servers(tools, answers, [*listings, *calls], builtins), endpoints


def tool_call_cap(mcp: McpServers, request: CreateResponse) -> int:
    """How many MCP calls a Response runs in all, approved ones too (design.md 14.4): its
    `max_tool_calls` (0: none), else the operator's."""
    return mcp.config.max_tool_calls if request.max_tool_calls is None else request.max_tool_calls


async def _approved(
    mcp: McpServers, owner: str, items: Sequence[Any], endpoints: Mapping[str, Endpoint], cap: int
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The tool message of each approval the request gives, and the `mcp_call` items of the
    calls it approved, run now, up to the Response's `max_tool_calls` (those past it are not run,
    and the model is told); an approval that a call in the history ran already is not run again
    (a client that sends its whole history back sends it every turn)."""
    asked = {item.id: item for item in items if isinstance(item, McpApprovalRequest)}
    done = {item.approval_request_id for item in items if isinstance(item, McpCall) and item.approval_request_id}
    answers: dict[str, str] = {}
    approved: list[McpApprovalRequest] = []
    for item in items:
        if not isinstance(item, McpApprovalResponse) or item.approval_request_id in done:
            continue
        request = asked.get(item.approval_request_id)
        if request is None or request.server_label not in endpoints:
            raise InvalidRequest(
                f"No mcp_approval_request '{item.approval_request_id}' of a server in 'tools' to approve.",
                param="input",
            )
        if item.approve and len(approved) < cap:
            approved.append(request)
        elif item.approve:
            answers[request.id] = tool_message(None, None)
        else:
            answers[request.id] = "The user declined to run this call." + (f" {item.reason}" if item.reason else "")
    outcomes = await asyncio.gather(
        *(call(mcp, owner, endpoints[request.server_label], request.name, request.arguments) for request in approved)
    )
    calls = []
    for request, (output, error) in zip(approved, outcomes, strict=True):
        answers[request.id] = tool_message(output, error)
        calls.append(
            {
                "id": new_id("mcp"),
                "type": "mcp_call",
                "status": "failed" if error is not None else "completed",
                "server_label": request.server_label,
                "name": request.name,
                "arguments": request.arguments,
                "output": output,
                "error": error,
                "approval_request_id": request.id,
            }
        )
    return answers, calls


async def call(mcp: McpServers, owner: str, endpoint: Endpoint, name: str, arguments: str) -> Outcome:
    """One call of an MCP server's tool: its output, or its error, never an exception; the
    model is told either (design.md 14.4)."""
    try:
        return await mcp.call(endpoint, owner, name, arguments), None
    except McpFailure as failure:
        return None, failure.error


async def run_calls(
    mcp: McpServers, owner: str, endpoints: Mapping[str, Endpoint], calls: Sequence[dict[str, Any]], parallel: bool
) -> dict[str, Outcome]:
    """A round's MCP calls, at once where the request lets the model's calls run in parallel,
    by item id."""
    runs = [call(mcp, owner, endpoints[item["server_label"]], item["name"], item["arguments"]) for item in calls]
    if parallel:
        outcomes = await asyncio.gather(*runs)
    else:
        outcomes = [await run for run in runs]
    return {item["id"]: outcome for item, outcome in zip(calls, outcomes, strict=True)}

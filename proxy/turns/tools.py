"""A turn's MCP servers (design.md 14): before the model's first round, each server the request
names found under the operator's policy, its tools listed (or read from the history), and the
calls the request approves run; after a round, the calls the model made run, their results the
next round's tool messages. Every call meets the request's policy over the tools its server
listed to the proxy itself, however the tool reached the model (14.3)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import msgspec
import orjson

from ..errors import InvalidRequest, McpUnavailable
from ..responses.lifecycle import new_id
from ..responses.mcp import (
    LISTING,
    Builtin,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
    McpTool,
    Servers,
    listing_statement,
    needs_approval,
    offered,
    tool_message,
)
from ..responses.schema import CreateResponse, HostedTool
from ..responses.sealing import Sealer
from ..upstream.mcp import Endpoint, McpFailure, McpServers

# A call's outcome: its output, or its error (design.md 14.4); neither: it did not run.
Outcome = tuple[str | None, dict[str, Any] | None]
# An approval the request gives: the approval request, and the client's first response to it (14.5).
Approval = tuple[McpApprovalRequest, McpApprovalResponse]


async def prepare(
    mcp: McpServers, sealer: Sealer, owner: str, request: CreateResponse, *, runs: bool = True
) -> tuple[Servers, ServerCalls]:
    """The request's MCP servers, as its calls reach them, and what planning takes of them: a
    server outside the policy is a 400 before any is contacted (14.1); one that cannot list its
    tools a 424 (14.3); the request's approvals checked, whether or not it names a server (14.5),
    and the calls they approve run, each once, where the turn `runs` (a token count or a turn
    that generates nothing runs none)."""
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
    items = request.items()
    approvals = _approvals(items, servers)
    budget = tool_call_cap(mcp, request)
    if not servers:
        return Servers(builtins=builtins), ServerCalls(mcp, owner, budget, endpoints)
    # Listed in its history: the last listing of each server that did not fail; the server's own
    # word where its id vouches that this proxy listed it from that server, else only a cache of
    # what the model is offered, which the client may have written (14.3).
    history = {item.server_label: item for item in items if isinstance(item, McpListTools) and item.error is None}
    known = {label: msgspec.to_builtins(item.tools) for label, item in history.items()}
    vouched = {
        label: known[label]
        for label, item in history.items()
        if label in servers and _vouched(sealer, item.id, servers[label][1].url, known[label])
    }
    # Listed now: a server the history has no listing of, and one whose approved call runs before
    # the model's first round, which only the server's own word admits.
    approving = {request.server_label for request, response in approvals if response.approve} if runs else set()
    listing = [label for label in servers if label not in known or (label in approving and label not in vouched)]
    unavailable: BaseException | None = None
    try:  # one listing that fails lets go of the others
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(mcp.list_tools(servers[label][1], owner)) for label in listing]
    except* McpUnavailable as failed:
        # Raised past the handler: Python before 3.11.4 (Debian 12's 3.11.2) wraps what an
        # except* handler raises in a group of its own, which no error handler answers.
        unavailable = failed.exceptions[0]
    if unavailable is not None:
        raise unavailable
    listed: dict[str, list[dict[str, Any]]] = {label: task.result() for label, task in zip(listing, tasks, strict=True)}
    # What the model is offered: the server's listing, where made now; else the history's.
    tools = {
        label: offered(tool, listed[label] if label in listed else known[label]) for label, (tool, _) in servers.items()
    }
    # A new listing shows what the model is offered of it (14.3).
    listings = [
        {
            "id": _listing_id(sealer, endpoint.url, tools[label]),
            "type": "mcp_list_tools",
            "server_label": label,
            "tools": tools[label],
        }
        for label, (_, endpoint) in servers.items()
        if label not in known
    ]
    endpoints |= {label: endpoint for label, (_, endpoint) in servers.items()}
    policies = {label: tool for label, (tool, _) in servers.items()}
    calls = ServerCalls(mcp, owner, budget, endpoints, policies, vouched | listed)
    answers, ran = await calls.approved(approvals) if runs else ({}, [])
    return Servers(tools, answers, [*listings, *ran], builtins), calls


def _listing_id(sealer: Sealer, url: str, tools: list[dict[str, Any]]) -> str:
    """The id of a listing the proxy made: it vouches that the server at `url` listed these tools."""
    return LISTING + sealer.vouch(listing_statement(url, tools))


def _vouched(sealer: Sealer, id: str | None, url: str, tools: list[dict[str, Any]]) -> bool:
    """Whether a listing is one the proxy made of the server at `url`, its tools as it made them."""
    return (
        id is not None and id.startswith(LISTING) and sealer.vouches(listing_statement(url, tools), id[len(LISTING) :])
    )


def tool_call_cap(mcp: McpServers, request: CreateResponse) -> int:
    """How many MCP calls a Response runs in all, approved ones too (design.md 14.4): the
    operator's `mcp.max_tool_calls`, which the request's `max_tool_calls` may lower (0: none),
    never raise."""
    ceiling = mcp.config.max_tool_calls
    return ceiling if request.max_tool_calls is None else min(request.max_tool_calls, ceiling)


def _approvals(items: Sequence[Any], servers: Collection[str]) -> list[Approval]:
    """The approvals the request gives that no call in its history ran, each request's first
    response; one whose request is not in the history, or names a server the request's tools do
    not, or that responds to its request both ways, is a 400 naming `input` (design.md 14.5). A
    response repeated is read once: one approval request runs at most one call."""
    asked = {item.id: item for item in items if isinstance(item, McpApprovalRequest)}
    done = {item.approval_request_id for item in items if isinstance(item, McpCall) and item.approval_request_id}
    approvals: dict[str, Approval] = {}
    for item in items:
        if not isinstance(item, McpApprovalResponse) or item.approval_request_id in done:
            continue
        request = asked.get(item.approval_request_id)
        if request is None or request.server_label not in servers:
            raise InvalidRequest(
                f"No mcp_approval_request '{item.approval_request_id}' of a server in 'tools' to approve.",
                param="input",
            )
        _, first = approvals.setdefault(request.id, (request, item))
        if first.approve != item.approve:
            raise InvalidRequest(
                f"The mcp_approval_request '{request.id}' is both approved and declined.", param="input"
            )
    return list(approvals.values())


class ServerCalls:
    """A turn's MCP servers as its calls reach them (design.md 14.3-14.5): each one's endpoint,
    by label; the request's tool that names it, whose `allowed_tools` and `require_approval`
    every call of it meets; and the tools each listed to the proxy itself, on this turn or in a
    listing whose id vouches for it. Another listing in the history, which a client may have
    written, is what the model is offered, never what a call is checked against: such a server is
    listed again, once a turn, before a call of it runs. `left`: the calls the Response may still
    run, of its `max_tool_calls` (14.4), approved ones first."""

    def __init__(
        self,
        mcp: McpServers,
        owner: str,
        budget: int,
        endpoints: Mapping[str, Endpoint],
        policies: Mapping[str, McpTool] | None = None,
        listed: Mapping[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        self._mcp, self._owner, self._endpoints, self._policies = mcp, owner, endpoints, policies or {}
        self._listed: dict[str, list[dict[str, Any]] | McpUnavailable] = dict(listed or {})
        self.left = budget

    async def approved(self, approvals: Iterable[Approval]) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """The tool message of each approval the request gives, and the `mcp_call` items of the
        calls it approved, run now, within the budget (those past it are not run, and the model
        is told); an approved call outside the policy is a 400 naming `input`, before any runs."""
        answers: dict[str, str] = {}
        approved: list[McpApprovalRequest] = []
        for request, response in approvals:
            refused = self._refusal(request.server_label, request.name, approved=True) if response.approve else None
            if refused is not None:
                raise InvalidRequest(f"The mcp_approval_request '{request.id}' cannot run. {refused}", param="input")
            if response.approve and len(approved) < self.left:
                approved.append(request)
            elif response.approve:
                answers[request.id] = tool_message(None, None)
            else:
                answers[request.id] = " ".join(filter(None, ("The user declined to run this call.", response.reason)))
        self.left -= len(approved)
        outcomes = await asyncio.gather(
            *(self._call(call.server_label, call.name, call.arguments) for call in approved)
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

    async def run(
        self, made: Sequence[dict[str, Any]], parallel: bool, search: Callable[[str], list[dict[str, Any]]]
    ) -> dict[str, Outcome]:
        """A round's calls within the budget, at once where the request lets the model's calls
        run in parallel, by item id; those past it are not run (no outcome). A call of an MCP
        server's tool outside the policy is not made, and fails (a built-in type's runs as the
        operator mapped it, 14.8); a tool search is `search`ed, its output the tools found (8.17)."""
        calls = made[: max(self.left, 0)]
        self.left -= len(calls)
        checked = [item for item in calls if item["type"] == "mcp_call"]
        unlisted = list({item["server_label"] for item in checked} - self._listed.keys())
        listings = await asyncio.gather(*(self._list(label) for label in unlisted))
        self._listed.update(zip(unlisted, listings, strict=True))
        refused = {item["id"]: self._refusal(item["server_label"], item["name"], approved=False) for item in checked}

        async def run(item: dict[str, Any]) -> Outcome:
            if item["type"] == "tool_search_call":  # the proxy's own: no server to reach
                return orjson.dumps(search(orjson.loads(item["arguments"])["query"])).decode(), None
            reason = refused.get(item["id"])
            if reason is not None:
                return None, {"type": "mcp_protocol_error", "code": _INVALID_PARAMS, "message": reason}
            return await self._call(item["server_label"], item["name"], item["arguments"])

        if parallel:
            outcomes = await asyncio.gather(*(run(item) for item in calls))
        else:
            outcomes = [await run(item) for item in calls]
        return {item["id"]: outcome for item, outcome in zip(calls, outcomes, strict=True)}

    def _refusal(self, label: str, name: str, *, approved: bool) -> str | None:
        """Why a call of a server's tool is not made; None: the server listed it to the proxy,
        the request's `allowed_tools` allows it, and it needs no approval, or has it."""
        listed = self._listed[label]
        if isinstance(listed, McpUnavailable):
            return listed.message
        policy = self._policies[label]
        entry = next((entry for entry in offered(policy, listed) if entry["name"] == name), None)
        if entry is None:
            return f"The MCP server '{label}' lists no tool '{name}' that the request's allowed_tools allows."
        if not approved and needs_approval(policy, entry):
            return f"The tool '{name}' of the MCP server '{label}' needs the client's approval."
        return None

    async def _list(self, label: str) -> list[dict[str, Any]] | McpUnavailable:
        try:
            return await self._mcp.list_tools(self._endpoints[label], self._owner)
        except McpUnavailable as failure:  # the calls of it fail, with why
            return failure

    async def _call(self, label: str, name: str, arguments: str) -> Outcome:
        """One call of an MCP server's tool: its output, or its error, never an exception; the
        model is told either (design.md 14.4)."""
        try:
            return await self._mcp.call(self._endpoints[label], self._owner, name, arguments), None
        except McpFailure as failure:
            return None, failure.error


# JSON-RPC's code for a call the server would not take: MCP's answer for a tool it does not have.
_INVALID_PARAMS = -32602

"""Tools the client runs in the newest SDKs' own shapes (design.md 8.13): openai-agents'
`ShellTool` with a local executor (`shell`), `LocalShellTool` (`local_shell`) and
`ApplyPatchTool` (`apply_patch`). The model is offered each as a chat function whose parameters
are the SDK's action; its call comes back as the native item (`shell_call`, `local_shell_call`,
`apply_patch_call`); the client's output item is read back as the tool's result."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import orjson


class _Item(msgspec.Struct, tag_field="type"):
    """Tagged as the request's other items and tools are (schema.py's `_Tagged`)."""


class ShellTool(_Item, tag="shell"):
    environment: dict[str, Any] | None = None  # only a local one is the client's (else: hosted)


class LocalShellTool(_Item, tag="local_shell"):
    pass


class ApplyPatchTool(_Item, tag="apply_patch"):
    pass


class ToolSearchTool(_Item, tag="tool_search"):
    """A search for the request's deferred tools (design.md 8.17): run by the client
    (`execution: client`), offered to the model as a function of the client's description and
    parameters; run by the server (OpenAI's default), run by the proxy."""

    execution: Literal["server", "client"] | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolChoiceShell(_Item, tag="shell"):
    pass


class ToolChoiceApplyPatch(_Item, tag="apply_patch"):
    pass


# The native items typed as the openai SDK types them, so that a malformed one is a 400 naming
# its field (design.md 8.13). An apply_patch operation's fields may be left out: the model's call
# can leave them out (off its function's schema, cut short), and its client sends it back.
CallId = Annotated[str, msgspec.Meta(min_length=1)]


class ShellAction(msgspec.Struct, omit_defaults=True):
    commands: list[str]
    timeout_ms: int | None = None
    max_output_length: int | None = None


class ShellCall(_Item, tag="shell_call"):
    call_id: CallId
    action: ShellAction


class ShellExit(_Item, tag="exit"):
    exit_code: int | None  # null from openai-agents, whose executor may give none


class ShellTimeout(_Item, tag="timeout"):
    pass


class ShellOutput(msgspec.Struct):
    stdout: str
    stderr: str
    outcome: ShellExit | ShellTimeout


class ShellCallOutput(_Item, tag="shell_call_output"):
    call_id: CallId
    output: list[ShellOutput]


class LocalShellAction(msgspec.Struct, omit_defaults=True):
    command: list[str]
    env: dict[str, str]
    type: Literal["exec"] = "exec"
    timeout_ms: int | None = None
    working_directory: str | None = None
    user: str | None = None


class LocalShellCall(_Item, tag="local_shell_call"):
    call_id: CallId
    action: LocalShellAction


class LocalShellCallOutput(_Item, tag="local_shell_call_output"):
    output: str
    call_id: str | None = None  # openai-agents names the call so; the API's type, by `id`
    id: str | None = None

    @property
    def answers(self) -> str:
        return self.call_id or self.id or ""


class PatchOperation(msgspec.Struct, omit_defaults=True):
    type: Literal["create_file", "update_file", "delete_file"] | None = None
    path: str = ""
    diff: str | None = None  # none for delete_file


class ApplyPatchCall(_Item, tag="apply_patch_call"):
    call_id: CallId
    operation: PatchOperation


class ApplyPatchCallOutput(_Item, tag="apply_patch_call_output"):
    call_id: CallId
    status: Literal["completed", "failed"]
    output: str | None = None


class ToolSearchCall(_Item, tag="tool_search_call"):
    """The model's search, which its client or the proxy ran (design.md 8.17): replayed as the
    call of the search function."""

    call_id: CallId
    arguments: Any = None
    execution: Literal["server", "client"] = "client"


NATIVE_CALLS = (ShellCall, LocalShellCall, ApplyPatchCall, ToolSearchCall)
NATIVE_OUTPUTS = (ShellCallOutput, LocalShellCallOutput, ApplyPatchCallOutput)
# Each kind's chat function (named as the kind) and the type of its call's item.
_STRING_LIST = {"type": "array", "items": {"type": "string"}}
FUNCTIONS: dict[str, dict[str, Any]] = {
    "shell": {
        "description": "Run shell commands on the user's machine, one after another.",
        "parameters": {
            "type": "object",
            "properties": {
                "commands": _STRING_LIST,
                "timeout_ms": {"type": "integer"},
                "max_output_length": {"type": "integer"},
            },
            "required": ["commands"],
        },
    },
    "local_shell": {
        "description": "Run a command (its argv) on the user's machine.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": _STRING_LIST,
                "working_directory": {"type": "string"},
                "timeout_ms": {"type": "integer"},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "required": ["command"],
        },
    },
    "apply_patch": {
        "description": "Create, update or delete a file; `diff` is a V4A diff (for create_file, the file's lines).",
        "parameters": {
            "type": "object",
            "properties": {
                "type": {"enum": ["create_file", "update_file", "delete_file"]},
                "path": {"type": "string"},
                "diff": {"type": "string"},
            },
            "required": ["type", "path"],
        },
    },
    "tool_search": {  # what a client's tool_search that gives no parameters is asked
        "description": "Search the tools you can load for those that do what you need; found, they become callable.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "What the tools you need do."}},
            "required": ["query"],
        },
    },
}
ITEMS = {
    "shell": "shell_call",
    "local_shell": "local_shell_call",
    "apply_patch": "apply_patch_call",
    "tool_search": "tool_search_call",
}
NATIVE_ITEMS = frozenset(ITEMS.values())


def client_runs(tool: Any) -> str | None:
    """The kind of a tool the client runs in its own shape; a `shell` tool in a hosted container
    is not one (it stays a hosted tool, 8.4), nor a tool search the server is to run (8.17)."""
    if isinstance(tool, ShellTool):
        return "shell" if (tool.environment or {}).get("type") == "local" else None
    if isinstance(tool, LocalShellTool):
        return "local_shell"
    if isinstance(tool, ToolSearchTool):
        return "tool_search" if tool.execution == "client" else None
    return "apply_patch" if isinstance(tool, ApplyPatchTool) else None


def function_of(kind: str, tool: Any) -> dict[str, Any]:
    """The chat function (but its name) a client's tool of `kind` is offered as: the kind's own,
    a tool search's with the description and parameters its client gives."""
    function = FUNCTIONS[kind]
    if isinstance(tool, ToolSearchTool):
        return {
            "description": tool.description or function["description"],
            "parameters": tool.parameters or function["parameters"],
        }
    return function


def opened(kind: str, id: str, call_id: str, execution: str = "client") -> dict[str, Any]:
    """The item of a call as the model begins it: its action known once the call is whole; a
    tool search's by who runs it."""
    fields = {"id": id, "type": ITEMS[kind], "call_id": call_id, "status": "in_progress"}
    if kind == "tool_search":
        return {**fields, "execution": execution, "arguments": {}}
    if kind == "apply_patch":  # an operation of the SDK's type until the call's own is known
        return {**fields, "operation": {"type": "create_file", "path": "", "diff": ""}}
    return {
        **fields,
        "action": {"type": "exec", "command": [], "env": {}} if kind == "local_shell" else {"commands": []},
    }


def whole(item: dict[str, Any], arguments: str, at: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A native call whose arguments are whole: its item's action (or operation) from them, and
    a shell call's command events (`at`: the item's id and output index); a tool search's
    arguments as the JSON they are (the text, where they are none)."""
    if item["type"] == "tool_search_call":
        try:
            item["arguments"] = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            item["arguments"] = arguments
        return []
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        parsed = {}
    given = parsed if isinstance(parsed, dict) else {}
    kind = item["type"]
    if kind == "apply_patch_call":
        item["operation"] = _fitting(PatchOperation, given, {})
        return []
    if kind == "local_shell_call":
        item["action"] = _fitting(LocalShellAction, given, {"type": "exec", "command": [], "env": {}})
        return []
    commands = [command for command in given.get("commands") or [] if isinstance(command, str)]
    item["action"] = _fitting(ShellAction, {**given, "commands": commands}, {})
    where = {"output_index": at["output_index"]}
    events = []
    for index, command in enumerate(commands):
        events.append(("response.shell_call_command.added", {**where, "command_index": index, "command": ""}))
        if command:
            events.append(("response.shell_call_command.delta", {**where, "command_index": index, "delta": command}))
        events.append(("response.shell_call_command.done", {**where, "command_index": index, "command": command}))
    return events


def _fitting(shape: type[msgspec.Struct], given: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The model's arguments as its call's action (or operation) of `shape`: `base`, and each of
    the shape's fields where the model gave a value that fits it, so that the call is the SDK's
    type when its client sends it back (a value off the function's schema is left out)."""
    fitting = dict(base)
    for key in shape.__struct_fields__:
        if key in given:
            try:
                msgspec.convert({**fitting, key: given[key]}, shape)
            except msgspec.ValidationError:
                continue
            fitting[key] = given[key]
    return fitting


def chat_call(item: ShellCall | LocalShellCall | ApplyPatchCall | ToolSearchCall) -> tuple[str, str]:
    """A replayed native call as the chat function call it came from: its name and arguments."""
    if isinstance(item, ToolSearchCall):
        arguments = item.arguments
        return "tool_search", arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    if isinstance(item, ApplyPatchCall):
        return "apply_patch", msgspec.json.encode(item.operation).decode()
    if isinstance(item, LocalShellCall):  # its `type`, always exec, is no argument of the function
        action = {key: value for key, value in msgspec.to_builtins(item.action).items() if key != "type"}
        return "local_shell", orjson.dumps(action).decode()
    return "shell", msgspec.json.encode(item.action).decode()


def chat_output(item: ShellCallOutput | LocalShellCallOutput | ApplyPatchCallOutput) -> tuple[str, str]:
    """A client's output item as the tool message that answers its call: the call's id, and
    what the model reads (a shell's output, each command's stdout, stderr and outcome)."""
    if isinstance(item, LocalShellCallOutput):
        return item.answers, item.output
    if isinstance(item, ApplyPatchCallOutput):
        return item.call_id, item.output or item.status
    return item.call_id, "\n".join(_shell_output(entry) for entry in item.output)


def _shell_output(entry: ShellOutput) -> str:
    outcome = entry.outcome
    if isinstance(outcome, ShellTimeout):
        ended = "timed out"
    else:
        ended = "exited" if outcome.exit_code is None else f"exit code {outcome.exit_code}"
    parts = [entry.stdout, f"stderr: {entry.stderr}" if entry.stderr else "", f"({ended})"]
    return "\n".join(part for part in parts if part)

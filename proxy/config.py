"""The config file: typed msgspec structs, loaded from YAML, with errors that name the key."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

import msgspec
import yaml

from .responses.logprobs import SPEC_MAX_TOP_LOGPROBS
from .responses.sse import DEFAULT_MAX_EVENT

DEFAULT_UPSTREAM = "http://127.0.0.1:30000"

Seconds = Annotated[float, msgspec.Meta(gt=0)]
_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Chat request keys that the proxy decides for each call (design.md 3.3: the logprob echo must
# match what was sent), so an upstream's defaults may not set them.
_PROXY_KEYS = {"model", "messages", "stream", "stream_options", "logprobs", "top_logprobs"}
_GLOB = re.compile(r"[*?\[]")
_URL = re.compile(r"^https?://[^/\s]+(/[^\s]*)?$")


class ConfigError(Exception):
    """A config file that can't be used; the message names the key path."""


class _Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


class Listen(_Section, frozen=True):
    host: str = "0.0.0.0"
    """The address to listen on (`--host` overrides it)."""
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    """The port to listen on (`--port` overrides it)."""


class Timeouts(_Section, frozen=True):
    connect: Seconds = 5.0
    """Seconds to open a connection to a replica; past it, another replica is tried."""
    first_byte: Seconds = 600.0
    """Prefill of a long prompt on a busy server can take minutes before the first token."""
    idle: Seconds = 120.0
    """Seconds an upstream may stay silent within an answer, once it has begun."""
    total: Seconds | None = None
    """The whole exchange, writes to a slow client included."""
    client_idle: Seconds = 60.0
    """A client that takes nothing of a stream for this long is let go (design.md 4.12)."""


class HealthCheck(_Section, frozen=True):
    """Active probing: a replica that fails it leaves the pool until it passes again."""

    path: str = "/health"
    """The path probed on each replica; any 2xx passes."""
    interval: Seconds = 5.0
    """Seconds between probes of one replica."""


class Dialect(msgspec.Struct, frozen=True):
    """What differs between the chat servers the proxy speaks to (design.md 6.14), chosen per
    upstream (`dialect`); `reasoning_field` and `min_top_logprobs` overridable on the upstream
    by their own names."""

    reasoning_field: str | None
    """Where a replayed reasoning item goes in the assistant message: SGLang and llama.cpp read
    `reasoning_content`, vLLM `reasoning`; None drops it (a server that has neither)."""
    min_top_logprobs: int
    """The fewest alternatives asked of the upstream: llama-server sends no scores at all when
    asked for none, so it needs 1 (the proxy drops what the client did not ask for,
    design.md 3.1)."""
    tokenizer: Literal["chat", "template"] | None = None
    """How the upstream counts a chat request's tokens (design.md 8.12): `chat` posts the chat
    request's messages to `tokenize_path` (SGLang's /v1/tokenize, vLLM's /tokenize, each with
    the chat template applied); `template` renders them with llama-server's /apply-template,
    then tokenizes that; None: it cannot."""
    tokenize_path: str = "/tokenize"
    """The path `chat` tokenizing posts to."""
    shares_prefill: bool = False
    """Whether the engine's cache shares a prefix with every request once it is prefilled
    (SGLang's radix tree, vLLM's blocks), where a llama-server shares a prompt only by handing
    an idle slot's cache to the next task (design.md 11.5). Where it does, a new session waits
    for its prefix being computed for another on its replica, and a miss on a prefix sent
    there within `timeouts.first_byte` is not taken for an eviction; where it does not, a
    session that waited would take the other's slot and history, and a miss says the replica
    cannot share the prefix while its slots are busy."""


DIALECTS = {
    "sglang": Dialect(
        reasoning_field="reasoning_content",
        min_top_logprobs=0,
        tokenizer="chat",
        tokenize_path="/v1/tokenize",
        shares_prefill=True,
    ),
    "vllm": Dialect(reasoning_field="reasoning", min_top_logprobs=0, tokenizer="chat", shares_prefill=True),
    "llama.cpp": Dialect(reasoning_field="reasoning_content", min_top_logprobs=1, tokenizer="template"),
    "generic": Dialect(reasoning_field=None, min_top_logprobs=0),
}


class Upstream(_Section, frozen=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    """What routes and metrics call this upstream."""
    urls: Annotated[list[str], msgspec.Meta(min_length=1)]
    """Its replicas' base URLs (`http://host:port`); several are balanced as `balance` says."""
    dialect: Literal["sglang", "vllm", "llama.cpp", "generic"] = "sglang"
    """The chat server it is (design.md 6.14): where replayed reasoning goes, the fewest
    alternatives to ask for, how its tokens are counted."""
    api_key: str | None = None
    """A bearer token sent upstream with every request."""
    api_key_env: str | None = None
    """The environment variable that holds that token (give one of the two)."""
    timeouts: Timeouts = Timeouts()
    """How long each step of an upstream exchange may take."""
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 1000
    """Connections to its replicas open at once; past it, a request waits, and then is a 503
    `upstream_busy`."""
    max_answer_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024 * 1024
    """What one answer may cost in memory (design.md 6.11): a 20k-token answer with 20 alternatives
    a token is about 25 MB; one SSE event carries a few tokens."""
    max_event_bytes: Annotated[int, msgspec.Meta(ge=1024)] = DEFAULT_MAX_EVENT
    """The largest SSE event accepted from it (design.md 6.11)."""
    max_top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=SPEC_MAX_TOP_LOGPROBS)] = SPEC_MAX_TOP_LOGPROBS
    """The cap on `top_logprobs` (design.md 3.1): a request above it is capped, and the capped
    number is sent and echoed."""
    min_top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=SPEC_MAX_TOP_LOGPROBS)] | None = None
    """The fewest alternatives asked of the upstream, over its dialect's (`Dialect`)."""
    reasoning_field: Literal["reasoning_content", "reasoning", "none"] | None = None
    """Where replayed reasoning goes in an assistant message, over the dialect's (`none` drops it)."""
    logprobs: bool = True
    """Whether its models give scores; false: a request that asks for them is a 400 naming
    `include` (design.md 3.4)."""
    defaults: dict[str, Any] = {}
    """Chat request fields that fill in what a translated `/v1/responses` call leaves out
    (`temperature`, `chat_template_kwargs`...)."""
    headers: dict[str, str] = {}
    """Headers sent upstream with every request."""
    health_check: HealthCheck | None = None
    """Active probing of its replicas; unset, only passive ejection (`eject_seconds`)."""
    eject_seconds: Seconds = 10.0
    """Seconds a replica that refused a connection is skipped for (passive ejection)."""
    hosted_tools: Literal["drop", "reject"] = "drop"
    """Tools only OpenAI's servers can run (web_search, mcp...): offered to no model here; `drop`
    leaves them out (logged, counted), `reject` refuses the request."""
    late_system_messages: Literal["system", "user"] = "system"
    """The role of system and developer messages after the conversation began: `user` for chat
    templates that refuse a second system message (Gemma, Mistral, Llama)."""
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = None
    """The reasoning summary a request that asks for none gets (design.md 8.5): `auto` turns the
    display of reasoning on in clients that show it only from summary events (the AI SDK)."""
    context_window: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """The model's context window in tokens: where `context_management` compacts by default
    (design.md 8.10) and what the model list tells Codex (8.11)."""
    balance: Literal["session", "least_outstanding"] = "session"
    """Several replicas: `session` sends every turn of a session to the replica that holds its
    prefix cache, while it carries under `load_factor` times the mean load (design.md 11.2);
    `least_outstanding` balances each request alone."""
    load_factor: Annotated[float, msgspec.Meta(ge=1.0)] = 1.25
    """How far above the mean load a replica may go before a session spills to the next
    (design.md 11.2)."""
    affinity_ttl: Seconds = 3600.0
    """How long a session keeps its replica after its last turn, and a prefix its place in the
    index after it was last sent (design.md 11.5)."""
    session_window: Seconds = 300.0
    """A new session goes where its prompt's prefix was sent, while that replica holds at most
    `load_factor` times the mean of the sessions active within this window, or one more than
    the mean (design.md 11.5)."""
    cache_salt: Literal["per_key"] | None = None
    """`per_key`: each API key's calls get a cache_salt of their own, so that tenants never share a
    cached prefix (design.md 11.6); unset, a client's own cache_salt goes as it came."""
    session_header: str | None = None
    """A header that names the session to an upstream that routes sessions itself (an Inference
    Gateway's endpoint picker: x-session-id; SGLang's model gateway: x-smg-routing-key)."""

    def key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else self.api_key

    def tenant(self, owner: str) -> str | None:
        """Whose salt a call of `owner` carries in this upstream's cache (design.md 11.6): the
        owner's, where `cache_salt` is `per_key`; else none but the client's own."""
        return owner if self.cache_salt == "per_key" else None

    def wire(self) -> Dialect:
        """The upstream's dialect, with what this upstream sets of it."""
        dialect = DIALECTS[self.dialect]
        field = dialect.reasoning_field if self.reasoning_field is None else self.reasoning_field
        return msgspec.structs.replace(
            dialect,
            reasoning_field=None if field == "none" else field,
            min_top_logprobs=dialect.min_top_logprobs if self.min_top_logprobs is None else self.min_top_logprobs,
        )


Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class CodexModel(_Section, frozen=True):
    """What Codex reads of a model from the provider (`GET /v1/models?client_version=...`,
    design.md 8.11): its context window (the upstream's), so that it compacts before the
    upstream refuses, and the rest of its model card."""

    base_instructions: Annotated[str, msgspec.Meta(min_length=1)]
    """Codex 0.171 requires them, and sends them instead of its own prompt: the operator's words,
    never made up here."""
    reasoning_levels: tuple[Effort, ...] = ("low", "medium", "high")
    """The reasoning efforts Codex offers for this model."""
    default_reasoning_level: Effort | None = None
    """The effort Codex starts with; unset, its own choice."""


class Route(_Section, frozen=True):
    model: Annotated[str, msgspec.Meta(min_length=1)]
    """The model name a request asks for: exact, or a glob (`qwen-*`, `*`)."""
    upstream: str
    """The upstream that serves it (an `upstreams[].name`)."""
    rewrite_model: str | None = None
    """The model name sent upstream instead of the requested one."""
    codex: CodexModel | None = None
    """An exact name's model card for Codex (design.md 8.11)."""


class Auth(_Section, frozen=True):
    """Client API keys accepted as `Authorization: Bearer`; none configured, none asked for."""

    api_keys: list[str] = []
    """The keys clients may send as `Authorization: Bearer`; each key's responses and files are its
    own (design.md 9.5)."""
    api_keys_env: str | None = None
    """A comma-separated list in this environment variable."""

    def keys(self) -> frozenset[str]:
        from_env = os.environ.get(self.api_keys_env, "") if self.api_keys_env else ""
        return frozenset(self.api_keys) | {key.strip() for key in from_env.split(",") if key.strip()}


class Requests(_Section, frozen=True):
    unknown_fields: Literal["ignore", "reject"] = "ignore"
    """A top-level request field the proxy does not know: `ignore` (logged once per name, counted)
    as SGLang and vLLM do, or `reject` with a 400."""
    max_depth: Annotated[int, msgspec.Meta(ge=8, le=200)] = 128
    """Nesting levels a request body may have: far above any real JSON schema, far below what would
    exhaust an encoder (design.md 5.8)."""
    session_headers: tuple[str, ...] = ("session-id", "session_id", "x-session-id")
    """The request headers that name a session, first found first (design.md 11.1)."""


class Reasoning(_Section, frozen=True):
    """The key that seals reasoning for `include: ["reasoning.encrypted_content"]`. Without
    one, each process draws its own, and reasoning replayed to another replica or after a
    restart is lost."""

    key: str | None = None
    """The sealing key itself (prefer `key_env`)."""
    key_env: str | None = "RESPONSES_PROXY_REASONING_KEY"
    """The environment variable that holds the sealing key."""

    def secret(self) -> str | None:
        return self.key or (os.environ.get(self.key_env) if self.key_env else None) or None


class Store(_Section, frozen=True):
    """Stored responses (design.md 9.1): `sqlite:PATH` (a file on this host, the default),
    `redis://HOST:PORT/DB` (shared by every replica),
    `redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]` (the primary the
    sentinels name, followed through a failover), `redis+cluster://[:PASSWORD@]HOST:PORT[,...]`
    (a Redis Cluster, any of its nodes named), or `none` (nothing is kept)."""

    url: str = "sqlite:state/responses.db"
    """Where responses are kept: `sqlite:PATH`, `redis://`, `redis+sentinel://`, `redis+cluster://`
    (or `rediss+cluster://`), or `none` (design.md 9.1, 9.9)."""
    ttl: Seconds = 30 * 24 * 3600.0
    """Seconds a response is kept: 30 days, as long as OpenAI keeps them."""
    max_responses: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    """The responses kept of each API key; past it, the key's oldest go (design.md 9.1)."""
    timeout: Seconds = 2.0
    """Seconds one store operation may take: a slow store must not hold a stream."""
    prefix: str = "responses-proxy:"
    """The prefix of the Redis keys, so that one Redis can be shared."""
    conversation_lease: Seconds = 30.0
    """A conversation's hold, renewed every third while its writer runs: one whose process died
    lets its conversation go within this (design.md 9.7)."""
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 100
    """Connections to Redis, waited for within `timeout` when all are taken; of them, one key's
    calls take at most `max_calls_per_key` at once, so that no key can take the pool (9.8)."""
    max_calls_per_key: Annotated[int, msgspec.Meta(ge=1)] = 16
    """Store calls of one API key at once, per process (design.md 9.8)."""

    @property
    def sqlite_path(self) -> str | None:
        """The file of a `sqlite:` store (`sqlite:///abs/path` also reads as an absolute path)."""
        if not self.url.startswith("sqlite:"):
            return None
        path = self.url.removeprefix("sqlite:")
        return path.removeprefix("//") if path.startswith("///") else path

    @property
    def sentinels(self) -> tuple[list[tuple[str, int]], str, int, str | None, str | None] | None:
        """The Sentinels a `redis+sentinel://` store names (design.md 9.1); None for another."""
        return sentinel_address(self.url) if self.url.startswith(SENTINEL_SCHEME) else None

    @property
    def cluster(self) -> tuple[list[tuple[str, int]], str | None, str | None, bool] | None:
        """The nodes a `redis+cluster://` store names (design.md 9.9); None for another."""
        return cluster_address(self.url) if self.url.startswith(CLUSTER_SCHEMES) else None


class Connections(_Section, frozen=True):
    """Client connections (design.md 5.11): a client may hold one only while it keeps to time."""

    header_timeout: Seconds = 10.0
    """A new connection's first request headers, complete."""
    body_timeout: Seconds = 60.0
    """Seconds for a request's body, once its headers are in."""
    keepalive: Seconds = 75.0
    """An idle keep-alive connection between requests."""
    max: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Client connections open at once; unset: half the open-file limit (raised to its hard limit
    at startup), the rest left for upstream connections and files."""
    websockets: bool = True
    """The Responses API's WebSocket transport (design.md 8.9); off: a 426, and clients go on over
    HTTP. A connection lasts at most `websocket_lifetime`, its response in flight ended."""
    websocket_lifetime: Seconds = 3600.0
    """Seconds a WebSocket connection lasts at most; its turn in flight ends first."""
    websocket_queue: Annotated[int, msgspec.Meta(ge=1)] = 16
    """What a connection may queue while a turn runs (frames, and their bytes together); past it,
    an error frame and a close (1008): nothing more is held (design.md 8.9)."""
    websocket_queue_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 32 * 1024 * 1024
    """The bytes of the frames a WebSocket connection may queue together."""
    websocket_lanes: Annotated[int, msgspec.Meta(ge=1)] = 8
    """Lanes (`stream_id`) of one connection whose turns run at once; the others' wait (8.14)."""


class Background(_Section, frozen=True):
    """Background responses (design.md 10)."""

    lease: Seconds = 10.0
    """A run renews its lease a third of this often; a replica that stops renewing it loses its
    runs to another, which marks them failed."""
    max_running: Annotated[int, msgspec.Meta(ge=1)] = 64
    """Runs at once, all replicas and keys together."""
    max_running_per_key: Annotated[int, msgspec.Meta(ge=1)] = 16
    """Background runs of one API key at once, over all replicas."""
    snapshot_interval: Seconds = 1.0
    """How often a run stores the response as it stands."""
    max_followers_per_key: Annotated[int, msgspec.Meta(ge=1)] = 1000
    """Streams following background responses that one key holds open on a process at once; past
    it, a 429. Followers of one run share each read (design.md 9.8)."""


class Tracing(_Section, frozen=True):
    """OpenTelemetry traces (design.md 12), exported over OTLP/HTTP: on with `enabled: true`,
    or, left unset, where OTEL_EXPORTER_OTLP_ENDPOINT (or its _TRACES_ form) is set."""

    enabled: bool | None = None
    """Whether spans are exported; unset: where `OTEL_EXPORTER_OTLP_ENDPOINT` (or its `_TRACES_`
    form) is set."""
    endpoint: str | None = None
    """The traces URL (http://collector:4318/v1/traces); unset: the OTEL_EXPORTER_OTLP_*
    variables'."""
    content: bool = False
    """Prompts and outputs in the spans (gen_ai.input.messages, gen_ai.output.messages)"""


class McpServer(_Section, frozen=True):
    """An MCP server the operator defines (design.md 14.1): clients name it by `server_label`
    (or `connector_id`) and need neither its URL nor its secret."""

    server_label: Annotated[str, msgspec.Meta(min_length=1)]
    """The label clients name the server by."""
    url: str
    """The server's streamable HTTP (or SSE) URL."""
    connector_id: str | None = None
    """A `connector_id` clients may name it by instead."""
    description: str | None = None
    """The server's description, given to the model with its tools where the client gives none."""
    headers: dict[str, str] = {}
    """`${NAME}` takes a value from the environment."""
    authorization: str | None = None
    """A bearer token sent to the server as `Authorization`."""
    authorization_file: str | None = None
    """A file holding that token (a mounted secret), read at each connection."""


class HostedTool(_Section, frozen=True):
    """A built-in tool type answered by a tool of one of the operator's MCP servers (14.8)."""

    server: str
    """The operator's server (its `server_label` in `mcp.servers`)."""
    tool: str
    """The tool of that server that answers the built-in, taking a `query`."""


class Mcp(_Section, frozen=True):
    """Tools the proxy runs itself: remote MCP servers (design.md 14)."""

    allowed_servers: list[str] = []
    """The `server_url` values (exact, or `fnmatch` patterns) that clients may name; none by
    default. A host on an address that is not public only by an entry that names it outright."""
    servers: list[McpServer] = []
    """The operator's own servers, with their URLs and credentials (design.md 14.1)."""
    timeout: Seconds = 30.0
    """Seconds one MCP operation may take: connecting and listing, or connecting and calling."""
    max_output_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 1024 * 1024
    """The bytes one MCP answer may have; past it, the call's error (413), never read whole."""
    max_tool_calls: Annotated[int, msgspec.Meta(ge=1)] = 16
    """MCP calls per Response at most: a request's `max_tool_calls` may lower it, never raise it."""
    max_calls_per_key: Annotated[int, msgspec.Meta(ge=1)] = 8
    """MCP operations of one API key in flight at once, per process."""
    web_search: HostedTool | None = None
    """The operator's MCP tool that answers a request's `web_search` tool (design.md 14.8)."""
    file_search: HostedTool | None = None
    """The operator's MCP tool that answers a request's `file_search` tool (design.md 14.8)."""


class Files(_Section, frozen=True):
    """Files a request gives (`input_file` parts) and the Files API keeps (design.md 8.16)."""

    allowed_urls: list[str] = []
    """The `file_url` values (exact, or patterns) a request may name, matched as
    `mcp.allowed_servers` entries are; none by default. A host on an address that is not public
    only by an entry that names it outright."""
    timeout: Seconds = 30.0
    """Seconds one `file_url` fetch may take."""
    max_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 16 * 1024 * 1024
    """The bytes of one file, however it is given."""
    max_pages: Annotated[int, msgspec.Meta(ge=1)] = 100
    """The pages of one PDF."""
    image_upstreams: list[str] = []
    """The upstreams whose models read images: a PDF's pages go to them as images too, besides its
    text; to the others, its text alone."""
    max_files_per_key: Annotated[int, msgspec.Meta(ge=1)] = 100
    """What the Files API keeps of each API key: files, and their bytes together."""
    max_bytes_per_key: Annotated[int, msgspec.Meta(ge=1024)] = 256 * 1024 * 1024
    """The bytes the Files API keeps of each API key, its files together."""


class Log(_Section, frozen=True):
    format: Literal["text", "json"] = "text"
    """`text` lines, or `json`: one object a line."""
    level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe level logged (`--log-level` overrides it)."""


class Config(_Section, frozen=True):
    upstreams: Annotated[list[Upstream], msgspec.Meta(min_length=1)]
    """The chat servers the proxy speaks to, each with its replicas."""
    routes: list[Route] = []
    """Which upstream serves which model name; none: the first upstream serves every model."""
    listen: Listen = Listen()
    """Where the proxy listens."""
    auth: Auth = Auth()
    """Client API keys."""
    log: Log = Log()
    """How the proxy logs: the lines' format and the least severe level."""
    requests: Requests = Requests()
    """How requests are read."""
    reasoning: Reasoning = Reasoning()
    """The key that seals reasoning (design.md 8.6)."""
    store: Store = Store()
    """Stored responses, background runs, conversations, files and the session map (design.md 9)."""
    connections: Connections = Connections()
    """Client connections: their time and number, and the WebSocket transport."""
    background: Background = Background()
    """Background responses (design.md 10)."""
    tracing: Tracing = Tracing()
    """OpenTelemetry traces (design.md 12.1)."""
    mcp: Mcp = Mcp()
    """Remote MCP servers the proxy runs tools on (design.md 14)."""
    files: Files = Files()
    """Files in requests and the Files API (design.md 8.16)."""
    ui: bool = False
    """The token-score viewer at /ui/ (design.md 13); it reads the API with its user's key."""
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 32 * 1024 * 1024
    """The largest request body, counted after decompression (design.md 5.8)."""
    shutdown_grace: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    """After SIGTERM: how long streams in flight may run before they are cut."""
    keepalive: Seconds | None = 15.0
    """While the upstream is silent, a stream carries an SSE comment this often, so that idle
    timers in load balancers and clients do not cut a long prefill; null: never."""


class Target(msgspec.Struct, frozen=True):
    """A request's model resolved by the routes: which upstream serves it, under which name."""

    upstream: Upstream
    model: str
    pattern: str
    """The matching route's model pattern: a label of bounded cardinality for metrics."""


def routed(config: Config) -> list[Route]:
    """The routes in force: with none configured, the first upstream serves every model."""
    return config.routes or [Route(model="*", upstream=config.upstreams[0].name)]


def resolve(config: Config, model: str) -> Target | None:
    """The first route whose pattern matches `model`."""
    for route in routed(config):
        if route.model == model or fnmatch.fnmatchcase(model, route.model):
            upstream = _upstream(config, route.upstream)
            return Target(upstream, route.rewrite_model or model, route.model)
    return None


def _upstream(config: Config, name: str) -> Upstream:
    return next(upstream for upstream in config.upstreams if upstream.name == name)


def default_model(config: Config) -> str:
    """The model of a call that names none (a token count, design.md 8.12): the first route's,
    as it goes upstream (its `rewrite_model`, else its name, a pattern included)."""
    first = routed(config)[0]
    return first.rewrite_model or first.model


def served_models(config: Config) -> list[str]:
    return [route.model for route in routed(config)]


def describe(config: Config) -> str:
    """The resolved routes, one line each, as `--check-config` prints them."""
    lines = []
    for route in routed(config):
        upstream = _upstream(config, route.upstream)
        target = f" as {route.rewrite_model}" if route.rewrite_model else ""
        lines.append(f"{route.model} -> {upstream.name}{target} [{', '.join(upstream.urls)}]")
    return "\n".join(lines)


def replace(config: Config, **changes: Any) -> Config:
    return msgspec.structs.replace(config, **changes)


def single_upstream(url: str) -> Config:
    """The config of `--upstream URL` (and of a run without a config file)."""
    return parse({"upstreams": [{"name": "default", "urls": [url]}]})


def load(path: str | Path) -> Config:
    """The config file at `path`; what is wrong with it names the file once."""
    try:
        return parse(yaml.safe_load(Path(path).read_text()) or {})
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ConfigError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse(data: Any) -> Config:
    try:
        config = msgspec.convert(_expand_env(data, "$"), Config)
    except msgspec.ValidationError as exc:
        text = str(exc)
        message, _, where = text.partition(" - at `")
        raise ConfigError(f"{where.rstrip('`').removeprefix('$.') or 'config'}: {message}") from None
    _check(config)
    return config


def _expand_env(value: Any, path: str) -> Any:
    """`${NAME}` in any string is replaced by that environment variable, which must be set."""
    if isinstance(value, dict):
        return {key: _expand_env(item, f"{path}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [_expand_env(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, str) and "${" in value:

        def lookup(match: re.Match[str]) -> str:
            name = match[1]
            if name not in os.environ:
                raise ConfigError(f"{path.removeprefix('$.')}: environment variable {name} is not set")
            return os.environ[name]

        return _ENV_VAR.sub(lookup, value)
    return value


def _check(config: Config) -> None:
    names = [u.name for u in config.upstreams]
    for i, upstream in enumerate(config.upstreams):
        if names.index(upstream.name) != i:
            raise ConfigError(f"upstreams[{i}].name: duplicate upstream name {upstream.name!r}")
        for j, url in enumerate(upstream.urls):
            if not _URL.match(url):
                raise ConfigError(f"upstreams[{i}].urls[{j}]: not a URL: {url!r}")
        decided = _PROXY_KEYS & upstream.defaults.keys()
        if decided:
            raise ConfigError(
                f"upstreams[{i}].defaults: {', '.join(sorted(decided))} set by the proxy, not by defaults"
            )
        if upstream.api_key and upstream.api_key_env:
            raise ConfigError(f"upstreams[{i}]: give api_key or api_key_env, not both")
    store = config.store
    try:  # a bad address fails the config, not the first store operation
        _ = store.sentinels, store.cluster
    except ValueError as error:
        raise ConfigError(f"store.url: {error}") from None
    if store.cluster and "{" in store.prefix:
        raise ConfigError(f"store.prefix: no braces on a cluster, where they name a key's slot: {store.prefix!r}")
    if (
        store.url != "none"
        and not store.sqlite_path
        and not store.url.startswith(("redis://", "rediss://", "unix://", SENTINEL_SCHEME, *CLUSTER_SCHEMES))
    ):
        raise ConfigError(
            "store.url: not sqlite:PATH, redis://..., rediss://..., unix://..., redis+sentinel://...,"
            f" redis+cluster://... or none: {store.url!r}"
        )
    _check_mcp(config.mcp)
    _check_allowed(config.files.allowed_urls, "files.allowed_urls")
    for i, name in enumerate(config.files.image_upstreams):
        if name not in names:
            raise ConfigError(f"files.image_upstreams[{i}]: no upstream named {name!r} (have {', '.join(names)})")
    for i, route in enumerate(config.routes):
        if route.upstream not in names:
            raise ConfigError(f"routes[{i}].upstream: no upstream named {route.upstream!r} (have {', '.join(names)})")
        if route.codex is not None and _GLOB.search(route.model):
            raise ConfigError(f"routes[{i}].codex: a model card names one model, not the pattern {route.model!r}")


def _check_allowed(entries: list[str], key: str) -> None:
    for i, entry in enumerate(entries):
        # Read as each request's URL is matched against it (design.md 14.1): an entry that does
        # not parse would fail every request that names a URL.
        try:
            parts = urlsplit(entry)
            port = parts.port if not parts.netloc.endswith(":*") else None
        except ValueError as exc:
            raise ConfigError(f"{key}[{i}]: not a URL: {entry!r} ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
            raise ConfigError(f"{key}[{i}]: not an http(s) URL with a host: {entry!r}")


def _check_mcp(mcp: Mcp) -> None:
    _check_allowed(mcp.allowed_servers, "mcp.allowed_servers")
    labels = [server.server_label for server in mcp.servers]
    for i, server in enumerate(mcp.servers):
        if labels.index(server.server_label) != i:
            raise ConfigError(f"mcp.servers[{i}].server_label: duplicate label {server.server_label!r}")
        if not _URL.match(server.url):
            raise ConfigError(f"mcp.servers[{i}].url: not a URL: {server.url!r}")
        if server.authorization and server.authorization_file:
            raise ConfigError(f"mcp.servers[{i}]: give authorization or authorization_file, not both")
    for kind in ("web_search", "file_search"):
        hosted: HostedTool | None = getattr(mcp, kind)
        if hosted is not None and hosted.server not in labels:
            raise ConfigError(f"mcp.{kind}.server: no server labelled {hosted.server!r} in mcp.servers")


SENTINEL_SCHEME = "redis+sentinel://"
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


def sentinel_address(url: str) -> tuple[list[tuple[str, int]], str, int, str | None, str | None]:
    """`redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]`: the
    sentinels (port 26379 by default), the service they watch, its database, and the user and
    password of its primary and replicas (the sentinels are asked without: they keep none of
    their own in the common setup, and Redis refuses an AUTH where no password is set)."""
    netloc, _, path = url.removeprefix(SENTINEL_SCHEME).partition("/")
    sentinels, user, password = _hosts(netloc, 26379, url)
    service, _, db = path.partition("/")
    if not service or not (db == "" or db.isdigit()):
        raise ValueError(f"not /service[/db] after the sentinels: {url!r}")
    return sentinels, unquote(service), int(db or 0), user, password


def cluster_address(url: str) -> tuple[list[tuple[str, int]], str | None, str | None, bool]:
    """`redis+cluster://[[user]:password@]host[:port][,host[:port]...]` (`rediss+cluster://`
    over TLS): any nodes of a Redis Cluster (port 6379 by default), from which the client learns
    the rest (design.md 9.9); the user and password; whether TLS."""
    tls = url.startswith(CLUSTER_SCHEMES[1])
    netloc, _, path = url.removeprefix(CLUSTER_SCHEMES[tls]).partition("/")
    if path.strip("/") not in ("", "0"):
        raise ValueError(f"a cluster has one database, 0: {url!r}")
    nodes, user, password = _hosts(netloc, 6379, url)
    return nodes, user, password, tls


def _hosts(netloc: str, default_port: int, url: str) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """`[[user]:password@]host[:port][,host[:port]...]`: the hosts, the user, the password."""
    userinfo, _, hosts = netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    found = []
    for host in hosts.split(","):
        name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if not colon:
            name, port = host, str(default_port)
        name = name.removeprefix("[").removesuffix("]")
        if not name or not port.isdigit():
            raise ValueError(f"not a host[:port]: {host!r} in {url!r}")
        found.append((name, int(port)))
    return found, unquote(user) or None, unquote(password) or None

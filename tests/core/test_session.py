"""A call's session key (design.md 11.1) and a session's replica under a bound on load (11.2),
without a socket."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from proxy.responses.schema import parse_request
from proxy.responses.session import PREFIX_BYTES, chat_session, from_headers, response_session
from proxy.upstream.affinity import choose, ranked, salt_of

INSTRUCTIONS = "You are a coding agent." * 50
FIRST_TURN = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "environment"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files here"}]},
]
LATER = [
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "I should run ls"}]},
    {"type": "function_call", "call_id": "c1", "name": "exec", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
]


def key(header: str | None = None, chained: str | None = None, **body: Any) -> str:
    request = parse_request({"model": "m", "input": FIRST_TURN, "instructions": INSTRUCTIONS, **body})
    return response_session(request, header, chained)


def test_the_order_of_the_keys() -> None:
    assert key("from-header", "from-chain", prompt_cache_key="conversation") == "conversation"
    assert key("from-header", "from-chain") == "from-header"
    assert key(None, "from-chain") == "from-chain"
    assert key().startswith("prefix:")


def test_the_prefix_key_is_the_first_turn_every_turn_repeats() -> None:
    """A stateless client resends the first turn with each later one: every turn has its key."""
    first = key()
    assert key(input=[*FIRST_TURN, *LATER]) == first
    assert key(input=[*FIRST_TURN, *LATER, {"type": "message", "role": "user", "content": "and now?"}]) == first
    other = [FIRST_TURN[0], {**FIRST_TURN[1], "content": "read the README"}]
    assert key(input=other) != first
    assert key(instructions="Another agent.") != first
    assert key(input="list the files here") != first  # a string input is its one user message


def test_the_prefix_key_reads_a_bounded_part() -> None:
    """Two first turns alike in their first PREFIX_BYTES are one session: the key's cost is bounded."""
    long = "x" * PREFIX_BYTES
    assert key(instructions=long + "a") == key(instructions=long + "b")
    assert key(instructions=long[:-10] + "a") != key(instructions=long[:-10] + "b")


def test_a_clients_own_key_is_bounded() -> None:
    """A key goes into an upstream header and the session map: one with a line break, or too
    long, is its digest, the same every time."""
    assert key(prompt_cache_key="conv-1") == "conv-1"
    for sent in ("a\r\nx-injected: 1", "k" * 129, "sessión"):
        assert key(prompt_cache_key=sent).startswith("key:") and key(prompt_cache_key=sent) == key(prompt_cache_key=sent)
    assert chat_session({"messages": [], "user": "u\n"}, None) == key(prompt_cache_key="u\n")


def test_a_session_header_is_the_first_of_those_configured() -> None:
    headers = {"x-session-id": "third", "session_id": "second"}
    assert from_headers(headers, ("session-id", "session_id", "x-session-id")) == "second"
    assert from_headers({"session-id": "  "}, ("session-id",)) is None


def test_the_order_of_a_chat_calls_keys() -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": messages, "user": "u1", "prompt_cache_key": "conv"}
    assert chat_session(body, "header") == "conv"
    assert chat_session({**body, "prompt_cache_key": None}, "header") == "header"
    assert chat_session({**body, "prompt_cache_key": None}, None) == "u1"
    bare = {"model": "m", "messages": messages}
    later = {"model": "m", "messages": [*messages, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]}
    assert chat_session(bare, None) == chat_session(later, None)
    assert chat_session({"model": "m", "prompt": "once upon"}, None) != chat_session({"model": "m", "prompt": "a time"}, None)
    assert chat_session([1, 2], None) is None


class Replica:
    def __init__(self, url: str, outstanding: int = 0) -> None:
        self.url = url
        self.salt = salt_of(url)
        self.outstanding = outstanding


REPLICAS = [Replica(f"http://10.0.0.{i}:8000") for i in range(4)]


def test_a_sessions_order_depends_on_its_key_and_the_replicas_alone() -> None:
    orders = {tuple(replica.url for replica in ranked(f"session {i}", REPLICAS)) for i in range(200)}
    assert len(orders) > 8  # sessions spread over the replicas
    again = [Replica(replica.url) for replica in reversed(REPLICAS)]  # another process, another list order
    for i in range(50):
        assert [r.url for r in ranked(f"session {i}", REPLICAS)] == [r.url for r in ranked(f"session {i}", again)]


def test_a_replica_that_goes_moves_only_its_own_sessions() -> None:
    gone = REPLICAS[0]
    for i in range(200):
        before = ranked(f"session {i}", REPLICAS)
        after = ranked(f"session {i}", REPLICAS[1:])
        assert after == [replica for replica in before if replica is not gone]


def test_the_pinned_replica_first_while_under_the_bound() -> None:
    replicas = [Replica("http://a", 3), Replica("http://b", 1), Replica("http://c", 0)]
    # Bound: max(ceil(1.25 * (4 + 1) / 3), ceil(5 / 3) + 1) = 3, so a, with 3 in flight, is over it.
    assert choose("s", "http://a", replicas, 1.25)[0].url != "http://a"
    assert choose("s", "http://a", replicas, 1.6)[0].url != "http://a"  # ceil(1.6 * 5 / 3) = 3: still over
    assert choose("s", "http://a", replicas, 1.9)[0].url == "http://a"  # ceil(1.9 * 5 / 3) = 4
    spilled = choose("s", "http://a", replicas, 1.25)
    assert spilled[0] is ranked("s", replicas[1:])[0] and spilled[-1] is replicas[0]  # over the bound: last
    # One more than the mean rounded up, where the factor alone would spill: ceil(1.25 * 4 / 3) = 2.
    replicas[0].outstanding = 2
    assert choose("s", "http://a", replicas, 1.25)[0].url == "http://a"  # ceil(4 / 3) + 1 = 3
    two = [Replica("http://a", 2), Replica("http://b", 0)]
    assert choose("s", "http://a", two, 1.25)[0].url == "http://a"  # ceil(3 / 2) + 1 = 3 > ceil(1.25 * 3 / 2)


@pytest.mark.parametrize("load_factor", [1.25, 1.5])
def test_skewed_sessions_keep_the_busiest_replica_within_the_bound(load_factor: float) -> None:
    """design.md 11.2: sessions of very different sizes (a few long agents, many short chats)
    arriving at random; a session keeps its replica until the bound spills it. A replica never
    takes a call that puts it past the bound (load_factor times the mean, this call counted,
    rounded up, or one more than the mean rounded up), and over the run the busiest carries at
    most load_factor times the mean (at this load, some 20 calls a replica: at a few, the
    rounding up lets one more in)."""
    rng = random.Random(7)
    replicas = [Replica(f"http://r{i}") for i in range(4)]
    pinned: dict[str, str] = {}
    in_flight: list[tuple[int, Replica]] = []  # (calls left until it ends, replica)
    sessions = [f"agent {i}" for i in range(3)] * 20 + [f"chat {i}" for i in range(60)]
    busiest, mean = 0, 0.0
    for _ in range(3000):
        in_flight = [(left - 1, replica) for left, replica in in_flight]
        for left, replica in in_flight:
            if left == 0:
                replica.outstanding -= 1
        in_flight = [(left, replica) for left, replica in in_flight if left > 0]
        session = rng.choice(sessions)
        chosen = choose(session, pinned.get(session), replicas, load_factor)[0]
        pinned[session] = chosen.url
        chosen.outstanding += 1
        in_flight.append((rng.randint(20, 160), chosen))  # some 20 calls in flight a replica
        total = sum(replica.outstanding for replica in replicas)
        mean_now = total / len(replicas)
        assert chosen.outstanding <= max(math.ceil(load_factor * mean_now), math.ceil(mean_now) + 1)
        busiest += max(replica.outstanding for replica in replicas)
        mean += total / len(replicas)
    assert busiest / mean <= load_factor
    assert len(set(pinned.values())) == len(replicas)

"""A new session's replica (design.md 11.5) without a socket: the digests of a chat request's
leading part, the choice among the replicas, what a usage says a replica forgot (a relayed
answer's usage read as it passes), the sessions each replica holds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from proxy.responses.chat import RelayedUsage
from proxy.upstream.affinity import ranked, salt_of
from proxy.upstream.placement import BLOCK, DIGESTS, Computing, Prefix, SessionLoads, place, prefix_of, stale

SYSTEM = "You are a careful agent. " * 400  # about 10 KB: several blocks
TOOLS = [{"type": "function", "function": {"name": "exec", "parameters": {"type": "object"}}}]


class Replica:
    def __init__(self, url: str, outstanding: int = 0) -> None:
        self.url, self.salt, self.outstanding = url, salt_of(url), outstanding


REPLICAS = [Replica(f"http://r{i}") for i in range(3)]


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **fields}


def system(text: str = SYSTEM) -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def digests(body: dict[str, Any]) -> tuple[str, ...]:
    return prefix_of(body, 1000).digests


def test_the_leading_part_is_what_sessions_of_one_product_share() -> None:
    one = prefix_of(chat(system(), user("task one"), tools=TOOLS), 100)
    other = prefix_of(chat(system(), user("another task"), {"role": "assistant", "content": "ok"}, tools=TOOLS), 200)
    assert one.digests == other.digests and one.tie == other.tie
    assert len(one.digests) > 2  # a block every BLOCK bytes, and the end of each part
    assert one.ends == tuple(sorted(one.ends)) and one.ends[0] == BLOCK
    # Every part of the leading part counts, the developer messages after the tools included.
    assert digests(chat(system(), tools=TOOLS)) != digests(chat(system()))
    longer = digests(chat(system(), {"role": "developer", "content": "environment: /repo"}, tools=TOOLS))
    assert longer[: len(one.digests)] == one.digests and len(longer) == len(one.digests) + 1
    # The tools are read after the first system message, as chat templates render them.
    assert digests(chat(system(), tools=TOOLS))[0] == digests(chat(system()))[0]


def test_a_prefix_shared_up_to_a_point_matches_up_to_it() -> None:
    mine = digests(chat(system(SYSTEM + "Then review the tests.")))
    theirs = digests(chat(system(SYSTEM + "Then write the docs.")))
    shared = len(SYSTEM) // BLOCK
    assert mine[:shared] == theirs[:shared] and mine[shared:] != theirs[shared:]


def test_the_salt_and_the_model_begin_every_digest() -> None:
    plain = digests(chat(system()))
    for other in (chat(system(), cache_salt="tenant a"), {**chat(system()), "model": "other"}):
        assert not set(digests(other)) & set(plain)
    assert prefix_of(chat(system(), cache_salt="a"), 1).tie != prefix_of(chat(system(), cache_salt="b"), 1).tie


def test_the_leading_part_read_is_bounded() -> None:
    huge = prefix_of(chat(system("x" * BLOCK * (DIGESTS + 10))), 10)
    assert len(huge.digests) == DIGESTS and huge.ends[-1] == BLOCK * DIGESTS
    many = prefix_of(chat(*(system(f"rule {i}") for i in range(DIGESTS * 2))), 10)
    assert len(many.digests) == DIGESTS
    assert prefix_of(chat(user("hi")), 10).digests == ()
    assert prefix_of({"prompt": "a completion"}, 10).digests == ()


def loads(*held: int) -> dict[str, int]:
    return {replica.url: n for replica, n in zip(REPLICAS, held, strict=True)}


PREFIX = prefix_of(chat(system()), 12_000)


def held(at: int, *urls: str) -> list[set[str]]:
    """The index's answer: `urls` hold the digests up to `at`."""
    return [set(urls) if i <= at else set() for i in range(len(PREFIX.digests))]


def test_the_longest_prefix_held_within_the_bound_wins() -> None:
    r0, r1, r2 = (replica.url for replica in REPLICAS)
    index = [a | b for a, b in zip(held(0, r1), held(len(PREFIX.digests) - 1, r2), strict=True)]
    order, matched = place(PREFIX, index, loads(1, 1, 1), REPLICAS, 1.25)
    assert order[0].url == r2 and matched == PREFIX.ends[-1]
    # Its holder past the bound (one more than the mean, this session counted), the shorter one.
    order, matched = place(PREFIX, index, loads(1, 1, 3), REPLICAS, 1.25)
    assert order[0].url == r1 and matched == PREFIX.ends[0]
    assert [replica.url for replica in order[1:]] == [r0, r2]  # then the least loaded


def test_with_no_holder_within_the_bound_the_least_loaded_by_the_prefix_own_order() -> None:
    r0 = REPLICAS[0].url
    order, matched = place(PREFIX, held(3, r0), loads(4, 2, 2), REPLICAS, 1.25)
    assert matched == 0 and order[0].url != r0 and order[-1].url == r0
    # Tied, the prefix orders them: every session of this prompt, in every process, alike.
    first = ranked(PREFIX.tie, REPLICAS)[0]
    assert place(PREFIX, [], loads(0, 0, 0), REPLICAS, 1.25)[0][0] is first
    tied = loads(*(1 if replica is first else 0 for replica in REPLICAS))
    assert place(PREFIX, [], tied, REPLICAS, 1.25)[0][0] is ranked(PREFIX.tie, [r for r in REPLICAS if r is not first])[0]


def test_the_bound_is_the_factor_of_the_mean_or_one_more_than_the_mean() -> None:
    r0 = REPLICAS[0].url
    everywhere = held(len(PREFIX.digests) - 1, r0)
    assert place(PREFIX, everywhere, loads(0, 0, 0), REPLICAS, 1.25)[1] > 0
    assert place(PREFIX, everywhere, loads(1, 1, 1), REPLICAS, 1.25)[1] > 0  # 2 <= 4 / 3 + 1
    # At a few sessions a replica, one more than the mean, where the factor alone would refuse.
    assert place(PREFIX, everywhere, loads(2, 2, 1), REPLICAS, 1.25)[1] > 0  # 3 <= 6 / 3 + 1, > 1.25 * 2
    assert place(PREFIX, everywhere, loads(2, 1, 1), REPLICAS, 1.25)[1] == 0  # 3 > 5 / 3 + 1
    assert place(PREFIX, everywhere, loads(1, 0, 0), REPLICAS, 1.25)[1] == 0  # 2 > 2 / 3 + 1
    # From 4 sessions a replica, the factor is the looser.
    assert place(PREFIX, everywhere, loads(6, 5, 5), REPLICAS, 1.25)[1] > 0  # 7 <= 1.25 * 17 / 3, > 17 / 3 + 1
    assert place(PREFIX, everywhere, loads(6, 5, 4), REPLICAS, 1.25)[1] == 0  # 7 > 1.25 * 16 / 3
    assert place(PREFIX, everywhere, loads(5, 4, 2), REPLICAS, 2.0)[1] > 0


def test_a_replica_a_known_session_would_spill_from_takes_no_new_one() -> None:
    """design.md 11.5: the new session would add to a replica's requests in flight; where a known
    session would spill for them (11.2), its prefix does not hold it there."""
    r0 = REPLICAS[0].url
    busy = [Replica(replica.url, 3 if replica.url == r0 else 1) for replica in REPLICAS]
    index = held(len(PREFIX.digests) - 1, r0)
    assert place(PREFIX, index, loads(1, 1, 1), REPLICAS, 1.25)[0][0].url == r0
    order, matched = place(PREFIX, index, loads(1, 1, 1), busy, 1.25)  # max(ceil(1.25 * 6 / 3), 2 + 1) = 3: at it
    assert matched == 0 and order[-1].url == r0  # over the bound in flight: last
    busy[0].outstanding = 2
    assert place(PREFIX, index, loads(1, 1, 1), busy, 1.25)[0][0].url == r0


def test_with_none_within_both_bounds_the_bound_on_sessions_comes_first() -> None:
    """design.md 11.5: a replica busy for a moment takes a new session before one past its share
    of sessions, which would keep it for all its turns."""
    r0 = REPLICAS[0].url
    busy = [Replica(replica.url, 3 if replica.url == r0 else 0) for replica in REPLICAS]  # cap 3: at it
    order, matched = place(PREFIX, [], loads(0, 3, 3), busy, 1.25)  # r1, r2: 4 > 7 / 3 + 1
    assert matched == 0 and order[0].url == r0
    order, _ = place(PREFIX, [], loads(2, 2, 2), busy, 1.25)  # all within on sessions: r0 last
    assert order[-1].url == r0


def test_a_usage_that_found_far_less_cached_than_matched_names_what_to_forget() -> None:
    prefix = Prefix(("a", "b", "c", "d"), (4000, 8000, 12000, 13000), "a", 20_000)
    # 13 000 bytes matched of 20 000: 65 % of a 1000-token prompt.
    assert stale(prefix, 13000, 1000, 650) == []
    assert stale(prefix, 13000, 1000, 400) == []  # at least half of it: a good match
    assert stale(prefix, 13000, 1000, 300) == ["b", "c", "d"]  # 6000 bytes covered
    assert stale(prefix, 13000, 1000, 0) == ["a", "b", "c", "d"]
    assert stale(prefix, 13000, 0, 0) == []  # no usage: nothing learnt


def test_a_replica_holds_the_sessions_it_served_within_the_window() -> None:
    sessions = SessionLoads(window=10)
    assert sessions.touch("s1", "r0", 0) and sessions.touch("s2", "r0", 1) and sessions.touch("s3", "r1", 2)
    assert sessions.held(5) == {"r0": 2, "r1": 1}
    assert sessions.touch("s1", "r1", 6)  # spilled: counted where it went, and reported
    assert sessions.held(6) == {"r0": 1, "r1": 2}
    assert sessions.held(11.5) == {"r0": 0, "r1": 2}  # s2 idle for the window
    assert not sessions.touch("s3", "r1", 4)  # reported at 2: a quarter of the window not gone by
    assert sessions.touch("s3", "r1", 12)  # a turn keeps it, and reports it again
    assert not sessions.touch("s3", "r1", 14)
    assert sessions.held(16.5) == {"r0": 0, "r1": 1}
    bounded = SessionLoads(window=10, size=2)
    for i in range(3):
        bounded.touch(f"s{i}", "r0", i)
    assert bounded.held(3) == {"r0": 2}


async def test_a_wait_for_a_prefix_being_computed_ends_when_it_can_be_shared() -> None:
    """design.md 11.5: a wait for a prefix a replica is computing ends when it can be shared
    (the first of those computing it there is done), or at its bound."""
    computing = Computing()
    r0, r1 = REPLICAS[0].url, REPLICAS[1].url
    done = computing.begin(PREFIX.digests, r0)
    computing.end(PREFIX.digests, r0, computing.begin(PREFIX.digests, r0))  # a second one there: the first's stay
    waiting = asyncio.create_task(computing.wait(PREFIX.digests[-1], r0, 5))
    await asyncio.sleep(0)
    assert not waiting.done()
    computing.end(PREFIX.digests, r0, done)
    await asyncio.wait_for(waiting, 1)
    started = time.monotonic()
    late = computing.begin(PREFIX.digests, r1)
    await computing.wait(PREFIX.digests[0], r1, 0.05)  # at its bound
    assert 0.04 < time.monotonic() - started < 1 and not late.is_set()
    await computing.wait(PREFIX.digests[0], r0, 5)  # nothing computing there: at once


def frame(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def relayed(answer: bytes, streamed: bool, splits: list[int], limit: int = 1 << 20) -> Any:
    reader = RelayedUsage(streamed, limit)
    for start, end in zip([0, *splits], [*splits, len(answer)], strict=True):
        reader.feed(answer[start:end])
    return reader.usage()


def test_a_relayed_answer_is_read_for_its_usage_however_it_comes() -> None:
    """design.md 11.5: the usage of a relayed answer, from a stream's usage chunk (SGLang's and
    vLLM's cached tokens, llama.cpp's `timings.cache_n`) or a whole body, read over any split
    of its bytes; a body past the limit, or a stream without one, says nothing."""
    text = {"choices": [{"index": 0, "delta": {"content": 'ok "usage"'}}]}
    sglang = {"choices": [], "usage": {"prompt_tokens": 3000, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 2900}}}
    llama = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3000, "completion_tokens": 2}, "timings": {"cache_n": 100}}
    for last, cached in ((sglang, 2900), (llama, 100)):
        stream = frame(text) + frame(last) + b"data: [DONE]\n\n"
        for split in range(len(stream) + 1):
            usage = relayed(stream, True, [split])
            assert usage.prompt_tokens == 3000 and usage.prompt_tokens_details.cached_tokens == cached
    assert relayed(stream, True, list(range(1, len(stream)))).prompt_tokens_details.cached_tokens == 100  # a byte a read
    uncounted = {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 18, "total_tokens": 48}}
    usage = relayed(frame(text) + frame(uncounted) + b"data: [DONE]\n\n", True, [40])  # no cached count
    assert usage.prompt_tokens == 30 and usage.prompt_tokens_details is None
    assert relayed(frame(text) + b"data: [DONE]\n\n", True, []) is None
    body = orjson.dumps({"choices": [{"index": 0, "message": {"content": "ok"}}], "usage": sglang["usage"]})
    assert relayed(body, False, [5, 40]).prompt_tokens_details.cached_tokens == 2900
    assert relayed(body, False, [5, 40], limit=len(body)).prompt_tokens_details.cached_tokens == 2900
    assert relayed(body, False, [5, 40], limit=len(body) - 1) is None
    assert relayed(b"<html>a proxy's error page</html>", False, []) is None

"""The one logprob mapping: compact, complete entries pass through; anything else is mapped."""

from __future__ import annotations

import json

import orjson
import pytest

from proxy.errors import UpstreamProtocolError
from proxy.responses.logprobs import ScoreBuffer, effective_top_logprobs
from tests.events import as_response_logprob


def mapped(entries: list[dict], *, compact: bool = True) -> list[dict]:
    raw = orjson.dumps(entries) if compact else json.dumps(entries).encode()  # json: `"key": value`
    buffer = ScoreBuffer()
    buffer.add(raw)
    scores = orjson.loads(orjson.dumps(buffer.whole()))
    assert buffer.count == len(scores)
    return scores


ENTRIES = {
    "complete": {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}]},
    "null logprob": {"token": "x", "logprob": None, "bytes": [120], "top_logprobs": [{"token": "x", "logprob": None, "bytes": [120]}]},
    "no bytes": {"token": "é", "logprob": -1.0, "top_logprobs": [{"token": "e", "logprob": -2.0}]},
    "no bytes on a top entry": {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": [{"token": "b", "logprob": -2.0}]},
    "token text that names a key": {"token": "bytes", "logprob": -1.0, "top_logprobs": []},
    "token text null": {"token": "null", "logprob": -1.0, "bytes": [110, 117, 108, 108], "top_logprobs": [{"token": ":null", "logprob": -2.0, "bytes": [58, 110, 117, 108, 108]}]},
    "no top_logprobs": {"token": "a", "logprob": -1.0, "bytes": [97]},
    "top_logprobs null": {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": None},
    # llama.cpp: a token id on every entry and alternative, first or last.
    "llama.cpp id": {"id": 6974, "token": "Write", "bytes": [87], "logprob": -0.87, "top_logprobs": [{"id": 6974, "token": "Write", "bytes": [87], "logprob": -0.87}, {"token": "<", "bytes": [60], "logprob": -2.6, "id": 236820}]},
    "llama.cpp zero probability": {"id": 1, "token": "x", "bytes": [120], "logprob": -3.4028234663852886e38, "top_logprobs": [{"id": 2, "token": "y", "bytes": [121], "logprob": -3.4028234663852886e38}]},
    "llama.cpp end of sequence": {"id": 1, "token": "", "bytes": [], "logprob": -7.66, "top_logprobs": [{"id": 236820, "token": "<", "bytes": [60], "logprob": -0.5}]},
    "a key of some other server": {"token": "a", "logprob": -1.0, "bytes": [97], "text_offset": 3, "top_logprobs": []},
    "a token that holds a key": {"token": '"id":5,', "logprob": -1.0, "bytes": [34], "top_logprobs": [{"token": '","id":1}', "logprob": -2.0, "bytes": [44]}]},
}


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "spaced"])
@pytest.mark.parametrize("entry", ENTRIES.values(), ids=ENTRIES.keys())
def test_every_entry_maps_to_the_four_keys(entry: dict, compact: bool) -> None:
    assert mapped([entry], compact=compact) == [as_response_logprob(entry)]


def test_one_entry_to_map_among_many_keeps_them_all_in_order() -> None:
    entries = list(ENTRIES.values()) * 2
    assert mapped(entries) == [as_response_logprob(entry) for entry in entries]


@pytest.mark.parametrize("content", [b"[[1, 2]]", b"[1]", b'["token"]', b'[{"logprob": -1}]', b'{"token": "a"}', b'"a"'])
def test_content_that_is_not_a_list_of_entries_is_a_protocol_error(content: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        ScoreBuffer().add(content)


@pytest.mark.parametrize("content", [b"[]", b"null"])
def test_no_scores(content: bytes) -> None:
    buffer = ScoreBuffer()
    buffer.add(content)
    assert buffer.count == 0 and buffer.take() == b"[]"


def test_the_buffer_delivers_each_score_once_in_order_and_keeps_them_all() -> None:
    entries = [{"token": t, "logprob": -1.0, "bytes": list(t.encode()), "top_logprobs": []} for t in "abcde"]
    buffer = ScoreBuffer()
    taken = []
    for chunk, take in (([entries[0]], True), ([], True), ([entries[1], entries[2]], False), ([entries[3]], True), ([entries[4]], False)):
        buffer.add(orjson.dumps(chunk))
        if take:
            taken.append(orjson.loads(buffer.take()))
    assert taken == [[entries[0]], [], entries[1:4]]
    assert buffer.count == 5
    assert orjson.loads(orjson.dumps(buffer.whole())) == entries
    assert orjson.loads(buffer.take()) == [entries[4]]
    assert orjson.loads(buffer.take()) == []


def test_a_delta_with_one_chunk_of_scores_sends_its_bytes_as_they_came() -> None:
    array = orjson.dumps([ENTRIES["complete"]])
    buffer = ScoreBuffer()
    buffer.add(array)
    assert buffer.take() is array


@pytest.mark.parametrize(("requested", "cap", "sent"), [(None, 20, 0), (5, 20, 5), (21, 20, 20), (10**9, 20, 20), (7, 3, 3)])
def test_effective_top_logprobs(requested: int | None, cap: int, sent: int) -> None:
    assert effective_top_logprobs(requested, cap) == sent


def test_llama_cpp_ids_keep_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries that differ from the Responses shape only by llama.cpp's token ids are cut down
    to it in their bytes, never decoded one by one."""
    monkeypatch.setattr("proxy.responses.logprobs._mapped", lambda entry: pytest.fail("took the slow path"))
    entry = ENTRIES["llama.cpp id"]
    assert mapped([entry, entry]) == [as_response_logprob(entry)] * 2

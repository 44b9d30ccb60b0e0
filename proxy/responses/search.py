"""The proxy's own tool search (design.md 8.17): the request's deferred tools ranked for the
model's query by BM25 over their words, through `bm25s`, imported at the first search (2.6)."""

from __future__ import annotations

import re
from collections.abc import Sequence

# Where an identifier's words meet: snake_case, kebab-case, dotted, camelCase, a digit run.
_JOINS = re.compile(r"[_\-./:]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Za-z])(?=[0-9])")
# What the model reads of a search: at most this many tools, as Codex's own search returns.
LIMIT = 8


def words(*texts: str | None) -> str:
    """Texts as the words a search matches, identifiers split into theirs (`get_weather`,
    `getWeather` are `get weather`)."""
    return " ".join(_JOINS.sub(" ", text) for text in texts if text)


def rank(documents: Sequence[str], query: str, limit: int = LIMIT) -> list[int]:
    """The indexes of the documents (`words` each) that share a word with the query, best
    first, at most `limit` of them; English stopwords count for nothing."""
    import bm25s  # type: ignore[import-untyped]  # with numpy, 0.1 s once a process: where a search runs (2.6)

    corpus = bm25s.tokenize([document.lower() for document in documents], stopwords="en", show_progress=False)
    asked = bm25s.tokenize(words(query).lower(), stopwords="en", return_ids=False, show_progress=False)
    if not corpus.vocab or not asked or not asked[0]:  # bm25s indexes no empty vocabulary
        return []
    index = bm25s.BM25()
    index.index(corpus, show_progress=False)
    scores = index.get_scores(asked[0])
    ranked = sorted(range(len(documents)), key=lambda at: (-scores[at], at))
    return [at for at in ranked[:limit] if scores[at] > 0]

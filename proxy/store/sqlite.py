"""The embedded backend: one SQLite file, written by one thread of its own (the event loop
never waits on the disk). Several processes on one host may share the file (WAL mode)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from .backend import (
    Claim,
    Event,
    Fenced,
    Renewal,
    Runs,
    StoredConversation,
    StoredFile,
    StoredResponse,
    decode_conversation,
    decode_file,
    decode_stored,
    encode_conversation,
    encode_file,
    encode_stored,
    referable_items,
)

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at REAL NOT NULL,
    record BLOB NOT NULL, previous TEXT
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at);
CREATE INDEX IF NOT EXISTS responses_by_owner ON responses (owner, created_at, id);
CREATE TABLE IF NOT EXISTS items (
    owner TEXT NOT NULL, id TEXT NOT NULL, response_id TEXT NOT NULL, expires_at REAL NOT NULL, item BLOB NOT NULL,
    PRIMARY KEY (owner, id)
);
CREATE INDEX IF NOT EXISTS items_by_response ON items (response_id);
CREATE TABLE IF NOT EXISTS events (
    response_id TEXT NOT NULL, seq INTEGER NOT NULL, expires_at REAL NOT NULL, event BLOB NOT NULL,
    PRIMARY KEY (response_id, seq)
);
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL, record BLOB NOT NULL,
    holder TEXT, held_until REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, bytes INTEGER NOT NULL, record BLOB NOT NULL, content BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner);
CREATE TABLE IF NOT EXISTS runs (
    response_id TEXT PRIMARY KEY, owner TEXT NOT NULL, holder TEXT NOT NULL, lease_until REAL NOT NULL,
    cancel INTEGER NOT NULL DEFAULT 0
);
"""


_BUSY = 5.0  # seconds a statement waits for another connection's lock


def _holds(db: sqlite3.Connection, id: str, fence: str) -> bool:
    """Whether the fencing token holds the run's lease (design.md 10.4), read in the write's
    own transaction."""
    return db.execute("SELECT 1 FROM runs WHERE response_id = ? AND holder = ?", (id, fence)).fetchone() is not None


def _add_links(db: sqlite3.Connection) -> None:
    """A file made before chains were links (design.md 9.4) gets the column of each response's
    link; checked and added in one transaction, so that processes opening it at once add it once.
    Its rows keep none: their records name their whole chain (`StoredResponse.ancestors`)."""
    with db:
        db.execute("BEGIN IMMEDIATE")
        if "previous" not in {column for _, column, *_ in db.execute("PRAGMA table_info(responses)")}:
            db.execute("ALTER TABLE responses ADD COLUMN previous TEXT")


def _use_wal(db: sqlite3.Connection) -> None:
    """WAL mode, which the file keeps once set. Setting it takes a lock that SQLite's busy
    timeout does not wait for: replicas opening a new file at once wait here for whichever
    sets it, instead of failing their first operation."""
    deadline = time.monotonic() + _BUSY
    while db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:
            db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class SQLiteBackend:
    """Records, event log and leases (`backend.Backend`) in one file. It cannot wake a reader in
    another process: `read` answers at once, and a reader polls."""

    def __init__(self, path: str, ttl: float, max_responses: int) -> None:
        self._path = path
        self._ttl = ttl
        self._max = max_responses
        self._db: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sqlite-store")
        self._appends: list[tuple[str, list[Event], str, asyncio.Future[None]]] = []  # for the next transaction

    async def put(self, stored: StoredResponse, items: bool, fence: str | None) -> None:
        await self._run(self._put, stored, items, fence)

    async def get(self, ids: list[str], owner: str) -> dict[str, StoredResponse]:
        return await self._run(self._get, ids, owner)

    async def chain(self, id: str, owner: str) -> tuple[list[StoredResponse], str | None]:
        return await self._run(self._chain, id, owner)

    async def items(self, ids: list[str], owner: str) -> dict[str, bytes]:
        return await self._run(self._items, ids, owner)

    async def recent(self, owner: str, after: str | None, limit: int) -> list[StoredResponse] | None:
        return await self._run(self._recent, owner, after, limit)

    async def delete(self, id: str, owner: str) -> bool:
        return await self._run(self._delete, id, owner)

    async def close(self) -> None:
        await self._run(self._close)
        self._thread.shutdown()

    async def append(self, id: str, events: list[Event], fence: str) -> None:
        loop = asyncio.get_running_loop()
        written = loop.create_future()
        if not self._appends:
            loop.call_soon(self._write_appends)
        self._appends.append((id, events, fence, written))
        await written

    def _write_appends(self) -> None:
        """The appends of every run made in one turn of the event loop, in one transaction: an
        SGLang decode step reaches all its streams at once (design.md 10.2)."""
        appends, self._appends = self._appends, []

        def settle(job: asyncio.Future[list[Exception | None]]) -> None:
            failed = asyncio.CancelledError() if job.cancelled() else job.exception()
            refusals = [None] * len(appends) if failed is not None else job.result()
            for (*_, written), refused in zip(appends, refusals, strict=True):
                if written.done():  # its writer stopped waiting (a timeout, a cancelled run)
                    continue
                error = failed or refused
                if error is None:
                    written.set_result(None)
                else:
                    written.set_exception(error)

        try:
            job = asyncio.get_running_loop().run_in_executor(
                self._thread, self._append, [(id, events, fence) for id, events, fence, _ in appends]
            )
        except RuntimeError as error:  # the store was closed
            job = asyncio.get_running_loop().create_future()
            job.set_exception(error)
        job.add_done_callback(settle)

    async def read(self, id: str, after: int, wait: float) -> list[Event]:
        return await self._run(self._events, id, after)

    async def claim(self, id: str, owner: str, holder: str, lease: float, caps: Runs) -> Claim:
        return await self._run(self._claim, id, owner, holder, lease, caps)

    async def renew(self, id: str, holder: str, lease: float) -> Renewal:
        return await self._run(self._renew, id, holder, lease)

    async def release(self, id: str, holder: str) -> None:
        await self._run(self._write, "DELETE FROM runs WHERE response_id = ? AND holder = ?", (id, holder))

    async def cancel(self, id: str) -> None:
        await self._run(self._write, "UPDATE runs SET cancel = 1 WHERE response_id = ?", (id,))

    async def take(self, id: str, holder: str, lease: float) -> bool:
        now = time.time()
        statement = "UPDATE runs SET holder = ?, lease_until = ? WHERE response_id = ? AND lease_until < ?"
        return await self._run(self._write, statement, (holder, now + lease, id, now)) > 0

    async def expired(self) -> list[tuple[str, str]]:
        return await self._run(self._expired)

    async def conversation(self, id: str, owner: str) -> StoredConversation | None:
        return await self._run(self._conversation, id, owner)

    async def keep_conversation(self, conversation: StoredConversation) -> None:
        expires = time.time() + self._ttl
        await self._run(
            self._write,
            "INSERT INTO conversations (id, owner, expires_at, record) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at, record = excluded.record",
            (conversation.id, conversation.owner, expires, encode_conversation(conversation)),
        )

    async def forget_conversation(self, id: str, owner: str) -> bool:
        return await self._run(self._write, "DELETE FROM conversations WHERE id = ? AND owner = ?", (id, owner)) > 0

    async def hold(self, id: str, owner: str, holder: str, seconds: float) -> bool:
        now = time.time()
        taken = await self._run(
            self._write,
            "UPDATE conversations SET holder = ?, held_until = ? "
            "WHERE id = ? AND owner = ? AND expires_at >= ? AND (holder IS NULL OR holder = ? OR held_until < ?)",
            (holder, now + seconds, id, owner, now, holder, now),
        )
        return taken > 0

    async def let_go(self, id: str, holder: str) -> None:
        await self._run(self._write, "UPDATE conversations SET holder = NULL WHERE id = ? AND holder = ?", (id, holder))

    async def put_file(self, file: StoredFile, content: bytes, max_files: int, max_bytes: int) -> str | None:
        return await self._run(self._put_file, file, content, max_files, max_bytes)

    async def file(self, id: str, owner: str) -> StoredFile | None:
        found = await self._run(self._read, "SELECT record FROM files WHERE id = ? AND owner = ?", (id, owner))
        return None if found is None else decode_file(found)

    async def file_content(self, id: str, owner: str) -> bytes | None:
        return await self._run(self._read, "SELECT content FROM files WHERE id = ? AND owner = ?", (id, owner))

    async def files(self, owner: str) -> list[StoredFile]:
        return await self._run(self._files, owner)

    async def forget_file(self, id: str, owner: str) -> bool:
        return await self._run(self._write, "DELETE FROM files WHERE id = ? AND owner = ?", (id, owner)) > 0

    async def _run(self, work: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, work, *args)

    # -- in the store's thread ---------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None, timeout=_BUSY)
            _use_wal(db)
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            _add_links(db)
            self._db = db
        return self._db

    def _put(self, stored: StoredResponse, items: bool, fence: str | None) -> None:
        db = self._connection()
        expires = time.time() + self._ttl
        with db:  # one transaction: a response is kept whole or not at all
            db.execute("BEGIN IMMEDIATE")
            if fence is not None and not _holds(db, stored.id, fence):
                raise Fenced
            db.execute(
                "INSERT OR REPLACE INTO responses (id, owner, created_at, expires_at, record, previous) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (stored.id, stored.owner, stored.created_at, expires, encode_stored(stored), stored.previous),
            )
            db.executemany(
                "INSERT OR REPLACE INTO items (owner, id, response_id, expires_at, item) VALUES (?, ?, ?, ?, ?)",
                [(stored.owner, item_id, stored.id, expires, item) for item_id, item in referable_items(stored)]
                if items
                else [],
            )

    async def sweep(self) -> None:
        await self._run(self._sweep)

    def _sweep(self) -> None:
        now = time.time()
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM responses WHERE expires_at < ?", (now,))
            # Each owner's oldest past the bound (design.md 9.1); of one second, the last written stays.
            db.execute(
                "DELETE FROM responses WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER "
                "(PARTITION BY owner ORDER BY created_at DESC, rowid DESC) AS n FROM responses) WHERE n > ?)",
                (self._max,),
            )
            db.execute(
                "DELETE FROM items WHERE expires_at < ? OR response_id NOT IN (SELECT id FROM responses)", (now,)
            )
            # Events go with their response, dropped past the bound or deleted (design.md 9.6).
            db.execute(
                "DELETE FROM events WHERE expires_at < ? OR response_id NOT IN (SELECT id FROM responses)", (now,)
            )
            db.execute("DELETE FROM conversations WHERE expires_at < ?", (now,))

    def _get(self, ids: list[str], owner: str) -> dict[str, StoredResponse]:
        marks = ",".join("?" * len(ids))
        rows = self._connection().execute(
            f"SELECT record FROM responses WHERE id IN ({marks}) AND owner = ? AND expires_at >= ?",
            (*ids, owner, time.time()),
        )
        found = [decode_stored(row[0]) for row in rows]
        return {stored.id: stored for stored in found}

    def _chain(self, id: str, owner: str) -> tuple[list[StoredResponse], str | None]:
        """One recursive statement along the links; the oldest row's link, when it has one, is
        the link that was not found."""
        now = time.time()
        rows = (
            self._connection()
            .execute(
                "WITH RECURSIVE chain (depth, previous, record) AS ("
                "SELECT 0, previous, record FROM responses WHERE id = ? AND owner = ? AND expires_at >= ? "
                "UNION ALL SELECT depth + 1, link.previous, link.record FROM chain "
                "JOIN responses AS link ON link.id = chain.previous WHERE link.owner = ? AND link.expires_at >= ?"
                ") SELECT previous, record FROM chain ORDER BY depth DESC",
                (id, owner, now, owner, now),
            )
            .fetchall()
        )
        if not rows:
            return [], id
        return [decode_stored(record) for _, record in rows], rows[0][0]

    def _recent(self, owner: str, after: str | None, limit: int) -> list[StoredResponse] | None:
        db, now = self._connection(), time.time()
        cursor = (2**63 - 1, "")
        if after is not None:
            found = db.execute(
                "SELECT created_at, id FROM responses WHERE id = ? AND owner = ? AND expires_at >= ?",
                (after, owner, now),
            ).fetchone()
            if found is None:
                return None
            cursor = found
        rows = db.execute(
            "SELECT record FROM responses WHERE owner = ? AND expires_at >= ? AND (created_at, id) < (?, ?) "
            "ORDER BY created_at DESC, id DESC LIMIT ?",
            (owner, now, *cursor, limit),
        )
        return [decode_stored(row[0]) for row in rows]

    def _conversation(self, id: str, owner: str) -> StoredConversation | None:
        found = (
            self._connection()
            .execute(
                "SELECT record FROM conversations WHERE id = ? AND owner = ? AND expires_at >= ?",
                (id, owner, time.time()),
            )
            .fetchone()
        )
        return None if found is None else decode_conversation(found[0])

    def _items(self, ids: list[str], owner: str) -> dict[str, bytes]:
        marks = ",".join("?" * len(ids))
        rows = self._connection().execute(
            f"SELECT id, item FROM items WHERE owner = ? AND id IN ({marks}) AND expires_at >= ?",
            (owner, *ids, time.time()),
        )
        return {item_id: bytes(item) for item_id, item in rows}

    def _delete(self, id: str, owner: str) -> bool:
        db = self._connection()
        with db:
            db.execute("BEGIN IMMEDIATE")
            deleted = db.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (id, owner)).rowcount
            if deleted:
                db.execute("DELETE FROM items WHERE response_id = ?", (id,))
                db.execute("DELETE FROM events WHERE response_id = ?", (id,))
        return deleted > 0

    def _put_file(self, file: StoredFile, content: bytes, max_files: int, max_bytes: int) -> str | None:
        db = self._connection()
        with db:  # the bounds read and the file written in one transaction
            db.execute("BEGIN IMMEDIATE")
            count, used = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM files WHERE owner = ?", (file.owner,)
            ).fetchone()
            if count >= max_files:
                return "files"
            if used + file.bytes > max_bytes:
                return "bytes"
            db.execute(
                "INSERT INTO files (id, owner, bytes, record, content) VALUES (?, ?, ?, ?, ?)",
                (file.id, file.owner, file.bytes, encode_file(file), content),
            )
        return None

    def _read(self, statement: str, values: tuple[object, ...]) -> bytes | None:
        found = self._connection().execute(statement, values).fetchone()
        return None if found is None else bytes(found[0])

    def _files(self, owner: str) -> list[StoredFile]:
        rows = self._connection().execute("SELECT record FROM files WHERE owner = ?", (owner,))
        return [decode_file(row[0]) for row in rows]

    def _write(self, statement: str, values: tuple[object, ...]) -> int:
        db = self._connection()
        with db:
            db.execute("BEGIN IMMEDIATE")
            return db.execute(statement, values).rowcount

    def _append(self, appends: list[tuple[str, list[Event], str]]) -> list[Exception | None]:
        """Each run's batch, unless its fencing token no longer holds the run's lease, or it
        holds an event kept already with other bytes: why each was refused, if it was. An event
        kept already as it is stays: a batch whose answer was lost goes again (design.md 10.2)."""
        db = self._connection()
        expires = time.time() + self._ttl
        refusals: list[Exception | None] = []
        with db:
            db.execute("BEGIN IMMEDIATE")
            for id, events, fence in appends:
                if not _holds(db, id, fence):
                    refusals.append(Fenced())
                    continue
                held = dict(
                    db.execute(
                        "SELECT seq, event FROM events WHERE response_id = ? AND seq BETWEEN ? AND ?",
                        (id, events[0][0], events[-1][0]),
                    )
                )
                clash = next((seq for seq, event in events if held.get(seq, event) != event), None)
                if clash is None:
                    db.executemany(
                        "INSERT OR IGNORE INTO events (response_id, seq, expires_at, event) VALUES (?, ?, ?, ?)",
                        [(id, seq, expires, event) for seq, event in events],
                    )
                refusals.append(
                    None if clash is None else ValueError(f"event {clash} of {id} is kept already, with other bytes")
                )
        return refusals

    def _events(self, id: str, after: int) -> list[Event]:
        rows = self._connection().execute(
            "SELECT seq, event FROM events WHERE response_id = ? AND seq > ? ORDER BY seq", (id, after)
        )
        return [(seq, bytes(event)) for seq, event in rows]

    def _renew(self, id: str, holder: str, lease: float) -> Renewal:
        held = (
            self._write(
                "UPDATE runs SET lease_until = ? WHERE response_id = ? AND holder = ?",
                (time.time() + lease, id, holder),
            )
            > 0
        )
        row = self._connection().execute("SELECT cancel FROM runs WHERE response_id = ?", (id,)).fetchone()
        return Renewal(held=held, cancel=bool(row and row[0]))

    def _claim(self, id: str, owner: str, holder: str, lease: float, caps: Runs) -> Claim:
        db = self._connection()
        now = time.time()
        with db:
            db.execute("BEGIN IMMEDIATE")
            total, mine = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(owner = ?), 0) FROM runs WHERE lease_until >= ?", (owner, now)
            ).fetchone()
            running = Runs(int(total), int(mine))
            if total >= caps.total or mine >= caps.mine:
                return Claim(taken=False, running=running)
            db.execute(
                "INSERT OR REPLACE INTO runs (response_id, owner, holder, lease_until) VALUES (?, ?, ?, ?)",
                (id, owner, holder, now + lease),
            )
        return Claim(taken=True, running=running)

    def _expired(self) -> list[tuple[str, str]]:
        return list(
            self._connection().execute("SELECT response_id, owner FROM runs WHERE lease_until < ?", (time.time(),))
        )

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

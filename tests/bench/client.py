"""A minimal HTTP/1.1 client on a raw asyncio protocol, so that the load client costs a few
microseconds per read (aiohttp's costs ~30 us, which made the load, not the proxy, the limit).

Keep-alive connections, Content-Length or chunked bodies, no redirects, no TLS. The body comes
to a callback once per socket read, as the decoded pieces that read completed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .upstream import no_delay

OnRead = Callable[[list[bytes]], None]

_SIZE, _DATA, _CRLF, _TRAILER, _FIXED = range(5)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future | None = None
        self.reusable = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        no_delay(transport)

    def connection_lost(self, exc) -> None:
        self.transport = None
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost mid-response: {exc!r}"))

    def send(self, request: bytes, on_read: OnRead) -> asyncio.Future:
        self.on_read = on_read
        self.head = b""
        self.status = 0
        self.state = -1  # reading the head
        self.buffer = b""
        self.remaining = 0
        self.reusable = False
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        if self.state < 0:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            data = self.head[end + 4 :]
            lines = self.head[:end].decode("latin-1").split("\r\n")
            self.status = int(lines[0].split(" ", 2)[1])
            headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
            self.reusable = headers.get("connection", "").lower() != "close"
            if headers.get("transfer-encoding", "").lower() == "chunked":
                self.state = _SIZE
            else:
                self.state = _FIXED
                self.remaining = int(headers.get("content-length", 0))
                if not self.remaining:
                    self._finish()
                    return
        pieces: list[bytes] = []
        if self.state == _FIXED:
            if data:
                pieces.append(data)
            self.remaining -= len(data)
            self.on_read(pieces)
            if self.remaining <= 0:
                self._finish()
            return
        ended = self._chunks(self.buffer + data if self.buffer else data, pieces)
        if pieces:
            self.on_read(pieces)
        if ended:
            self._finish()

    def _chunks(self, buf: bytes, pieces: list[bytes]) -> bool:
        """Decode what `buf` holds of a chunked body; True at its end."""
        pos, size = 0, len(buf)
        while pos < size:
            state = self.state
            if state == _DATA:
                take = min(self.remaining, size - pos)
                pieces.append(buf[pos : pos + take])
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self.state = _CRLF
            elif state == _CRLF:
                if size - pos < 2:
                    break
                pos += 2
                self.state = _SIZE
            else:  # a size line, or after the last chunk a trailer line (an empty one ends it)
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                line = buf[pos:eol]
                pos = eol + 2
                if state == _TRAILER:
                    if not line:
                        self.buffer = b""
                        return True
                    continue
                self.remaining = int(line.split(b";", 1)[0], 16)
                self.state = _DATA if self.remaining else _TRAILER
        self.buffer = buf[pos:]
        return False

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(self.status)


class Client:
    """Keep-alive connections to one host:port; `close()` closes the idle ones."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[_Connection] = []

    async def connect(self, count: int, batch: int = 100) -> None:
        """Open `count` connections ahead, into the idle pool."""
        loop = asyncio.get_running_loop()
        for start in range(0, count, batch):
            opened = await asyncio.gather(*(loop.create_connection(_Connection, self.host, self.port) for _ in range(min(batch, count - start))))
            self._idle += [connection for _, connection in opened]

    async def post(self, path: str, body: bytes, on_read: OnRead) -> int:
        """POST `body`; `on_read` gets the response body as it arrives; returns the status."""
        connection = None
        while self._idle:
            candidate = self._idle.pop()
            if candidate.transport is not None and not candidate.transport.is_closing():
                connection = candidate
                break
        if connection is None:
            _, connection = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        try:
            status = await connection.send(head.encode() + body, on_read)
        except BaseException:
            if connection.transport is not None:
                connection.transport.abort()
            raise
        if connection.reusable and connection.transport is not None:
            self._idle.append(connection)
        elif connection.transport is not None:
            connection.transport.close()
        return status

    def close(self) -> None:
        for connection in self._idle:
            if connection.transport is not None:
                connection.transport.close()
        self._idle.clear()

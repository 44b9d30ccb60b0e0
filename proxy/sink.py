"""What a transport hands a turn (design.md 2.3): the sink its Response's events go into. The
turn runs the Response whole; the sink is told when the first round's reply came, takes the
events of each upstream read, and says where its client stands."""

from __future__ import annotations

import enum
from typing import Protocol

from .errors import ClientLeft


class Client(enum.Enum):
    """Where a sink's client stands once its turn is cancelled, and so how the Response ends."""

    GONE = "gone"  # it left: the Response is cut short, not kept (9.2), but for an answer whole (8.10)
    WAITING = "waiting"  # it waits for the end (a background run's log): the Response ends `cancelled` (10.3)
    STOPPING = "stopping"  # the proxy stops under it: the Response ends `failed`, for another replica to retry


class Steered(ClientLeft):
    """Raised by a sink's write: its client steered the Response (design.md 8.14), which stops at
    this write's boundary, `incomplete`."""


class Sink(Protocol):
    async def opened(self, deadline: float | None) -> None:
        """The first round's reply came (its `deadline`, loop time, where its upstream sets a
        `total`): what the transport sends now is the Response, its status a 200 (an
        HTTP stream's headers leave with its first events, design.md 4.10)."""
        ...

    async def write(self, events: bytes) -> None:
        """The events of one upstream read, as SSE (the translator hands them out one by one,
        `flushed`, to a sink that sends or keeps them apart). Once the translator's `response` is
        final, it is kept before this write (design.md 9.2)."""
        ...

    @property
    def client(self) -> Client: ...

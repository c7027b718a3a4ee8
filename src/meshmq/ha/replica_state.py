"""What the replication mixins (``LeaderStreams``, ``FollowerSide``) read and call on
the node they are mixed into (``ReplicatedHa``): declared once, for the type checker."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshmq.config.model import HaConfig
from meshmq.ha.replica_files import Generations
from meshmq.ha.replica_peer import DrivenRole, Kind, Peer
from meshmq.ha.replication_policy import Position, RetainedLog, SendTimeEstimate
from meshmq.store.journal import JournalStore


class NodeState:
    # Provided by ReplicatedHa (meshmq.ha.replication).
    ha: HaConfig
    node_id: str
    witness: bool
    term: int
    voted_for: str | None
    amnesiac: bool
    kind: Kind
    leader_id: str | None
    followed: str | None
    leader_seen_ms: int | None
    _send_times: SendTimeEstimate
    _resigned_term: int | None
    journal: JournalStore | None
    last: Position
    durable: Position
    commit: int
    retained: RetainedLog | None
    generations: Generations
    snapshots_sent: int
    snapshots_installed: int
    _peers: dict[str, Peer]
    driven: DrivenRole | None
    _clock: Callable[[], int]
    _timer_base: int
    _elect_now: asyncio.Event
    _stop: asyncio.Event
    _snapshot: tuple[JournalStore, Path] | None
    _server_tls: ssl.SSLContext | None
    _tls_refused: set[tuple[str, str]]  # (address, why) of refused TLS handshakes, logged

    if TYPE_CHECKING:
        @property
        def deposed(self) -> bool: ...
        def _adopt_term(self, term: int) -> None: ...
        def _advance_commit(self) -> None: ...
        def _save_state(self) -> None: ...
        def _open_journal(self, path: Path) -> JournalStore: ...
        def _spawn(self, coro: Any) -> None: ...
        def _tls_failed(self, peer: str, direction: str, exc: BaseException) -> None: ...

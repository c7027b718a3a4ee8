"""Which shard of a node owns a destination: pure, stable across processes and boots.

A node with N shards gives every destination exactly one owning shard (docs/design.md,
"Shards"). The owner is Lamping and Veach's jump consistent hash of the first 8 bytes
(big-endian) of BLAKE2b over the destination's canonical URI in UTF-8
(``queue://orders.eu``). Python's ``hash()`` is salted per process, so it cannot be used;
jump hash moves only about 1/(N+1) of the destinations, all to the new shard, when N
grows by one. The function is part of the store format: its name (``HASH_NAME``) is
written to ``shards.json`` and a golden table in the tests pins it.

A node may instead place **numbered families** side by side (``[shards] placement =
"numbered"``, recorded as ``NUMBERED_NAME``): a name that ends in a number of up to nine
ASCII digits (``orders.7``, ``sensors/12``) belongs to the family of the name without
them, and its owner is the family's hash plus the number, modulo the shard count. So
``orders.0`` to ``orders.15`` on sixteen shards get one shard each, where a hash of each
name leaves some shards two or three and others none. Every other name is hashed as
above. The price: when the shard count changes, most of a family's members change owner
(a rebalance moves more), where the hash moves about 1/(N+1).

Exceptions to the hash:

* a temporary destination lives on the shard of the connection that created it, and its
  name says which (``ID:<node>-s<k>-<boot>-<conn>:<n>``); one the node did not name
  (adopted from a network peer) lives on the front shard, 0, which holds the node's
  network links;
* broker records keyed by a client id (MQTT sessions, client-id claims, wildcard durable
  subscriptions) go by ``client://<client id>`` (``client_owner``);
* an advisory topic about one destination (``ActiveMQ.Advisory.Consumer.Queue.X``) is
  owned by that destination's owner, which sees every consumer and producer of it and
  raises its advisories; one about no destination (``ActiveMQ.Advisory.Connection``,
  ``.TempQueue``, ...) is raised by each shard for what it holds, so a subscription to
  it is run by every shard, as a wildcard's is (``fans_in``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from meshmq.core.destinations import Destination, DestKind
from meshmq.errors import ConfigError

HASH_NAME = "jump-blake2b-1"
NUMBERED_NAME = "jump-blake2b-numbered-1"
# ``[shards] placement`` words and the scheme each records in a store's layout.
PLACEMENTS: dict[str, str] = {"hash": HASH_NAME, "numbered": NUMBERED_NAME}
SCHEMES = frozenset(PLACEMENTS.values())
_WORDS = {scheme: word for word, scheme in PLACEMENTS.items()}
_NUMBER_DIGITS = 9  # a longer trailing number is a name's part, not a member number
_ASCII_DIGITS = frozenset("0123456789")
FRONT_SHARD = 0
MAX_SHARDS = 256

ADVISORY_PREFIX = "ActiveMQ.Advisory."
# The destination types an advisory topic names (core/advisories.py ``TYPE_NAMES``).
_ADVISED_KINDS = {"Queue": DestKind.QUEUE, "Topic": DestKind.TOPIC,
                  "TempQueue": DestKind.TEMP_QUEUE, "TempTopic": DestKind.TEMP_TOPIC}

_JUMP_MULTIPLIER = 2862933555777941757
_MASK64 = (1 << 64) - 1


def jump_hash(key: int, buckets: int) -> int:
    """Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014):
    the bucket in ``range(buckets)`` for a 64-bit ``key``."""
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, not {buckets}")
    key &= _MASK64
    bucket, candidate = -1, 0
    while candidate < buckets:
        bucket = candidate
        key = (key * _JUMP_MULTIPLIER + 1) & _MASK64
        candidate = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def key_of(text: str) -> int:
    """The 64-bit key of a canonical name: BLAKE2b's first 8 bytes, big-endian."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def canonical(dest: Destination) -> str:
    return f"{dest.kind.value}://{dest.name}"


def placement_word(scheme: str) -> str:
    """The ``[shards] placement`` word of a recorded scheme name (``"hash"`` for
    ``HASH_NAME``); the name itself when this meshmq does not know it."""
    return _WORDS.get(scheme, scheme)


def unknown_scheme(where: object, scheme: str) -> str:
    """The one-line refusal of a layout recorded (at ``where``) with a scheme this
    meshmq does not know."""
    known = ", ".join(repr(s) for s in PLACEMENTS.values())
    return (f"{where} was made with shard hash {scheme!r}, which this meshmq does not "
            f"know (it knows {known}): run the meshmq version that made it")


def numbered_member(name: str) -> tuple[str, int] | None:
    """``(family, number)`` of a name ending in 1 to 9 ASCII digits, else None."""
    end = len(name)
    start = end
    while start > 0 and name[start - 1] in _ASCII_DIGITS:
        start -= 1
    if start == end or end - start > _NUMBER_DIGITS:
        return None
    return name[:start], int(name[start:])


def owner(dest: Destination, count: int, *, node: str = "",
          placement: str = HASH_NAME) -> int:
    """The shard in ``range(count)`` that owns ``dest`` on node ``node`` under the
    placement scheme ``placement`` (``HASH_NAME`` or ``NUMBERED_NAME``).

    Wildcards are subscriptions, not destinations, and have no owner (``ValueError``):
    their interest goes to every shard."""
    if count == 1:
        return 0
    if dest.is_wildcard:
        raise ValueError(f"a wildcard has no owning shard: {canonical(dest)}")
    if dest.is_advisory:
        subject = advisory_subject(dest)
        if subject is not None:
            return owner(subject, count, node=node, placement=placement)
    if dest.is_temporary:
        shard = temp_shard(dest.name, node)
        if shard is None or shard >= count:
            return FRONT_SHARD
        return shard
    if placement == NUMBERED_NAME:
        member = numbered_member(dest.name)
        if member is not None:
            family, number = member
            base = jump_hash(key_of(f"{dest.kind.value}://{family}"), count)
            return (base + number) % count
    return jump_hash(key_of(canonical(dest)), count)


def advisory_subject(dest: Destination) -> Destination | None:
    """The destination an advisory topic is about (``ActiveMQ.Advisory.<Kind>.<Type>.
    <name>``: ``Consumer.Queue.orders`` is about ``queue://orders``), or None for one
    about no destination (``ActiveMQ.Advisory.Connection``, ``.TempQueue``) and for any
    other topic."""
    if not dest.is_advisory:
        return None
    _kind, dot, rest = dest.name[len(ADVISORY_PREFIX):].partition(".")
    type_name, dot2, name = rest.partition(".")
    kind = _ADVISED_KINDS.get(type_name)
    if not dot or not dot2 or kind is None or not name:
        return None
    return Destination(kind, name)


def fans_in(dest: Destination) -> bool:
    """An advisory topic about no destination: each shard raises it for what it holds
    (its connections, its temporary destinations, shard 0's bridges), so a subscription
    to it runs on every shard, as a wildcard's does."""
    return dest.is_advisory and not dest.is_wildcard and advisory_subject(dest) is None


def client_owner(client_id: str, count: int) -> int:
    """The shard that arbitrates client id ``client_id`` and keeps its session."""
    if count == 1:
        return 0
    return jump_hash(key_of(f"client://{client_id}"), count)


def temp_name(node: str, shard: int, boot: str, connection_id: str, seq: int) -> str:
    """The name of a temporary destination created on ``shard`` of ``node``."""
    return f"ID:{node}-s{shard}-{boot}-{connection_id}:{seq}"


_SHARD_PREFIX = re.compile(r"s(\d{1,3})-")


def temp_shard(name: str, node: str) -> int | None:
    """The shard named in a temporary destination's name, or ``None`` when ``node``
    did not name it (another broker's, or one named before the node had shards)."""
    prefix = f"ID:{node}-"
    if not name.startswith(prefix):
        return None
    match = _SHARD_PREFIX.match(name, len(prefix))
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class ShardIdentity:
    """What one shard process is told by its node's supervisor.

    ``run_dir`` holds the shards' link and management Unix sockets (mode 0700);
    ``token`` is the per-boot secret the shards' link HELLOs carry instead of a
    user's password; ``placement`` the scheme the node's stores are laid out by."""

    index: int
    count: int
    node: str
    run_dir: str
    token: str
    placement: str = HASH_NAME

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise ConfigError(f"shards must be between 1 and {MAX_SHARDS}, not {self.count}")
        if not 0 <= self.index < self.count:
            raise ConfigError(f"shard index {self.index} is outside 0..{self.count - 1}")
        if self.placement not in SCHEMES:
            raise ConfigError(f"unknown shard placement scheme {self.placement!r}")

    @property
    def is_front(self) -> bool:
        return self.index == FRONT_SHARD

    @property
    def label(self) -> str:
        """The shard's name on links and in logs: ``<node>#<k>``."""
        return f"{self.node}#{self.index}"

    def owner(self, dest: Destination) -> int:
        return owner(dest, self.count, node=self.node, placement=self.placement)

    def owns(self, dest: Destination) -> bool:
        return self.owner(dest) == self.index

    def link_socket(self, index: int) -> str:
        """The Unix socket on which shard ``index`` accepts its peers' links."""
        return f"{self.run_dir}/shard-{index}.sock"

    def handoff_socket(self, index: int) -> str:
        """The Unix socket on which shard ``index`` takes client connections handed to it
        by the other shards (transport/handoff.py)."""
        return f"{self.run_dir}/shard-{index}.handoff.sock"

    def management_socket(self, index: int) -> str:
        return f"{self.run_dir}/shard-{index}.mgmt.sock"

"""The typed configuration model. Every option and its default lives here and in
``docs/config.md`` (kept in step by ``tests/unit/test_config_docs.py``).

Objects are frozen: the loaders build them once, validated, and the running
broker only reads them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

KIB = 1024
MIB = 1024 * 1024

LISTENER_PROTOCOLS = ("stomp", "stomp+ssl", "mqtt", "mqtt+ssl", "ws", "wss", "tcp", "ssl",
                      "nio")
STORE_KINDS = ("journal", "memory", "postgres")
HA_MODES = ("none", "shared", "database", "replicated")
# How a node of shards places destinations (core/shards.py, docs/shards.md "Placement").
SHARD_PLACEMENTS = ("hash", "numbered")
HA_ROLES = ("broker", "witness")
TRACE_FORMATS = ("jsonl", "parquet")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")
LIMIT_ACTIONS = ("block", "fail")
# TLS client certificates on a listener (ActiveMQ wantClientAuth / needClientAuth).
CLIENT_AUTH = ("none", "want", "need")
# [broker] shards = "auto": one shard per CPU (os.cpu_count()).
SHARDS_AUTO = "auto"


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """One transport connector, e.g. ``stomp://127.0.0.1:61613``."""

    name: str = "stomp"
    protocol: str = "stomp"  # one of LISTENER_PROTOCOLS
    host: str = "127.0.0.1"
    port: int = 61613  # 0 = let the OS choose (tests)
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_cafile: Path | None = None
    # Client certificates: "need" (refused without one that ssl_cafile verifies), "want"
    # (verified when given), "none". Unset: "need" when ssl_cafile is set, else "none".
    client_auth: str | None = None
    # OpenSSL cipher list for TLS listeners (TLS 1.2 is the minimum); None: Python's.
    ssl_ciphers: str | None = None
    # tcp/ssl/nio listeners: admit broker links that present neither a configured user
    # nor a verified client certificate. Anyone who reaches the port can then read and
    # write every destination; a WARNING says so at every start.
    allow_anonymous_links: bool = False
    max_connections: int = 1000
    # Advertise this listener on a discovery group (ActiveMQ transportConnector
    # discoveryUri, e.g. "multicast://default"); tcp/ssl/nio listeners only.
    discovery_uri: str | None = None
    # Topology push to this listener's clients (ActiveMQ updateClusterClients): tell
    # them the client URIs of peer brokers (meshmq-peers). Off, as in ActiveMQ: a
    # client's failover list is the operator's.
    update_cluster_clients: bool = False


@dataclass(frozen=True, slots=True)
class StompConfig:
    """STOMP codec limits and timing. Sizes in bytes, times in milliseconds."""

    max_frame_size: int = 100 * MIB  # ActiveMQ wireFormat.maxDataLength
    max_headers: int = 1000
    max_header_size: int = 64 * KIB  # whole header block, command line included
    frame_timeout_ms: int = 30_000  # a started frame must complete within this
    connect_timeout_ms: int = 30_000  # CONNECT must arrive within this after accept
    heartbeat_grace: float = 1.5  # close a silent client after interval * grace
    max_heartbeat_ms: int = 0  # 0: accept whatever the client proposes
    server_heartbeat_ms: int = 1000  # our fastest beat; the client's wish decides above it
    # heart-beat assumed for a CONNECT without one (ActiveMQ transport.defaultHeartBeat)
    default_heartbeat: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class MqttConfig:
    """MQTT 3.1.1/5 limits and timing. Sizes in bytes, times in milliseconds."""

    max_packet_size: int = 100 * MIB  # largest packet accepted (announced to v5 clients)
    receive_maximum: int = 1024  # inbound QoS 1/2 publishes a client may have unacked
    max_inflight: int = 1024  # outbound QoS 1/2 unacked per client (v5 clients may ask less)
    keepalive_grace: float = 1.5  # close a client silent for keep-alive x this
    connect_timeout_ms: int = 30_000  # CONNECT must arrive within this after accept
    max_session_expiry_s: int = 0xFFFFFFFF  # cap on a v5 session expiry interval
    sys_interval_ms: int = 10_000  # how often $SYS/broker/... topics are published; 0 = off
    retain_available: bool = True
    # Longest keep-alive a client may use; a v5 client asking more (or 0) is told this
    # one in CONNACK (Server Keep Alive) and held to it. 0 = the client's own.
    max_keep_alive_s: int = 0
    # Topic aliases towards MQTT 5 clients that announce a Topic Alias Maximum (a bounded
    # least-recently-used map per connection).
    outbound_topic_aliases: bool = True


@dataclass(frozen=True, slots=True)
class StoreConfig:
    kind: str = "journal"  # one of STORE_KINDS
    directory: Path | None = None  # default: <data_directory>/journal
    segment_size: int = 32 * MIB
    fsync: bool = True  # False trades crash safety for speed (tests, benchmarks)
    max_batch_bytes: int = 4 * MIB  # cap on one group-commit write
    compact_live_ratio: float = 0.5  # rewrite the oldest segment once it is less live
    # Start even when recovery must drop journal data that damage made unreadable (the
    # damaged file is kept aside); `meshmq broker --accept-data-loss` sets it for one start.
    accept_data_loss: bool = False
    # Journal size at which persistent messages are refused (ActiveMQ's storeUsage
    # limit); 0 = no limit.
    max_disk_bytes: int = 0
    # Free space on the journal's filesystem below which persistent messages are refused.
    min_free_disk: int = 8 * MIB
    # Space held in a file and given back when the disk fills, so acknowledgements can
    # still be written (they free space); 0 = none.
    disk_reserve: int = 4 * MIB
    dsn: str | None = None  # kind = "postgres": libpq connection string
    table_prefix: str = "meshmq_"  # kind = "postgres": prefix of the store's tables


@dataclass(frozen=True, slots=True)
class DestinationPolicy:
    """Policy applied to destinations whose name matches ``match``.

    ``match`` is a destination URI with wildcards, e.g. ``queue://>`` or
    ``topic://prices.*``. The first matching policy wins.
    """

    match: str = "queue://>"
    max_redeliveries: int = 6  # deliveries beyond 1 + this go to the DLQ
    dead_letter_queue: str = "ActiveMQ.DLQ"
    individual_dlq_prefix: str | None = None  # e.g. "DLQ." -> DLQ.<queue name>
    expired_to_dlq: bool = True  # persistent messages that expire are dead-lettered
    non_persistent_to_dlq: bool = True  # ActiveMQ default is false (silent drop)
    queue_prefetch: int = 1000
    topic_prefetch: int = 32767
    durable_topic_prefetch: int = 100
    browser_prefetch: int = 500
    memory_limit: int = 0  # per destination, bytes; 0 = only the broker-wide limit
    page_size: int = 2000  # persistent messages kept in memory per queue before paging
    prioritized_messages: bool = False  # dispatch by message priority (strict order otherwise)
    producer_flow_control: bool = True  # False: never block producers here; page to the store


@dataclass(frozen=True, slots=True)
class StreamPolicy:
    """Queues whose name matches ``match`` are streams: append-only logs read from any
    offset (docs/pipeline.md). The first matching policy wins."""

    match: str = "queue://stream.>"
    max_bytes: int = 1024 * MIB  # retention by size (bodies); 0 = no limit
    max_age_ms: int = 0  # retention by age; 0 = no limit


@dataclass(frozen=True, slots=True)
class UsageConfig:
    memory_limit: int = 64 * MIB  # in-memory message bytes, broker-wide
    on_limit: str = "block"  # "block": producer flow control; "fail": ERROR to the sender
    block_timeout_ms: int = 0  # with "block": fail the send after this long; 0 = wait forever


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password: str  # a `meshmq passwd` hash (scrypt$...), or clear text (warned about)
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CertificateUser:
    """A TLS client certificate that authenticates as ``name``: its subject DN (Java
    form, ``CN=bob, OU=clients, O=meshmq``) equals ``dn`` or fully matches ``dn_regex``."""

    name: str
    dn: str | None = None
    dn_regex: str | None = None
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AuthorizationRights:
    """Groups holding each right (ActiveMQ's default and temp-destination entries);
    the group "*" means everybody."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    admin: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AuthorizationEntry:
    """The rights on the queues or topics a pattern covers (``>`` and ``*``
    wildcards; ``orders.>`` covers ``orders`` too). Exactly one of queue/topic."""

    queue: str | None = None
    topic: str | None = None
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    admin: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AuthorizationConfig:
    """ActiveMQ's authorization map (docs/security.md): rights add up over every
    matching entry plus ``default``; what no entry grants is denied."""

    entries: tuple[AuthorizationEntry, ...] = ()
    default: AuthorizationRights | None = None  # always added to the matching entries
    temp: AuthorizationRights | None = None  # temporary destinations; unset: open to all


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Authentication (rule in ``core/auth.py`` and docs/config.md ``[auth]``)."""

    anonymous_access: bool = True
    users: tuple[User, ...] = ()
    anonymous_user: str = "anonymous"
    anonymous_groups: tuple[str, ...] = ("anonymous",)
    # ActiveMQ PropertiesLoginModule files: user=password and group=user1,user2.
    users_file: Path | None = None
    groups_file: Path | None = None
    # Certificate authentication (TextFileCertificateLoginModule files: user=DN or
    # user=/regex/, and group=user1,user2), besides or instead of certificate_users.
    certificate_users: tuple[CertificateUser, ...] = ()
    certificate_users_file: Path | None = None
    certificate_groups_file: Path | None = None
    reload_files: bool = False  # re-read the files above when they change
    # Refusals of a client address's failed logins after this many are delayed,
    # doubling from 0.5 s up to login_backoff_max_ms (0 = never delayed).
    login_backoff_after: int = 3
    login_backoff_max_ms: int = 5000

    @property
    def has_users(self) -> bool:
        """Users to check passwords against (inline or in a users file)."""
        return bool(self.users) or self.users_file is not None
    # Rights per destination; unset: every connected client may do everything.
    authorization: AuthorizationConfig | None = None


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """``GET /metrics`` (Prometheus): which destinations get series of their own, so a
    broker with many destinations does not flood the monitoring system."""

    # Destination name patterns (the broker's wildcards: ``*`` one segment, ``>`` the
    # rest); empty = every destination.
    destinations: tuple[str, ...] = ()
    # Destinations beyond this many (in name order) are summed into destination="_other".
    max_destinations: int = 500


@dataclass(frozen=True, slots=True)
class ManagementConfig:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8161  # 0 = let the OS choose
    # Port in use: take the next free one (up to 20 above) and log it, instead of
    # refusing to start. On for brokers configured from activemq.xml, which names no
    # management port (so several of them start on one host).
    next_free_port: bool = False
    # Off loopback every request needs HTTP Basic credentials of an [[auth.users]] user;
    # operations that change the broker also need this group.
    admin_group: str = "admins"
    ssl_certfile: Path | None = None  # set: HTTPS only (TLS 1.2 or later)
    ssl_keyfile: Path | None = None  # unset: the key is in ssl_certfile
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    @property
    def loopback(self) -> bool:
        """Bound to a loopback address only (reachable from this host alone)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False  # a host name: it may resolve to any interface


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """Message trace files (docs/pipeline.md): off by default."""

    enabled: bool = False
    directory: Path | None = None  # default: <data_directory>/trace
    format: str = "jsonl"  # one of TRACE_FORMATS; parquet needs the spark extra (pyarrow)
    sample_rate: float = 1.0  # fraction of messages traced, chosen by message id
    max_file_bytes: int = 64 * MIB  # roll a file at this size
    roll_interval_ms: int = 60_000  # ... or at this age; 0 = by size only
    flush_interval_ms: int = 500  # JSON lines reach the OS at least this often
    max_files: int = 0  # sealed files kept per broker; 0 = keep all
    # A flushed heartbeat event this often bounds when a crashed broker died; 0 = none.
    heartbeat_interval_ms: int = 1000
    # Flush the trace before a traced message is confirmed to anyone (deliveries,
    # receipts, bridge acks): nothing confirmed is missing after a crash. JSON lines only.
    exact: bool = False


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """The broker's log (``meshmq broker``): levels, and a rotating file instead of
    stderr. ``--log-level`` on the command line wins over ``level``."""

    level: str = "info"  # one of LOG_LEVELS
    loggers: dict[str, str] = field(default_factory=dict)  # logger name -> level
    file: Path | None = None  # unset: stderr
    max_file_bytes: int = 10 * MIB  # rotate the file at this size; 0 = never
    backup_count: int = 5  # rotated files kept (file.1 ... file.N)
    format: str = "text"  # one of LOG_FORMATS: human-readable lines, or JSON lines


@dataclass(frozen=True, slots=True)
class NetworkConnectorConfig:
    """One network connector (ActiveMQ <networkConnector>): bridges from this broker to
    the brokers its URI names or discovers. Times in milliseconds; ActiveMQ's property
    names in snake_case, with ActiveMQ's defaults (5.19 code, not the older docs)."""

    uri: str  # static:(...), masterslave:(...), multicast://..., or one tcp:// URI
    name: str = "NC"
    username: str | None = None
    password: str | None = None
    # ssl:// targets: CA bundle the remote's certificate is verified against (None: the
    # system trust store), this broker's certificate/key for mutual TLS, host name check.
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    verify_hostname: bool = True
    ssl_ciphers: str | None = None
    duplex: bool = False
    conduit_subscriptions: bool = True
    network_ttl: int = 1
    message_ttl: int | None = None  # None: network_ttl
    consumer_ttl: int | None = None  # None: network_ttl
    decrease_network_consumer_priority: bool = True
    consumer_priority_base: int = -5
    prefetch_size: int = 1000
    always_sync_send: bool = True
    suppress_duplicate_queue_subscriptions: bool = False
    suppress_duplicate_topic_subscriptions: bool = True
    excluded_destinations: tuple[str, ...] = ()  # destination URIs, wildcards allowed
    dynamically_included_destinations: tuple[str, ...] = ()
    statically_included_destinations: tuple[str, ...] = ()
    static_bridge: bool = False
    bridge_temp_destinations: bool = True
    dynamic_only: bool = False
    # Stuck messages: send queue messages back towards a broker on their path when this
    # broker has no consumer for them (ActiveMQ conditionalNetworkBridgeFilterFactory).
    replay_when_no_consumers: bool = False
    replay_delay_ms: int = 0
    selector_aware: bool = False
    # meshmq's redistribution (on by default): a queue message that has sat here
    # redistribution_delay_ms with no local consumer able to take it moves to a broker
    # with a consumer, its path included, but never straight back while it is moving.
    redistribution: bool = True
    redistribution_delay_ms: int = 1000
    rate_limit: int = 0  # messages per rate_duration_ms to the network; 0 = unlimited
    rate_duration_ms: int = 1000
    # Reconnect policy of each bridge (ActiveMQ SimpleDiscoveryAgent's options).
    initial_reconnect_delay_ms: int = 1000
    max_reconnect_delay_ms: int = 30_000
    use_exponential_backoff: bool = True
    backoff_multiplier: float = 2.0
    max_reconnect_attempts: int = -1  # -1: for ever, 0: no reconnect, N: N passes
    min_connect_time_ms: int = 5000  # a link up this long resets the backoff
    handshake_timeout_ms: int = 10_000
    heartbeat_ms: int = 5000  # link keep-alive; silent for 3 intervals = dead
    interest_resync_ms: int = 30_000  # full interest resync (heals lost updates)
    auto_start: bool = True


@dataclass(frozen=True, slots=True)
class HaConfig:
    """Master/slave high availability (docs/ha.md). Times in milliseconds."""

    mode: str = "none"  # one of HA_MODES: "shared" = lease file in the store directory,
    #                     "database" = lease row next to a postgres store
    lease_ms: int = 5000  # a lease not renewed for this long may be taken over
    keepalive_ms: int = 1000  # how often the master renews its lease
    acquire_interval_ms: int = 100  # how often a slave looks at the lease
    holder_id: str | None = None  # unique per broker; default <name>@<host>:<pid>:<random>
    restart_when_deposed: bool = True  # a master that lost its lease becomes a slave again
    # Mode "replicated" (docs/ha.md): each broker keeps its own journal; the master
    # streams every write batch to the others and needs a majority for writes and takeover.
    role: str = "broker"  # one of HA_ROLES: "witness" only votes and stores no messages
    listen: str = ""  # this node's replication address HOST:PORT
    members: tuple[str, ...] = ()  # the other nodes' replication addresses HOST:PORT
    node_id: str | None = None  # unique per node; default <broker name>@<listen>
    can_be_master: bool = True  # False: keeps a copy and votes, never takes over
    user: str | None = None  # credentials every replication link presents and checks
    password: str | None = None
    # TLS on replication links (and to the witness): every node is server and client
    # with this certificate; peers are verified against ssl_cafile (mutual TLS).
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_cafile: Path | None = None
    verify_hostname: bool = True
    ssl_ciphers: str | None = None
    synchronous: bool = True  # confirm a write once a majority has it on disk
    log_retain_bytes: int = 64 * 1024 * 1024  # batches kept in memory for catch-up
    # Set by the activemq.xml importer when the mode comes only from a <kahaDB>'s lock
    # (every ActiveMQ broker has one): the broker logs no master/slave role lines until
    # another broker shares its store. Not a TOML option.
    implicit: bool = False


@dataclass(frozen=True, slots=True)
class ShardsConfig:
    """``[shards]``: how the shards of a node (``[broker] shards`` > 1) treat each other."""

    # How long sends to a destination whose owning shard is unreachable are held (their
    # receipts wait) before they fail and new ones are refused, retriably, until it is
    # back: long enough for a restarted shard to come back, short enough that producers
    # learn of a shard that does not.
    owner_wait_ms: int = 10_000
    # Hand a plain-TCP STOMP connection to the shard that owns the destination of its
    # first SEND or SUBSCRIBE (transport/handoff.py), so its messages do not cross shards.
    handoff: bool = True
    # "hash": each destination by a hash of its name; "numbered": names ending in a
    # number (orders.0, orders.1, ...) side by side on consecutive shards. Part of the
    # stores' layout: changing it on a node with stored messages needs a rebalance.
    placement: str = "hash"


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    broker_name: str = "localhost"
    data_directory: Path = Path("data")
    persistent: bool = True  # False: memory store, nothing written to disk
    advisory_support: bool = True
    listeners: tuple[ListenerConfig, ...] = (
        ListenerConfig(),
        ListenerConfig(name="mqtt", protocol="mqtt", port=1883),
    )
    stomp: StompConfig = field(default_factory=StompConfig)
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    policies: tuple[DestinationPolicy, ...] = (
        DestinationPolicy(match="queue://>"),
        DestinationPolicy(match="topic://>"),
    )
    usage: UsageConfig = field(default_factory=UsageConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    management: ManagementConfig = field(default_factory=ManagementConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    streams: tuple[StreamPolicy, ...] = ()  # none: no queue is a stream
    ha: HaConfig = field(default_factory=HaConfig)
    expiry_check_interval_ms: int = 1000
    duplicate_window: int = 10_000  # idempotent-producer window (message ids remembered)
    # Subscriptions one client connection may hold at once; 0 = no limit.
    max_subscriptions_per_connection: int = 100_000
    network_connectors: tuple[NetworkConnectorConfig, ...] = ()
    network_connector_start_async: bool = False
    # Client URIs of peer brokers told to connecting clients (topology push), comma
    # separated: "stomp://b:61613,mqtt://b:1883". Network connectors and HA add theirs.
    advertised_peers: str = ""
    # Master switch for the topology push; the push itself is per listener
    # (ListenerConfig.update_cluster_clients, off by default).
    push_topology: bool = True
    # Shard processes of this node (docs/shards.md): 1 = one broker process, as always;
    # N > 1 = a supervisor and N shards on the same ports. The loaders resolve "auto".
    shards: int = 1
    sharding: ShardsConfig = field(default_factory=ShardsConfig)  # TOML [shards]
    source: str | None = None  # file this config came from, for messages

    @property
    def advertised_peer_list(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.advertised_peers.split(",") if p.strip())

    @property
    def store_directory(self) -> Path:
        return self.store.directory or (self.data_directory / "journal")

    @property
    def trace_directory(self) -> Path:
        return self.trace.directory or (self.data_directory / "trace")


def parse_shards(value: object, max_shards: int, cpus: int | None) -> int:
    """``[broker] shards`` / ``--shards``: a count in 1..max_shards, or ``"auto"`` (one
    per CPU, at most ``max_shards``). ``ValueError`` says what is accepted."""
    if value == SHARDS_AUTO:
        return max(1, min(cpus or 1, max_shards))
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= max_shards:
        return value
    raise ValueError(f"must be a number of shards from 1 to {max_shards} or \"auto\" "
                     f"(one per CPU), got {value!r}")


def sharding_conflict(config: BrokerConfig) -> tuple[str, str] | None:
    """Why ``config.shards > 1`` cannot run as configured, and the option to change."""
    if config.shards == 1:
        return None
    if config.ha.mode == "replicated":
        # (A witness with shards > 1 witnesses each shard's stream: node/witness.py.)
        # Shard k streams on the port after each node's ha.listen plus k (docs/ha.md).
        ports = [addr.rpartition(":")[2] for addr in (config.ha.listen, *config.ha.members)]
        if any(p.isdigit() and int(p) + config.shards > 65535 for p in ports):
            return (f"a node of {config.shards} shards listens on the {config.shards} "
                    "ports after ha.listen (and reaches its members' likewise): choose "
                    "replication ports at most 65535 - shards", "ha.listen")
        return None
    postgres = config.persistent and config.store.kind == "postgres"
    if config.ha.mode == "database" and not postgres:
        return ("a node's database master/slave fences each shard's PostgreSQL tables: "
                "set store.kind = \"postgres\" (and store.dsn), or ha.mode = \"shared\"",
                "store.kind")
    if config.ha.mode == "shared" and postgres:
        return ("a node on the postgres store takes its lease in the database: set "
                "ha.mode = \"database\", or store.kind = \"journal\"", "ha.mode")
    if config.ha.mode not in ("none", "shared", "database", "replicated"):
        return (f"master/slave (ha.mode = {config.ha.mode!r}) does not run with shards: "
                "set shards = 1, or ha.mode = \"shared\" or \"database\"", "ha.mode")
    return None


def management_exposure(config: BrokerConfig) -> str | None:
    """Why the management endpoint must not start as configured, or None.

    Off loopback it is reachable from the network, so it needs users to check
    credentials against (there is no anonymous management access off loopback)."""
    mgmt = config.management
    if not mgmt.enabled or mgmt.loopback or config.auth.has_users:
        return None
    return (f"management.host {mgmt.host!r} is not a loopback address and no users are "
            "configured, so the management endpoint would be open to the network: add "
            "[[auth.users]] (requests then need HTTP Basic credentials of one of them; "
            f"changes need group {mgmt.admin_group!r}, management.admin_group), or set "
            "management.host = \"127.0.0.1\"")

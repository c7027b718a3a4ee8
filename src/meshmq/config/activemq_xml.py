"""Import an ActiveMQ ``activemq.xml`` into the meshmq model.

The file is parsed with expat so every element keeps its line. Spring wrapping
(``<beans>``, placeholder configurers, ``<import>``) is skipped: the importer
finds the one ``<broker>`` element wherever it sits, ignoring namespaces.

What is read is translated into the raw shape of a TOML file and handed to
``toml_loader.build_config``, so both formats are validated by the same code.
Anything under ``<broker>`` is one of: supported (mapped), known but ignored
(WARNING on the ``meshmq.config`` logger naming file:line), a later feature
(WARNING "not supported yet, ignored") or unknown (``ConfigError``). Nothing is
dropped silently.

Placeholders: ``${activemq.base}``, ``${activemq.home}`` and ``${activemq.conf}``
are the directory of the file, ``${activemq.data}`` is its ``data``
subdirectory; properties files named by a Spring ``PropertyPlaceholderConfigurer``
are read when they exist; ``properties`` passed by the caller win over both.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
import urllib.parse
import xml.parsers.expat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from meshmq.config import jaas
from meshmq.config.model import BrokerConfig
from meshmq.config.toml_loader import Source, build_config, split_listener_url
from meshmq.core.destinations import name_matches
from meshmq.errors import ConfigError

__all__ = ["load_activemq_xml", "loads_activemq_xml"]

log = logging.getLogger("meshmq.config")

# ActiveMQ's maximumRedeliveries="-1" (never give up); the model counts, so use "forever".
UNLIMITED_REDELIVERIES = 2**31 - 1

# ActiveMQ scheme -> meshmq protocol. nio is only Java's I/O flavour of tcp.
_SCHEMES = {
    "stomp": "stomp", "stomp+nio": "stomp",
    "stomp+ssl": "stomp+ssl", "stomp+nio+ssl": "stomp+ssl",
    "tcp": "tcp", "nio": "tcp",
    "ssl": "ssl", "nio+ssl": "ssl",
    "mqtt": "mqtt", "mqtt+nio": "mqtt", "mqtt+ssl": "mqtt+ssl", "mqtt+nio+ssl": "mqtt+ssl",
    "ws": "ws", "wss": "wss",
}
_LATER_SCHEMES = frozenset({"amqp", "auto", "http", "https", "udp", "vm", "multicast",
                            "xmpp"})
_STOMP_URI_OPTIONS = {
    "wireFormat.maxFrameSize": "max_frame_size",
    "wireFormat.maxDataLength": "max_frame_size",
    "transport.defaultHeartBeat": "default_heartbeat",
    "transport.hbGracePeriodMultiplier": "heartbeat_grace",
}

_BROKER_IGNORED = frozenset({
    "useJmx", "schedulerSupport", "useShutdownHook", "start", "enableStatistics",
    "populateJMSXUserID", "useAuthenticatedPrincipalForJMSXUserID",
    "offlineDurableSubscriberTimeout", "offlineDurableSubscriberTaskSchedule",
    "schedulePeriodForDestinationPurge", "maxPurgedDestinationsPerSweep", "useVirtualTopics",
    "useMirroredQueues", "useTempMirroredQueues", "deleteAllMessagesOnStartup",
    "restartAllowed", "brokerId", "tmpDataDirectory", "schedulerDirectory",
    "useLocalHostBrokerName", "cacheTempDestinations", "timeBeforePurgeTempDestinations",
    "splitSystemUsageForProducersConsumers", "producerSystemUsagePortion",
    "consumerSystemUsagePortion", "dedicatedTaskRunner",
    "allowTempAutoCreationOnSend", "keepDurableSubsActive", "systemExitOnShutdown",
    "rejectDurableConsumers", "anonymousProducerAdvisorySupport", "monitorConnectionSplits",
    "persistenceThreadPriority", "shutdownOnSlaveFailure", "waitForSlaveTimeout",
    "passiveSlave", "useLoggingForShutdownErrors",
    "mbeanInvocationTimeout", "id", "storeOpenWireVersion", "maxUncommittedCount",
})
_BROKER_LATER = frozenset({
    "managementContext", "shutdownHooks", "services",
    "destinationInterceptors", "destinations", "proxyConnectors", "jmsBridgeConnectors",
    "producerSystemUsage", "consumerSystemUsage", "tempDataStore", "ioExceptionHandler",
    "persistenceFactory", "jobSchedulerStore", "brokerContext", "destinationFactory",
    "networkConnectorURIs", "transportConnectorURIs", "taskRunnerFactory",
    "persistenceTaskRunnerFactory", "messageAuthorizationPolicy",
    "adminView", "regionBroker", "startException", "jmsBridgeConnector",
})
# TLS connectors that read needClientAuth/wantClientAuth (broker links too: ssl://).
_TLS_CLIENT_PROTOCOLS = frozenset({"ssl", "stomp+ssl", "mqtt+ssl", "wss"})
# Any of these in <plugins> means the broker authenticates; without one, ActiveMQ lets
# anybody in, broker links included (the importer keeps that, loudly: see finish()).
_AUTH_PLUGINS = frozenset({"simpleAuthenticationPlugin", "jaasAuthenticationPlugin",
                           "jaasCertificateAuthenticationPlugin",
                           "jaasDualAuthenticationPlugin"})
_CONNECTOR_IGNORED = frozenset({
    "rebalanceClusterClients", "updateClusterClientsOnRemove",
    "updateClusterFilter", "enableStatusMonitor", "allowLinkStealing",
    "auditNetworkProducers", "maximumProducersAllowedPerConnection",
    "maximumConsumersAllowedPerConnection", "warnOnRemoteClose", "disableAsyncDispatch",
})
_KAHADB_IGNORED = frozenset({
    "indexWriteBatchSize", "indexCacheSize", "checkpointInterval", "cleanupInterval",
    "concurrentStoreAndDispatchQueues", "concurrentStoreAndDispatchTopics",
    "ignoreMissingJournalfiles", "checkForCorruptJournalFiles", "checksumJournalFiles",
    "archiveDataLogs", "directoryArchive", "enableIndexWriteAsync", "preallocationStrategy",
    "preallocationScope", "journalDiskSyncInterval", "compactAcksAfterNoGC",
    "compactAcksIgnoresStoreGrowth", "enableAckCompaction",
    "maxAsyncJobs", "forceRecoverIndex", "indexDirectory", "useIndexLFRUEviction",
    "cleanupOnStop", "enableIndexDiskSyncs", "enableIndexRecoveryFile",
    "enableIndexPageCaching", "archiveCorruptedIndex", "failoverProducersAuditDepth",
    "maxFailoverProducersToTrack", "databaseLockedWaitDelay", "brokerName", "id",
})
_JDBC_IGNORED = frozenset({
    "createTablesOnStartup", "dataDirectory", "cleanupPeriod", "transactionIsolation",
    "maxRows", "useExternalMessageReferences", "auditRecoveryDepth", "maxAuditDepth",
    "maxProducersToAudit", "enableAudit", "changeAutoCommitAllowed", "directory",
    "brokerName", "id", "stopOnError",
})
_LOCKER_IGNORED = frozenset({"failIfLocked", "name", "id", "maxAllowableDiffFromDBTime",
                             "handleStartException", "createTablesOnStartup"})
# Spring data-source bean properties -> libpq connection keywords.
_PG_DATASOURCE_PROPS = {"serverName": "host", "serverNames": "host", "portNumber": "port",
                        "portNumbers": "port", "databaseName": "dbname", "user": "user",
                        "username": "user", "password": "password"}
_LATER_STORES = frozenset({"levelDB", "levelDBPersistenceAdapter",
                           "replicatedLevelDB", "mKahaDB", "journalPersistenceAdapter",
                           "amqPersistenceAdapter"})
_LATER_PLUGINS = frozenset({
    "timeStampingBrokerPlugin", "statisticsBrokerPlugin",
    "loggingBrokerPlugin", "discardingDLQBrokerPlugin", "forcePersistencyModeBrokerPlugin",
    "traceBrokerPathPlugin", "destinationPathSeparatorPlugin", "runtimeConfigurationPlugin",
    "virtualSelectorCacheBrokerPlugin", "connectionDotFilePlugin", "destinationDotFilePlugin",
    "multicastTraceBrokerPlugin", "udpTraceBrokerPlugin", "bean", "ref",
})
_POLICY_IGNORED = frozenset({
    "useCache", "optimizedDispatch", "lazyDispatch", "advisoryForConsumed",
    "advisoryForDelivery", "advisoryForFastProducers", "advisoryForSlowConsumers",
    "advisoryWhenFull", "advisoryForDiscardingMessages", "gcInactiveDestinations",
    "inactiveTimoutBeforeGC", "inactiveTimeoutBeforeGC", "expireMessagesPeriod",
    "strictOrderDispatch", "enableAudit", "maxAuditDepth", "maxProducersToAudit",
    "cursorMemoryHighWaterMark", "storeUsageHighWaterMark", "usePrefetchExtension",
    "sendAdvisoryIfNoConsumers", "reduceMemoryFootprint", "persistJMSRedelivered",
    "allConsumersExclusiveByDefault", "consumersBeforeDispatchStarts",
    "timeBeforeDispatchStarts", "minimumMessageSize", "maxBrowsePageSize",
    "maxExpirePageSize", "includeBodyForAdvisory", "alwaysRetroactive",
    "blockedProducerWarningInterval", "doOptimzeMessageStorage",
    "optimizeMessageStoreInFlightLimit", "gcWithNetworkConsumers",
    "sendDuplicateFromStoreToDLQ", "maxQueueAuditDepth", "useConsumerPriority",
    "messageGroupMapFactoryType",
})
_POLICY_LATER = frozenset({
    "pendingMessageLimitStrategy", "messageEvictionStrategy", "subscriptionRecoveryPolicy",
    "dispatchPolicy", "pendingQueuePolicy", "pendingDurableSubscriberPolicy",
    "pendingSubscriberPolicy", "slowConsumerStrategy", "messageGroupMapFactory",
})
_DLQ_IGNORED = frozenset({"expiration", "enableAudit", "maxProducersToAudit", "maxAuditDepth",
                          "destinationPerDurableSubscriber", "queueSuffix", "topicSuffix",
                          "useQueueForTopicMessages"})
_REDELIVERY_IGNORED = frozenset({
    "initialRedeliveryDelay", "redeliveryDelay", "maximumRedeliveryDelay",
    "useExponentialBackOff", "backOffMultiplier", "useCollisionAvoidance",
    "collisionAvoidancePercent", "preDispatchCheck", "id", "tempQueue", "tempTopic",
})
# <networkConnector> attribute -> NetworkConnectorConfig field. ActiveMQ's names; the
# reconnect options (static: URI options in ActiveMQ), the filter-factory ones (a
# destination policy in ActiveMQ) and meshmq's own fields are accepted as attributes too.
# Connector TLS fields with no <networkConnector> attribute: the files come from the
# broker's <sslContext>, the host name check from ?verifyHostName= on the ssl:// URI;
# ActiveMQ's cipher names are Java's, not OpenSSL's, so ciphers are not imported.
NETWORK_CONNECTOR_TLS_FIELDS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile",
                                "verify_hostname", "ssl_ciphers")
NETWORK_CONNECTOR_ATTRIBUTES: dict[str, str] = {
    "name": "name", "userName": "username", "password": "password", "duplex": "duplex",
    "conduitSubscriptions": "conduit_subscriptions", "networkTTL": "network_ttl",
    "messageTTL": "message_ttl", "consumerTTL": "consumer_ttl",
    "decreaseNetworkConsumerPriority": "decrease_network_consumer_priority",
    "consumerPriorityBase": "consumer_priority_base", "prefetchSize": "prefetch_size",
    "alwaysSyncSend": "always_sync_send",
    "suppressDuplicateQueueSubscriptions": "suppress_duplicate_queue_subscriptions",
    "suppressDuplicateTopicSubscriptions": "suppress_duplicate_topic_subscriptions",
    "staticBridge": "static_bridge", "bridgeTempDestinations": "bridge_temp_destinations",
    "dynamicOnly": "dynamic_only", "autoStart": "auto_start",
    "replayWhenNoConsumers": "replay_when_no_consumers", "replayDelay": "replay_delay_ms",
    "selectorAware": "selector_aware", "rateLimit": "rate_limit",
    "rateDuration": "rate_duration_ms",
    "initialReconnectDelay": "initial_reconnect_delay_ms",
    "maxReconnectDelay": "max_reconnect_delay_ms",
    "useExponentialBackOff": "use_exponential_backoff",
    "backOffMultiplier": "backoff_multiplier", "maxReconnectAttempts": "max_reconnect_attempts",
    "minConnectTime": "min_connect_time_ms",
    # meshmq's own
    "redistribution": "redistribution", "redistributionDelay": "redistribution_delay_ms",
    "handshakeTimeout": "handshake_timeout_ms", "heartbeat": "heartbeat_ms",
    "interestResync": "interest_resync_ms",
}
# Child lists of <networkConnector> -> field.
NETWORK_CONNECTOR_LISTS: dict[str, str] = {
    "excludedDestinations": "excluded_destinations",
    "dynamicallyIncludedDestinations": "dynamically_included_destinations",
    "staticallyIncludedDestinations": "statically_included_destinations",
}
# ActiveMQ NetworkBridgeConfiguration / NetworkConnector properties meshmq does not use.
_NC_IGNORED = frozenset({
    "conduitNetworkQueueSubscriptions", "useVirtualDestSubs", "syncDurableSubs",
    "dispatchAsync", "advisoryPrefetchSize", "advisoryAckPercentage", "brokerName",
    "brokerURL", "remoteUserName", "remotePassword", "destinationFilter", "clientIdToken",
    "useCompression", "advisoryForFailedForward", "useBrokerNamesAsIdSeed",
    "gcDestinationViews", "gcSweepTime", "checkDuplicateMessagesOnDuplex", "objectName",
    "localUri", "id", "bridgeFactory", "sslContext", "connectionFilter", "discoveryAgent",
})
_NC_LATER = frozenset({"durableDestinations", "bridgeFactory", "connectionFilter",
                       "sslContext", "discoveryAgent", "brokerService"})
# <conditionalNetworkBridgeFilterFactory> attribute -> connector field.
_BRIDGE_FILTER_ATTRIBUTES: dict[str, str] = {
    "replayWhenNoConsumers": "replay_when_no_consumers", "replayDelay": "replay_delay_ms",
    "selectorAware": "selector_aware", "rateLimit": "rate_limit",
    "rateDuration": "rate_duration_ms",
}
_LIST_DESTINATIONS = {"queue": "queue", "topic": "topic", "tempQueue": "temp-queue",
                      "tempTopic": "temp-topic"}
_TLS_PROTOCOLS = frozenset({"ssl", "stomp+ssl", "mqtt+ssl", "wss"})
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})
# Listener protocols that carry broker links (a discoveryUri advertises them).
_BRIDGE_PROTOCOLS = frozenset({"tcp", "ssl"})

# ActiveMQ defaults that differ from (or might drift from) the model's.
_AMQ_POLICY_DEFAULTS = {"expired_to_dlq": "true", "non_persistent_to_dlq": "false"}
_DEST_ATTRS = {"queue": "queue", "topic": "topic", "tempQueue": "temp-queue",
               "tempTopic": "temp-topic"}


@dataclasses.dataclass
class _Node:
    tag: str  # local name, namespace dropped
    attrs: dict[str, str]
    line: int
    path: str  # "broker/persistenceAdapter/kahaDB", for messages
    children: list[_Node] = dataclasses.field(default_factory=list)
    text: str = ""

    def where(self, attr: str | None = None) -> str:
        return self.path if attr is None else f"{self.path}@{attr}"


def load_activemq_xml(path: Path, *, properties: Mapping[str, str] | None = None
                      ) -> BrokerConfig:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", file=str(path)) from None
    return loads_activemq_xml(data, file=str(path), base_dir=path.absolute().parent,
                              properties=properties)


def loads_activemq_xml(data: bytes | str, *, file: str | None = None,
                       base_dir: Path | None = None,
                       properties: Mapping[str, str] | None = None) -> BrokerConfig:
    base = base_dir if base_dir is not None else Path.cwd()
    document = _parse(data.encode() if isinstance(data, str) else data, file)
    importer = _Importer(file, base, document, properties or {})
    return importer.run()


# An '&' that starts no entity or character reference.
_BARE_AMPERSAND = re.compile(rb"&(?!(?:[A-Za-z_][\w.-]*|#[0-9]+|#x[0-9A-Fa-f]+);)")


def _parse(data: bytes, file: str | None) -> _Node:
    """Parse strictly; a document that fails only for bare ``&`` (as in URIs copied from
    docs: ``?randomize=false&maxReconnectAttempts=0``) is read with each one as ``&amp;``,
    with a warning per line, since a Spring-era config copied verbatim often has them."""
    try:
        return _parse_strict(data, file)
    except ConfigError as strict_error:
        bare = [m.start() for m in _BARE_AMPERSAND.finditer(data)]
        if not bare:
            raise
        try:
            root = _parse_strict(_BARE_AMPERSAND.sub(b"&amp;", data), file)
        except ConfigError:
            raise strict_error from None  # something else is wrong too: report the original
    for line in sorted({data.count(b"\n", 0, pos) + 1 for pos in bare}):
        log.warning("%s:%d: bare '&' read as '&amp;' (XML requires '&amp;' there)",
                    file or "<activemq.xml>", line)
    return root


def _parse_strict(data: bytes, file: str | None) -> _Node:
    # Namespace processing turns "{uri}local" into "uri local": we keep the local part.
    parser = xml.parsers.expat.ParserCreate(namespace_separator=" ")
    root = _Node("#document", {}, 1, "")
    stack = [root]

    def start(name: str, attrs: dict[str, str]) -> None:
        local = name.rsplit(" ", 1)[-1]
        parent = stack[-1]
        # Paths in messages start at <broker>; the Spring wrapping around it is noise.
        inside = parent.path == "broker" or parent.path.startswith("broker/")
        path = f"{parent.path}/{local}" if inside and local != "broker" else local
        node = _Node(local, {k.rsplit(" ", 1)[-1]: v for k, v in attrs.items()},
                     parser.CurrentLineNumber, path)
        parent.children.append(node)
        stack.append(node)

    def end(name: str) -> None:
        stack.pop()

    def chars(text: str) -> None:
        stack[-1].text += text

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    try:
        parser.Parse(data, True)
    except xml.parsers.expat.ExpatError as exc:
        reason = xml.parsers.expat.ErrorString(exc.code) or "malformed XML"
        raise ConfigError(f"malformed XML: {reason}", file=file, line=exc.lineno) from None
    return root


def _iter(node: _Node) -> list[_Node]:
    out = [node]
    for child in node.children:
        out.extend(_iter(child))
    return out


class _Importer:
    def __init__(self, file: str | None, base_dir: Path, document: _Node,
                 overrides: Mapping[str, str]) -> None:
        self.file = file
        self.base_dir = base_dir
        self.document = document
        self.src = Source(file=file, base_dir=base_dir)
        self.props = {
            "activemq.base": str(base_dir), "activemq.home": str(base_dir),
            "activemq.conf": str(base_dir), "activemq.data": str(base_dir / "data"),
        }
        self.overrides = dict(overrides)
        self.raw: dict[str, Any] = {}
        self.listeners: list[dict[str, Any]] = []
        self.policies: list[tuple[dict[str, Any], _Node]] = []
        self.default_redeliveries: tuple[str, _Node] | None = None
        self.redeliveries: list[tuple[str, str, _Node]] = []  # (match, count, node)
        self.connectors: list[dict[str, Any]] = []
        # conditionalNetworkBridgeFilterFactory settings: (field -> (value, attr), node, match)
        self.bridge_filters: list[tuple[dict[str, tuple[str, str]], _Node, str]] = []
        self.ssl: dict[str, tuple[str, str]] = {}  # listener key -> (file, attribute)
        self.ssl_node: _Node | None = None
        self.ssl_unreadable: list[tuple[str, str]] = []  # (attribute, keystore) not PEM
        self.auth_plugin = False  # an authentication plugin is configured
        # <masterConnector> / masterConnectorURI: (node, attribute, member addresses)
        self.master_connector: tuple[_Node, str, list[str]] | None = None
        self.ha_settings = False  # a locker or lock keep-alive: HA was meant, not implied

    # -- plumbing -----------------------------------------------------------

    def warn(self, node: _Node, message: str) -> None:
        log.warning("%s:%d: %s", self.file or "<activemq.xml>", node.line, message)

    def fail(self, node: _Node, message: str, attr: str | None = None) -> ConfigError:
        return ConfigError(message, file=self.file, line=node.line, option=node.where(attr))

    def value(self, node: _Node, attr: str) -> str:
        """The attribute with ``${...}`` placeholders resolved."""
        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            props = {**self.props, **self.overrides}
            if name not in props:
                raise self.fail(node, f"unknown placeholder ${{{name}}} "
                                f"(known: {', '.join(sorted(props))})", attr)
            return props[name]
        return re.sub(r"\$\{([^}]*)\}", sub, node.attrs[attr])

    def put(self, path: str, value: Any, node: _Node, attr: str | None) -> None:
        """Set raw option ``path`` (``stomp.heartbeat_grace``), remembering where it came from."""
        parts = path.split(".")
        table = self.raw
        for part in parts[:-1]:
            table = table.setdefault(part, {})
        table[parts[-1]] = value
        self.src.lines[path] = node.line
        self.src.labels[path] = node.where(attr)

    def attributes(self, node: _Node, handlers: Mapping[str, Callable[[str], None]],
                   ignored: frozenset[str] = frozenset()) -> None:
        for attr in node.attrs:
            if attr in handlers:
                handlers[attr](attr)
            elif attr in ignored:
                self.warn(node, f"<{node.tag}> attribute {attr!r} is ignored by meshmq")
            else:
                raise self.fail(node, _unknown(f"<{node.tag}> attribute", attr,
                                               [*handlers, *ignored]), attr)

    def elements(self, node: _Node, handlers: Mapping[str, Callable[[_Node], None]],
                 later: frozenset[str] = frozenset()) -> None:
        for child in node.children:
            if child.tag in handlers:
                handlers[child.tag](child)
            elif child.tag in later:
                self.warn(child, f"<{child.tag}> is not supported yet, ignored")
            else:
                raise self.fail(child, _unknown(f"element <{child.tag}> in <{node.tag}>",
                                                child.tag, [*handlers, *later]))

    def bean(self, wrapper: _Node, expected: str) -> _Node | None:
        """Spring property wrappers hold one bean: ``<systemUsage><systemUsage .../>``."""
        self.attributes(wrapper, {})
        found: list[_Node] = []
        self.elements(wrapper, {expected: found.append})
        if len(found) > 1:
            raise self.fail(found[1], f"more than one <{expected}> in <{wrapper.tag}>")
        return found[0] if found else None

    # -- document -----------------------------------------------------------

    def run(self) -> BrokerConfig:
        nodes = _iter(self.document)
        brokers = [n for n in nodes if n.tag == "broker"]
        if not brokers:
            raise ConfigError("no <broker> element found", file=self.file, line=None)
        if len(brokers) > 1:
            raise self.fail(brokers[1], "more than one <broker> element; meshmq runs one "
                            "broker per file")
        self.placeholder_files(nodes)
        for imported in (n for n in nodes if n.tag == "import"):
            self.warn(imported, f"<import resource={imported.attrs.get('resource', '')!r}> is "
                      "not followed (the web console is set in meshmq's [management])")
        broker = brokers[0]
        self.broker(broker)
        self.finish(broker)
        # activemq.xml names no management port: take 8161, or the next free port when
        # another broker on this host has it (logged), so several brokers start.
        self.raw.setdefault("management", {}).setdefault("next_free_port", True)
        config = build_config(self.raw, self.src, from_strings=True)
        if config.ha.mode == "shared" and not self.ha_settings:
            config = dataclasses.replace(config, ha=dataclasses.replace(config.ha,
                                                                        implicit=True))
        return config

    def placeholder_files(self, nodes: list[_Node]) -> None:
        for bean in nodes:
            if bean.tag != "bean" or not bean.attrs.get("class", "").endswith(
                    "PropertyPlaceholderConfigurer"):
                continue
            for value in (n for n in _iter(bean) if n.tag == "value"):
                holder = _Node("value", {"value": value.text.strip()}, value.line, "value")
                location = self.value(holder, "value").removeprefix("file:")
                target = Path(location)
                target = target if target.is_absolute() else self.base_dir / target
                try:
                    self.props.update(_read_properties(target.read_text("utf-8")))
                except OSError:
                    self.warn(value, f"placeholder properties file {location} not found, "
                              "its ${...} names are unknown")

    def broker(self, node: _Node) -> None:
        self.attributes(node, {
            "brokerName": lambda a: self.put("broker.name", self.value(node, a), node, a),
            "dataDirectory": lambda a: self.put("broker.data_directory", self.value(node, a),
                                                node, a),
            "persistent": lambda a: self.put("broker.persistent", self.value(node, a), node, a),
            "advisorySupport": lambda a: self.put("broker.advisory_support",
                                                  self.value(node, a), node, a),
            "networkConnectorStartAsync": lambda a: self.put(
                "broker.network_connector_start_async", self.value(node, a), node, a),
            "masterConnectorURI": lambda a: self.pure_master_slave(node, a),
            "shutdownOnMasterFailure": lambda a: self.put(
                "ha.can_be_master", "false" if self.value(node, a).strip().lower() == "true"
                else "true", node, a),
            "waitForSlave": lambda a: self.wait_for_slave(node, a),
        }, _BROKER_IGNORED)
        for child in node.children:
            # Pure master/slave: a replicated node (handled before the persistence
            # adapter, which otherwise makes a <kahaDB> a shared store).
            if child.tag == "services":
                for svc in child.children:
                    if svc.tag == "masterConnector":
                        self.pure_master_slave(svc, None)
        for child in node.children:
            if child.tag == "masterConnector":
                self.pure_master_slave(child, None)
        self.elements(node, {
            "masterConnector": lambda n: None,  # read above
            "transportConnectors": self.transport_connectors,
            "persistenceAdapter": self.persistence_adapter,
            "plugins": self.plugins,
            "destinationPolicy": self.destination_policy,
            "systemUsage": self.system_usage,
            "sslContext": self.ssl_context,
            "networkConnectors": self.network_connectors,
        }, _BROKER_LATER)

    # -- transport connectors ----------------------------------------------

    def transport_connectors(self, node: _Node) -> None:
        self.attributes(node, {})
        self.elements(node, {"transportConnector": self.transport_connector})

    def transport_connector(self, node: _Node) -> None:
        self.attributes(node, {"name": lambda a: None, "uri": lambda a: None,
                               "discoveryUri": lambda a: None,
                               "updateClusterClients": lambda a: None}, _CONNECTOR_IGNORED)
        if "uri" not in node.attrs:
            raise self.fail(node, "<transportConnector> needs a uri", "uri")
        uri = self.value(node, "uri")
        scheme = uri.partition("://")[0].lower()
        if scheme not in _SCHEMES:
            if scheme.split("+")[0] in _LATER_SCHEMES:
                self.warn(node, f"{scheme}:// transport connectors are not supported yet, "
                          "ignored")
                return
            raise self.fail(node, _unknown("transport scheme", scheme, _SCHEMES), "uri")
        try:
            _, host, port, query = split_listener_url(uri)
        except ValueError as exc:
            raise self.fail(node, str(exc), "uri") from None
        protocol = _SCHEMES[scheme]
        index = len(self.listeners)
        at = f"listeners[{index}]"
        listener: dict[str, Any] = {
            "name": self.value(node, "name") if "name" in node.attrs else f"{scheme}-{port}",
            "protocol": protocol, "host": host, "port": str(port),
        }
        self.listeners.append(listener)
        for key in listener:
            self.src.lines[f"{at}.{key}"] = node.line
            self.src.labels[f"{at}.{key}"] = node.where("name" if key == "name" else "uri")
        self.src.lines[at] = node.line
        self.src.labels[at] = node.where()
        if protocol in _TLS_CLIENT_PROTOCOLS:
            # ActiveMQ asks for client certificates only with needClientAuth or
            # wantClientAuth, whatever the sslContext's trustStore (it also verifies
            # brokers): so does an imported configuration.
            listener["client_auth"] = "none"
        for option, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
            self.uri_option(node, listener, at, option, value)
        if "updateClusterClients" in node.attrs:  # topology push to this listener's clients
            listener["update_cluster_clients"] = self.value(node, "updateClusterClients")
            self.src.lines[f"{at}.update_cluster_clients"] = node.line
            self.src.labels[f"{at}.update_cluster_clients"] = node.where("updateClusterClients")
        if "discoveryUri" in node.attrs:
            if protocol in _BRIDGE_PROTOCOLS:
                listener["discovery_uri"] = self.value(node, "discoveryUri")
                self.src.lines[f"{at}.discovery_uri"] = node.line
                self.src.labels[f"{at}.discovery_uri"] = node.where("discoveryUri")
            else:
                self.warn(node, f"discoveryUri on a {scheme}:// connector is ignored: meshmq "
                          "advertises only tcp/ssl connectors, which carry broker links")

    def uri_option(self, node: _Node, listener: dict[str, Any], at: str, option: str,
                   value: str) -> None:
        if option == "maximumConnections":
            listener["max_connections"] = value
            self.src.lines[f"{at}.max_connections"] = node.line
            self.src.labels[f"{at}.max_connections"] = node.where("uri")
        elif option in ("needClientAuth", "wantClientAuth"):
            if listener["protocol"] not in _TLS_CLIENT_PROTOCOLS:
                self.warn(node, f"URI option {option} only applies to TLS connectors "
                          "(ssl, stomp+ssl, mqtt+ssl, wss) in meshmq, ignored")
                return
            # needClientAuth wins when both are given, as in ActiveMQ.
            if value.lower() == "true" and (option == "needClientAuth"
                                            or listener.get("client_auth") != "need"):
                listener["client_auth"] = "need" if option == "needClientAuth" else "want"
            self.src.lines[f"{at}.client_auth"] = node.line
            self.src.labels[f"{at}.client_auth"] = node.where("uri")
        elif option in _STOMP_URI_OPTIONS:
            if not listener["protocol"].startswith("stomp"):
                self.warn(node, f"URI option {option} only applies to STOMP connectors in "
                          "meshmq, ignored")
                return
            key = _STOMP_URI_OPTIONS[option]
            parsed: Any = value.split(",") if key == "default_heartbeat" else value
            current = self.raw.get("stomp", {}).get(key)
            # One STOMP codec serves every STOMP listener: the first connector decides.
            if current is None:
                self.put(f"stomp.{key}", parsed, node, "uri")
            elif current != parsed:
                self.warn(node, f"URI option {option}={value} conflicts with an earlier STOMP "
                          "connector; the first one wins")
        else:
            self.warn(node, f"URI option {option} is ignored by meshmq")

    def ssl_context(self, node: _Node) -> None:
        ctx = self.bean(node, "sslContext")
        if ctx is None:
            return

        def pem(attr: str, *keys: str) -> None:
            location = self.value(ctx, attr)
            if not location.lower().endswith((".pem", ".crt", ".cer")):
                self.warn(ctx, f"{attr} {location!r}: only PEM files are supported "
                          "(convert JKS/PKCS12 with keytool and openssl), ignored")
                self.ssl_unreadable.append((attr, location))
                return
            for key in keys:
                self.ssl[key] = (location, attr)

        self.attributes(ctx, {
            "keyStore": lambda a: pem(a, "ssl_certfile", "ssl_keyfile"),
            "trustStore": lambda a: pem(a, "ssl_cafile"),
        }, frozenset({"keyStorePassword", "keyStoreKeyPassword", "trustStorePassword",
                      "keyStoreType", "trustStoreType", "keyStoreAlgorithm",
                      "trustStoreAlgorithm", "protocol", "provider", "secureRandomAlgorithm"}))
        self.ssl_node = ctx

    # -- network connectors ---------------------------------------------------

    def network_connectors(self, node: _Node) -> None:
        self.attributes(node, {})
        self.elements(node, {
            "networkConnector": lambda n: self.network_connector(n, "uri"),
            "multicastNetworkConnector": lambda n: self.network_connector(n, "remoteURI"),
        }, frozenset({"ldapNetworkConnector"}))

    def network_connector(self, node: _Node, uri_attr: str) -> None:
        index = len(self.connectors)
        at = f"network_connectors[{index}]"
        connector: dict[str, Any] = {}
        self.connectors.append(connector)
        self.src.lines[at] = node.line
        self.src.labels[at] = node.where()

        def keep(key: str) -> Callable[[str], None]:
            def handler(a: str) -> None:
                value = self.value(node, a)
                if key == "max_reconnect_attempts" and value.strip() == "0":
                    # ActiveMQ's meaning (0 retries for ever, as in a static: URI); in
                    # meshmq 0 means "do not reconnect".
                    value = "-1"
                connector[key] = value
                self.src.lines[f"{at}.{key}"] = node.line
                self.src.labels[f"{at}.{key}"] = node.where(a)
            return handler

        handlers = {a: keep(f) for a, f in NETWORK_CONNECTOR_ATTRIBUTES.items()}
        handlers[uri_attr] = keep("uri")
        self.attributes(node, handlers, _NC_IGNORED)
        if "uri" not in connector:
            raise self.fail(node, f"<{node.tag}> needs a {uri_attr}", uri_attr)
        if node.tag == "multicastNetworkConnector":
            if not connector["uri"].strip().lower().startswith("multicast://"):
                raise self.fail(node, "meshmq reads <multicastNetworkConnector> as multicast "
                                "discovery: its remoteURI must be multicast://...", uri_attr)
            self.warn(node, "<multicastNetworkConnector> bridges to each broker discovered in "
                      "the multicast group (meshmq has no one-to-many bridge transport)")

        def destinations(n: _Node) -> None:
            key = NETWORK_CONNECTOR_LISTS[n.tag]
            self.attributes(n, {})
            entries: list[str] = connector.setdefault(key, [])
            self.src.lines[f"{at}.{key}"] = n.line
            self.src.labels[f"{at}.{key}"] = n.where()

            def destination(d: _Node) -> None:
                self.attributes(d, {"physicalName": lambda a: None})
                self.elements(d, {})
                if "physicalName" not in d.attrs:
                    raise self.fail(d, f"<{d.tag}> needs a physicalName", "physicalName")
                # A composite name "a,b" is several destinations, as in ActiveMQ.
                for name in self.value(d, "physicalName").split(","):
                    where = f"{at}.{key}[{len(entries)}]"
                    entries.append(f"{_LIST_DESTINATIONS[d.tag]}://{name.strip()}")
                    self.src.lines[where] = d.line
                    self.src.labels[where] = d.where("physicalName")

            self.elements(n, {tag: destination for tag in _LIST_DESTINATIONS})

        self.elements(node, {tag: destinations for tag in NETWORK_CONNECTOR_LISTS}, _NC_LATER)

    def bridge_filter(self, node: _Node, match: str) -> None:
        if any(n is node for _, n, _ in self.bridge_filters):
            return  # a <defaultEntry> is read once per destination kind
        values: dict[str, tuple[str, str]] = {}

        def keep(key: str) -> Callable[[str], None]:
            def handler(a: str) -> None:
                values[key] = (self.value(node, a), a)
            return handler

        self.attributes(node, {a: keep(f) for a, f in _BRIDGE_FILTER_ATTRIBUTES.items()})
        self.elements(node, {})
        self.bridge_filters.append((values, node, match))

    def assemble_connectors(self) -> None:
        """Apply destination policies' bridge filter settings to every connector: ActiveMQ
        sets them per destination, meshmq per connector. A connector's own attribute wins;
        between policies, the first in the file wins."""
        chosen: dict[str, tuple[str, str, _Node]] = {}  # field -> (value, attr, node)
        for values, node, match in self.bridge_filters:
            if not self.connectors:
                self.warn(node, f"<{node.tag}> (policy {match}) has no effect: there are no "
                          "network connectors")
                continue
            names = ", ".join(values) or "its defaults"
            self.warn(node, f"<{node.tag}> of policy {match} applies to every network "
                      f"connector in meshmq (meshmq configures {names} per connector)")
            for key, (value, attr) in values.items():
                if key not in chosen:
                    chosen[key] = (value, attr, node)
                elif chosen[key][0] != value:
                    first = chosen[key][2]
                    self.warn(node, f"{attr}={value} conflicts with line {first.line}; "
                              "the first one is used")
        for i, connector in enumerate(self.connectors):
            for key, (value, attr, node) in chosen.items():
                if key in connector:
                    continue
                connector[key] = value
                self.src.lines[f"network_connectors[{i}].{key}"] = node.line
                self.src.labels[f"network_connectors[{i}].{key}"] = node.where(attr)
        if self.connectors:
            self.raw["network_connectors"] = self.connectors

    # -- persistence --------------------------------------------------------

    def persistence_adapter(self, node: _Node) -> None:
        self.attributes(node, {})
        self.elements(node, {
            "kahaDB": self.kahadb,
            "memoryPersistenceAdapter": lambda n: self.put("store.kind", "memory", n, None),
            "jdbcPersistenceAdapter": self.jdbc,
        }, _LATER_STORES)

    def kahadb(self, node: _Node) -> None:
        self.put("store.kind", "journal", node, None)
        # ActiveMQ locks every KahaDB directory: a second broker on it waits as a slave.
        # meshmq's equivalent is shared-store HA (a lease with fencing), unless useLock=false
        # or a <masterConnector> made this a replicated node (each with its own journal).
        if self.raw.get("ha", {}).get("mode") != "replicated":
            self.put("ha.mode", "shared", node, None)

        def sync_strategy(a: str) -> None:
            strategy = self.value(node, a).lower()
            if strategy == "periodic":
                self.warn(node, "journalDiskSyncStrategy periodic: meshmq syncs every group "
                          "commit instead")
            self.put("store.fsync", "false" if strategy == "never" else "true", node, a)

        self.attributes(node, {
            "directory": lambda a: self.put("store.directory", self.value(node, a), node, a),
            "journalMaxFileLength": lambda a: self.put("store.segment_size",
                                                       self.value(node, a), node, a),
            "journalMaxWriteBatchSize": lambda a: self.put("store.max_batch_bytes",
                                                           self.value(node, a), node, a),
            "enableJournalDiskSyncs": lambda a: self.put("store.fsync", self.value(node, a),
                                                         node, a),
            "journalDiskSyncStrategy": sync_strategy,
            "useLock": lambda a: self.use_lock(node, a),
            "lockKeepAlivePeriod": lambda a: self.keepalive(node, a),
        }, _KAHADB_IGNORED)
        self.elements(node, {"locker": lambda n: self.locker(n, "shared-file-locker")})

    def pure_master_slave(self, node: _Node, attr: str | None) -> None:
        """ActiveMQ's pure master/slave -> replicated HA (docs/ha.md). The URI names the
        other node's replication address (``static:(tcp://a:1,tcp://w:2)`` lists several,
        e.g. a witness); this node listens on the same port. meshmq elects the master, so
        both brokers of a pair name each other."""
        if attr is not None:
            uri_attr = attr
        else:
            self.attributes(node, {
                "remoteURI": lambda a: None,
                "userName": lambda a: self.put("ha.user", self.value(node, a), node, a),
                "password": lambda a: self.put("ha.password", self.value(node, a), node, a),
            })
            uri_attr = "remoteURI"
            if uri_attr not in node.attrs:
                raise self.fail(node, "<masterConnector> needs remoteURI, the other node's "
                                "replication address", None)
        text = self.value(node, uri_attr).strip()
        inner = text[len("static:("):-1] if text.startswith("static:(") and \
            text.endswith(")") else text
        members = []
        for part in (p.strip() for p in inner.split(",")):
            parsed = urllib.parse.urlparse(part)
            if parsed.scheme not in ("tcp", "nio", "ssl") or not parsed.hostname \
                    or parsed.port is None:
                raise self.fail(node, f"{part!r} is not a tcp://HOST:PORT replication "
                                "address", uri_attr)
            members.append(f"{parsed.hostname}:{parsed.port}")
        self.put("ha.mode", "replicated", node, None)
        self.put("ha.members", members, node, uri_attr)
        # This node's own address comes from its transport connectors (finish_replicated).
        self.master_connector = (node, uri_attr, members)

    def finish_replicated(self) -> None:
        """This node's replication address. As in ActiveMQ, where a slave connects to the
        master's OpenWire connector, the other node's ``masterConnectorURI`` names this
        node's ``tcp://`` transport connector, which therefore becomes its replication
        listener (``ha.listen``). A pair alone cannot replace a failed master (meshmq
        elects by majority), so a witness must be listed too."""
        if self.master_connector is None:
            return
        node, attr, members = self.master_connector
        file = self.file or "<activemq.xml>"
        links = [i for i, lst in enumerate(self.listeners) if lst["protocol"] == "tcp"]
        own = (f"{self.listeners[links[0]]['host']}:{self.listeners[links[0]]['port']}"
               if links else None)
        if len(members) < 2:
            other = members[0]
            here = "THIS-HOST:" + (own.rpartition(":")[2] if own else "PORT")
            raise self.fail(node, (
                f"a master/slave pair cannot replace a failed master without a third vote "
                f"(meshmq elects the master by majority, docs/ha.md): list a witness too, "
                f'{attr}="static:(tcp://{other},tcp://WITNESS-HOST:PORT)", give the master '
                f'masterConnectorURI="static:(tcp://{here},tcp://WITNESS-HOST:PORT)" and run '
                f"'meshmq witness' with the same setting"), attr)
        if own is not None:
            i = links[0]
            line = self.src.lines.get(f"listeners[{i}]", node.line)
            label = self.src.labels.get(f"listeners[{i}].port", node.where(attr))
            lst = self.listeners.pop(i)
            self.drop_listener_sources(i)
            self.put("ha.listen", own, node, attr)
            self.src.lines["ha.listen"], self.src.labels["ha.listen"] = line, label
            log.info("%s:%d: transportConnector %r (tcp://%s) is this node's replication "
                     "address (ha.listen), which the other nodes' masterConnectorURI names; "
                     "it carries no client or network-connector connections",
                     file, line, lst["name"], own)
            return
        port = members[0].rpartition(":")[2]
        local = [m for m in members if m.rpartition(":")[0] in _LOCAL_HOSTS
                 and m.rpartition(":")[2] == port]
        if local:
            raise self.fail(node, (
                f"this node has no tcp:// transport connector to serve as its replication "
                f"address, and listening on port {port} would take {local[0]}'s: add "
                f'<transportConnector name="openwire" uri="tcp://0.0.0.0:PORT"/> (the address '
                f"the other nodes' masterConnectorURI names)"), attr)
        self.put("ha.listen", f"0.0.0.0:{port}", node, attr)

    def drop_listener_sources(self, index: int) -> None:
        """Forget listener ``index``'s source positions and renumber the later ones."""
        moved: dict[str, tuple[int | None, str | None]] = {}
        keys = dict.fromkeys(k for k in (*self.src.lines, *self.src.labels)
                             if k.startswith("listeners["))
        for key in keys:
            number, _, rest = key[len("listeners["):].partition("]")
            if not number.isdigit() or int(number) < index:
                continue
            line, label = self.src.lines.pop(key, None), self.src.labels.pop(key, None)
            if int(number) > index:
                moved[f"listeners[{int(number) - 1}]{rest}"] = (line, label)
        for key, (line, label) in moved.items():
            if line is not None:
                self.src.lines[key] = line
            if label is not None:
                self.src.labels[key] = label

    def wait_for_slave(self, node: _Node, attr: str) -> None:
        # A replicated master never confirms a write without a majority, so it always
        # "waits for its slave"; on a broker that is not replicated it means nothing.
        if self.value(node, attr).strip().lower() == "true" and not any(
                c.tag == "masterConnector" for c in _iter(node)) \
                and "masterConnectorURI" not in node.attrs:
            raise self.fail(node, "waitForSlave=true: in meshmq both brokers of a "
                            "replicated pair name each other with <masterConnector "
                            "remoteURI=...> (meshmq elects the master); add it here", attr)

    def use_lock(self, node: _Node, attr: str) -> None:
        if self.value(node, attr).strip().lower() == "false":
            self.put("ha.mode", "none", node, attr)

    def keepalive(self, node: _Node, attr: str) -> None:
        value = self.value(node, attr).strip()
        self.ha_settings = True
        if value not in ("0", ""):  # 0 = ActiveMQ's "no keep-alive"; meshmq always renews
            self.put("ha.keepalive_ms", value, node, attr)

    def locker(self, wrapper: _Node, expected: str) -> None:
        """``<locker><shared-file-locker/></locker>`` or ``<lease-database-locker/>``."""
        self.attributes(wrapper, {})
        found: list[_Node] = []
        known = ("shared-file-locker", "lease-database-locker", "database-locker",
                 "transact-database-locker")
        self.elements(wrapper, dict.fromkeys(known, found.append))
        self.ha_settings = self.ha_settings or bool(found)
        for n in found:
            if n.tag != expected and not (expected == "lease-database-locker"
                                          and n.tag.endswith("database-locker")):
                raise self.fail(n, f"<{n.tag}> does not go with this persistence adapter "
                                f"(expected <{expected}>)")
            if n.tag in ("database-locker", "transact-database-locker"):
                self.warn(n, f"<{n.tag}> holds a database transaction for the broker's life; "
                          "meshmq uses its lease locker instead (docs/ha.md)")
            # A file locker's interval is how often a slave tries; a lease locker's is
            # also how long the lease lasts (LeaseDatabaseLocker).
            interval = "ha.acquire_interval_ms" if n.tag == "shared-file-locker" \
                else "ha.lease_ms"
            handlers = {"lockAcquireSleepInterval": self.setter(n, interval)}
            if n.tag == "lease-database-locker":
                handlers["leaseHolderId"] = self.setter(n, "ha.holder_id")
            self.attributes(n, handlers, _LOCKER_IGNORED)

    def setter(self, node: _Node, path: str) -> Callable[[str], None]:
        def put(attr: str) -> None:
            self.put(path, self.value(node, attr), node, attr)
        return put

    def jdbc(self, node: _Node) -> None:
        """``<jdbcPersistenceAdapter dataSource="#pg">`` -> the PostgreSQL store with the
        database lease (ActiveMQ's JDBC master/slave)."""
        self.put("store.kind", "postgres", node, None)
        self.put("ha.mode", "database", node, None)
        self.attributes(node, {
            "dataSource": lambda a: self.put("store.dsn", self.data_source(node, a), node, a),
            "useLock": lambda a: self.use_lock(node, a),
            "lockKeepAlivePeriod": lambda a: self.keepalive(node, a),
        }, _JDBC_IGNORED)

        def statements(wrapper: _Node) -> None:
            self.attributes(wrapper, {})

            def inner(n: _Node) -> None:
                self.attributes(n, {"tablePrefix": lambda a: self.put(
                    "store.table_prefix", self.value(n, a), n, a)},
                    frozenset({"stringIdDataType", "sequenceDataType", "longDataType",
                               "binaryDataType", "containerNameDataType", "id"}))

            self.elements(wrapper, {"statements": inner})

        self.elements(node, {"locker": lambda n: self.locker(n, "lease-database-locker"),
                             "statements": statements},
                      frozenset({"adapter", "databaseLocker", "scheduledThreadPoolExecutor"}))

    def data_source(self, node: _Node, attr: str) -> str:
        """The libpq connection string of the Spring bean ``dataSource="#id"`` names."""
        ref = self.value(node, attr).strip().removeprefix("#")
        beans = [n for n in _iter(self.document) if n.tag == "bean" and n.attrs.get("id") == ref]
        if not beans:
            raise self.fail(node, f"no <bean id={ref!r}> for this data source", attr)
        bean = beans[0]
        parts: dict[str, str] = {}
        for prop in (n for n in bean.children if n.tag == "property"):
            name = prop.attrs.get("name", "")
            if "value" not in prop.attrs:
                continue
            value = self.value(prop, "value")
            if name == "url":
                parsed = urllib.parse.urlparse(value.removeprefix("jdbc:"))
                if parsed.scheme not in ("postgresql", "postgres"):
                    raise self.fail(prop, f"only PostgreSQL data sources are supported, not "
                                    f"{value!r}", "value")
                parts.update({k: v for k, v in (("host", parsed.hostname),
                                                ("port", str(parsed.port or "")),
                                                ("dbname", parsed.path.lstrip("/"))) if v})
            elif name in _PG_DATASOURCE_PROPS:
                parts[_PG_DATASOURCE_PROPS[name]] = value
            elif name == "driverClassName" and "postgresql" not in value:
                raise self.fail(prop, f"only PostgreSQL data sources are supported, not "
                                f"{value!r}", "value")
        if not parts:
            raise self.fail(bean, "the data source bean names no PostgreSQL server "
                            "(serverName, databaseName, url, ...)")
        return " ".join(f"{k}={_libpq_quote(v)}" for k, v in parts.items())

    # -- plugins ------------------------------------------------------------

    def plugins(self, node: _Node) -> None:
        self.auth_plugin = self.auth_plugin or any(c.tag in _AUTH_PLUGINS
                                                   for c in node.children)
        self.attributes(node, {})
        self.elements(node, {
            "simpleAuthenticationPlugin": self.simple_authentication,
            "authorizationPlugin": self.authorization_plugin,
            "jaasAuthenticationPlugin": self.jaas_authentication,
            "jaasCertificateAuthenticationPlugin": self.jaas_authentication,
            "jaasDualAuthenticationPlugin": self.jaas_authentication,
            "redeliveryPlugin": self.redelivery_plugin,
        }, _LATER_PLUGINS)

    def jaas_authentication(self, node: _Node) -> None:
        """The JAAS plugins read ``login.config`` next to activemq.xml (config/jaas.py)."""
        login_config = self.base_dir / "login.config"
        dual = node.tag == "jaasDualAuthenticationPlugin"
        password_entry = "activemq-domain" if node.tag != "jaasCertificateAuthenticationPlugin" \
            else None
        cert_entry = "activemq-domain" if password_entry is None else \
            "activemq-ssl-domain" if dual else None

        def entry(attr: str) -> None:
            nonlocal password_entry, cert_entry
            if attr == "sslConfiguration" or password_entry is None:
                cert_entry = self.value(node, attr)
            else:
                password_entry = self.value(node, attr)

        self.attributes(node, {"configuration": entry,
                               **({"sslConfiguration": entry} if dual else {})},
                        frozenset({"discoverLoginConfig"}))
        self.elements(node, {})
        if not login_config.is_file():
            raise self.fail(node, f"<{node.tag}> reads the JAAS login configuration "
                            f"login.config next to this file, and there is none: "
                            f"{login_config}")
        options: dict[str, Any] = {"anonymous_access": "false"}
        if password_entry is not None:
            options.update(jaas.password_options(login_config, password_entry))
        if cert_entry is not None:
            options.update(jaas.certificate_options(login_config, cert_entry))
        for key, value in options.items():
            self.put(f"auth.{key}", value, node, None)

    def simple_authentication(self, node: _Node) -> None:
        # Unlike having no plugin at all, the plugin refuses anonymous users by default.
        self.put("auth.anonymous_access", "false", node, None)
        self.attributes(node, {
            "anonymousAccessAllowed": lambda a: self.put("auth.anonymous_access",
                                                         self.value(node, a), node, a),
            "anonymousUser": lambda a: self.put("auth.anonymous_user", self.value(node, a),
                                                node, a),
            "anonymousGroup": lambda a: self.put("auth.anonymous_groups",
                                                 _split(self.value(node, a)), node, a),
        })
        users: list[dict[str, Any]] = self.raw.setdefault("auth", {}).setdefault("users", [])

        def user(n: _Node) -> None:
            at = f"auth.users[{len(users)}]"
            entry: dict[str, Any] = {}
            self.src.lines[at] = n.line
            self.src.labels[at] = n.where()

            def keep(key: str, value: Any, a: str) -> None:
                entry[key] = value
                self.src.lines[f"{at}.{key}"] = n.line
                self.src.labels[f"{at}.{key}"] = n.where(a)

            self.attributes(n, {
                "username": lambda a: keep("name", self.value(n, a), a),
                "password": lambda a: keep("password", self.value(n, a), a),
                "groups": lambda a: keep("groups", _split(self.value(n, a)), a),
            })
            self.elements(n, {})
            users.append(entry)

        def user_list(n: _Node) -> None:
            self.attributes(n, {})
            self.elements(n, {"authenticationUser": user})

        self.elements(node, {"users": user_list})

    def authorization_plugin(self, node: _Node) -> None:
        """``<authorizationPlugin><map><authorizationMap>``: entries, the default entry
        and the temp-destination entry, with ActiveMQ's meaning (docs/security.md)."""
        self.attributes(node, {})
        authz: dict[str, Any] = self.raw.setdefault("auth", {}).setdefault("authorization", {})
        entries: list[dict[str, Any]] = authz.setdefault("entries", [])

        def group_class(n: _Node, a: str) -> None:
            if not self.value(n, a).endswith("GroupPrincipal"):
                raise self.fail(n, "meshmq matches the names in read/write/admin against "
                                "groups only: list groups and remove groupClass", a)

        def rights(n: _Node, at: str, target: dict[str, Any],
                   more: Mapping[str, Callable[[str], None]] = {}) -> None:
            self.src.lines[at] = n.line
            self.src.labels[at] = n.where()

            def keep(key: str) -> Callable[[str], None]:
                def handler(a: str) -> None:
                    target[key] = _split(self.value(n, a))
                    self.src.lines[f"{at}.{key}"] = n.line
                    self.src.labels[f"{at}.{key}"] = n.where(a)
                return handler

            self.attributes(n, {"read": keep("read"), "write": keep("write"),
                                "admin": keep("admin"),
                                "groupClass": lambda a: group_class(n, a), **more})
            self.elements(n, {})

        def entry(n: _Node) -> None:
            at = f"auth.authorization.entries[{len(entries)}]"
            target: dict[str, Any] = {}
            temp = [a for a in ("tempQueue", "tempTopic") if a in n.attrs]
            if temp and not any(a in n.attrs for a in ("queue", "topic")):
                # ActiveMQ itself consults the tempDestinationAuthorizationEntry for
                # temporary destinations, never these.
                self.warn(n, f"<authorizationEntry {temp[0]}=...> has no effect (ActiveMQ "
                          "and meshmq use <tempDestinationAuthorizationEntry> for temporary "
                          "destinations); ignored")
                return

            def pattern(key: str) -> Callable[[str], None]:
                def handler(a: str) -> None:
                    target[key] = self.value(n, a)
                    self.src.lines[f"{at}.{key}"] = n.line
                    self.src.labels[f"{at}.{key}"] = n.where(a)
                return handler

            rights(n, at, target, {"queue": pattern("queue"), "topic": pattern("topic"),
                                   "tempQueue": lambda a: None, "tempTopic": lambda a: None})
            entries.append(target)

        def entry_list(n: _Node) -> None:
            self.attributes(n, {})
            self.elements(n, {"authorizationEntry": entry})

        def single(key: str, tag: str) -> Callable[[_Node], None]:
            def handler(wrapper: _Node) -> None:
                inner = self.bean(wrapper, tag)
                if inner is not None:
                    target: dict[str, Any] = {}
                    rights(inner, f"auth.authorization.{key}", target)
                    authz[key] = target
            return handler

        def authorization_map(n: _Node) -> None:
            self.attributes(n, {"groupClass": lambda a: group_class(n, a)})
            self.elements(n, {
                "authorizationEntries": entry_list,
                "defaultEntry": single("default", "authorizationEntry"),
                "tempDestinationAuthorizationEntry": single(
                    "temp", "tempDestinationAuthorizationEntry"),
            })

        def map_wrapper(n: _Node) -> None:
            self.attributes(n, {})
            for child in n.children:
                if child.tag in ("cachedLDAPAuthorizationMap", "simpleAuthorizationMap",
                                 "lDAPAuthorizationMap"):
                    # Ignoring it would leave every destination open: refuse to start.
                    raise self.fail(child, f"<{child.tag}> is not supported: write the "
                                    "rights as <authorizationMap><authorizationEntries>, or "
                                    "as [auth.authorization] in meshmq.toml")
            self.elements(n, {"authorizationMap": authorization_map})

        self.elements(node, {"map": map_wrapper})

    def redelivery_plugin(self, node: _Node) -> None:
        self.attributes(node, {}, frozenset({"fallbackToDeadLetter",
                                             "sendToDlqIfMaxRetriesExceeded"}))

        def policy(n: _Node, default: bool) -> None:
            dests = [(a, _DEST_ATTRS[a]) for a in n.attrs if a in ("queue", "topic")]
            self.attributes(n, {"maximumRedeliveries": lambda a: None, "queue": lambda a: None,
                                "topic": lambda a: None}, _REDELIVERY_IGNORED)
            count = (self.value(n, "maximumRedeliveries") if "maximumRedeliveries" in n.attrs
                     else "6")
            if count.strip() == "-1":
                count = str(UNLIMITED_REDELIVERIES)
            if default:
                self.default_redeliveries = (count, n)
            elif not dests:
                raise self.fail(n, "a redeliveryPolicy entry needs queue= or topic=")
            for attr, kind in dests:
                self.redeliveries.append((f"{kind}://{self.value(n, attr)}", count, n))

        def entries(n: _Node) -> None:
            self.attributes(n, {})
            self.elements(n, {"redeliveryPolicy": lambda p: policy(p, False)})

        def default_entry(n: _Node) -> None:
            self.attributes(n, {})
            self.elements(n, {"redeliveryPolicy": lambda p: policy(p, True)})

        def policy_map(n: _Node) -> None:
            inner = self.bean(n, "redeliveryPolicyMap")
            if inner is not None:
                self.attributes(inner, {})
                self.elements(inner, {"defaultEntry": default_entry,
                                      "redeliveryPolicyEntries": entries})

        self.elements(node, {"redeliveryPolicyMap": policy_map})

    # -- destination policies -------------------------------------------------

    def destination_policy(self, node: _Node) -> None:
        policy_map = self.bean(node, "policyMap")
        if policy_map is None:
            return
        self.attributes(policy_map, {})

        def entries(n: _Node) -> None:
            self.attributes(n, {})
            self.elements(n, {"policyEntry": lambda e: self.policy_entry(e, None)})

        def default_entry(n: _Node) -> None:
            entry = self.bean(n, "policyEntry")
            if entry is not None:  # the default entry covers every queue and topic
                self.policy_entry(entry, "queue://>")
                self.policy_entry(entry, "topic://>")

        self.elements(policy_map, {"policyEntries": entries, "defaultEntry": default_entry})

    def policy_entry(self, node: _Node, match: str | None) -> None:
        policy: dict[str, Any] = dict(_AMQ_POLICY_DEFAULTS)
        labels: dict[str, tuple[_Node, str | None]] = {}

        def keep(key: str, n: _Node = node) -> Callable[[str], None]:
            def handler(a: str) -> None:
                policy[key] = self.value(n, a)
                labels[key] = (n, a)
            return handler

        dests = [a for a in node.attrs if a in _DEST_ATTRS]
        if match is None:
            if len(dests) != 1:
                raise self.fail(node, "a <policyEntry> needs exactly one of queue=, topic=, "
                                "tempQueue= or tempTopic=")
            match = f"{_DEST_ATTRS[dests[0]]}://{self.value(node, dests[0])}"
            labels["match"] = (node, dests[0])
        policy["match"] = match
        self.attributes(node, {
            **{a: (lambda a: None) for a in _DEST_ATTRS},
            "memoryLimit": keep("memory_limit"),
            "prioritizedMessages": keep("prioritized_messages"),
            "producerFlowControl": keep("producer_flow_control"),
            "queuePrefetch": keep("queue_prefetch"),
            "topicPrefetch": keep("topic_prefetch"),
            "durableTopicPrefetch": keep("durable_topic_prefetch"),
            "queueBrowserPrefetch": keep("browser_prefetch"),
            "maxPageSize": keep("page_size"),
        }, _POLICY_IGNORED)
        is_topic = match.startswith(("topic://", "temp-topic://"))

        def individual(n: _Node) -> None:
            prefix_attr = "topicPrefix" if is_topic else "queuePrefix"
            policy["individual_dlq_prefix"] = ("ActiveMQ.DLQ.Topic." if is_topic
                                               else "ActiveMQ.DLQ.Queue.")
            labels["individual_dlq_prefix"] = (n, None)

            def use_queue(a: str) -> None:
                if self.value(n, a).lower() == "false":
                    self.warn(n, "useQueueForQueueMessages=false (dead-letter topics) is not "
                              "supported, a queue is used")

            self.attributes(n, {
                prefix_attr: keep("individual_dlq_prefix", n=n),
                "queuePrefix" if is_topic else "topicPrefix": lambda a: None,
                "useQueueForQueueMessages": use_queue,
                "processExpired": keep("expired_to_dlq", n=n),
                "processNonPersistent": keep("non_persistent_to_dlq", n=n),
            }, _DLQ_IGNORED)
            self.elements(n, {})

        def shared(n: _Node) -> None:
            self.attributes(n, {
                "processExpired": keep("expired_to_dlq", n=n),
                "processNonPersistent": keep("non_persistent_to_dlq", n=n),
            }, _DLQ_IGNORED)

            def dlq(d: _Node) -> None:
                queue = self.bean(d, "queue")
                if queue is not None:
                    self.attributes(queue, {"physicalName": keep("dead_letter_queue", n=queue)})

            self.elements(n, {"deadLetterQueue": dlq})

        def strategy(n: _Node) -> None:
            self.attributes(n, {})
            self.elements(n, {"individualDeadLetterStrategy": individual,
                              "sharedDeadLetterStrategy": shared},
                          frozenset({"discarding", "discardingDeadLetterStrategy"}))

        def bridge_filter(n: _Node) -> None:
            self.attributes(n, {})
            self.elements(n, {
                "conditionalNetworkBridgeFilterFactory": lambda f: self.bridge_filter(f, match),
                # The default factory is meshmq's default behaviour: nothing to set.
                "defaultNetworkBridgeFilterFactory": lambda f: self.attributes(f, {}),
            })

        self.elements(node, {"deadLetterStrategy": strategy,
                             "networkBridgeFilterFactory": bridge_filter}, _POLICY_LATER)
        self.policies.append((policy, node))
        self.src.lines[_scratch(policy)] = node.line
        self.src.labels[_scratch(policy)] = node.where()
        for key, (n, a) in labels.items():
            self.src.labels[f"{_scratch(policy)}.{key}"] = n.where(a)
            self.src.lines[f"{_scratch(policy)}.{key}"] = n.line

    # -- usage ----------------------------------------------------------------

    def system_usage(self, node: _Node) -> None:
        usage = self.bean(node, "systemUsage")
        if usage is None:
            return

        def fail_if_no_space(a: str) -> None:
            on = self.value(usage, a).lower() == "true"
            self.put("usage.on_limit", "fail" if on else "block", usage, a)

        self.attributes(usage, {
            "sendFailIfNoSpace": fail_if_no_space,
            # ActiveMQ blocks, then fails after this long: our "block" with a timeout.
            "sendFailIfNoSpaceAfterTimeout": lambda a: self.put(
                "usage.block_timeout_ms", self.value(usage, a), usage, a),
        }, frozenset({"id", "name", "checkLimitsLogLevel"}))

        def memory(n: _Node) -> None:
            inner = self.bean(n, "memoryUsage")
            if inner is None:
                return
            self.attributes(inner, {
                "limit": lambda a: self.put("usage.memory_limit", self.value(inner, a),
                                            inner, a),
            }, frozenset({"percentOfJvmHeap", "percentUsageMinDelta", "name",
                          "pollingTime"}))

        def store(n: _Node) -> None:
            inner = self.bean(n, "storeUsage")
            if inner is None:
                return
            self.attributes(inner, {
                "limit": lambda a: self.put("store.max_disk_bytes", self.value(inner, a),
                                            inner, a),
            }, frozenset({"percentLimit", "percentUsageMinDelta", "name", "pollingTime",
                          "total"}))

        self.elements(usage, {"memoryUsage": memory, "storeUsage": store},
                      frozenset({"tempUsage", "jobSchedulerUsage"}))

    # -- assembling -------------------------------------------------------------

    def finish_tls(self) -> None:
        """Network connectors dialing ssl:// use the broker's <sslContext> as in ActiveMQ
        (keyStore: this broker's certificate, trustStore: the CAs it trusts). A Java
        keystore cannot be read: a TLS connector that needs it is a config error."""
        tls_connectors = [i for i, c in enumerate(self.connectors)
                          if "ssl://" in str(c.get("uri", ""))]
        uses_tls = tls_connectors or any(lst["protocol"] in _TLS_PROTOCOLS
                                         for lst in self.listeners)
        if self.ssl_node is not None and uses_tls and self.ssl_unreadable:
            attr, location = self.ssl_unreadable[0]
            what = ("certificate and key" if attr == "keyStore"
                    else "CA certificates")
            raise self.fail(self.ssl_node, (
                f"{attr} {location!r} is a Java keystore, which meshmq cannot read, and "
                f"TLS connectors need it: convert it to PEM (keytool -importkeystore "
                f"-srckeystore {location} -destkeystore store.p12 -deststoretype PKCS12; "
                f"openssl pkcs12 -in store.p12 -nodes -out store.pem) and set {attr} to "
                f"the .pem file ({what})"), attr)
        if self.ssl_node is None:
            return
        for i in tls_connectors:
            for key, (location, attr) in self.ssl.items():
                self.connectors[i][key] = location
                self.src.lines[f"network_connectors[{i}].{key}"] = self.ssl_node.line
                self.src.labels[f"network_connectors[{i}].{key}"] = self.ssl_node.where(attr)

    def finish_link_auth(self) -> None:
        """Without an authentication plugin ActiveMQ admits anybody, broker links
        included; an imported broker keeps that for its broker-link connectors, and the
        broker warns at every start (ListenerConfig.allow_anonymous_links)."""
        if self.auth_plugin:
            return
        for i, listener in enumerate(self.listeners):
            if listener["protocol"] in _BRIDGE_PROTOCOLS:
                listener["allow_anonymous_links"] = True
                self.src.lines[f"listeners[{i}].allow_anonymous_links"] = \
                    self.src.lines.get(f"listeners[{i}]", 0)

    def finish(self, broker: _Node) -> None:
        self.finish_replicated()
        self.finish_ha()
        self.finish_tls()
        self.finish_link_auth()
        # <sslContext> is broker-wide in ActiveMQ: every TLS connector shares it.
        for i, listener in enumerate(self.listeners):
            if listener["protocol"] not in _TLS_PROTOCOLS or self.ssl_node is None:
                continue
            for key, (location, attr) in self.ssl.items():
                listener[key] = location
                self.src.lines[f"listeners[{i}].{key}"] = self.ssl_node.line
                self.src.labels[f"listeners[{i}].{key}"] = self.ssl_node.where(attr)
        for i, listener in enumerate(self.listeners):
            if listener["protocol"] in _BRIDGE_PROTOCOLS:
                log.info("%s:%s: transportConnector %r (%s://) becomes a meshmq broker-link "
                         "listener: it speaks meshmq's broker-to-broker wire protocol for "
                         "other meshmq brokers' network connectors, not OpenWire; Java "
                         "OpenWire/JMS clients cannot connect to it",
                         self.file or "<activemq.xml>", self.src.lines.get(f"listeners[{i}]"),
                         listener["name"], listener["protocol"])
        if not self.listeners:
            self.warn(broker, "no supported transport connector: the broker will accept no "
                      "connections")
        self.raw["listeners"] = self.listeners
        self.src.lines["listeners"] = broker.line
        if self.policies or self.redeliveries or self.default_redeliveries:
            self.raw["policies"] = self.assemble_policies(broker)
        self.assemble_connectors()

    def finish_ha(self) -> None:
        ha = self.raw.get("ha")
        if not ha:
            return
        if str(self.raw.get("broker", {}).get("persistent", "true")).lower() == "false" \
                or ha.get("mode") == "none":
            self.raw.pop("ha")  # nothing is stored, so there is nothing to share
            return
        keepalive = ha.get("keepalive_ms")
        if keepalive is not None and "lease_ms" not in ha and str(keepalive).isdigit():
            # ActiveMQ has no lease length for the file locker, and defaults the JDBC
            # lease (10 s) below its keep-alive (30 s); keep a lease of 3 renewals.
            self.raw["ha"]["lease_ms"] = str(max(5000, 3 * int(keepalive)))
            self.src.lines["ha.lease_ms"] = self.src.lines.get("ha.keepalive_ms", 1)
            self.src.labels["ha.lease_ms"] = self.src.labels.get("ha.keepalive_ms", "")

    def assemble_policies(self, broker: _Node) -> list[dict[str, Any]]:
        """Order entries the way ActiveMQ picks them (most specific first) and fold in
        redelivery settings, since meshmq keeps both in one first-match-wins list."""
        policies = [p for p, _ in self.policies]
        for kind in ("queue", "topic"):
            if not any(p["match"] == f"{kind}://>" for p in policies):
                policies.append({**_AMQ_POLICY_DEFAULTS, "match": f"{kind}://>"})
        for match, count, node in self.redeliveries:
            same = [p for p in policies if p["match"] == match]
            if not same:
                # Inherit what the policy map would give this destination.
                covering = sorted((p for p in policies if _covers(p["match"], match)),
                                  key=_specificity)
                base = dict(covering[0]) if covering else dict(_AMQ_POLICY_DEFAULTS)
                base["match"] = match
                policies.append(base)
                same = [base]
                self.src.lines[_scratch(base)] = node.line
                self.src.labels[_scratch(base)] = node.where()
            for policy in same:
                self.redelivery(policy, count, node)
        if self.default_redeliveries is not None:
            count, node = self.default_redeliveries
            for policy in policies:
                if "max_redeliveries" not in policy:
                    self.redelivery(policy, count, node)
        policies.sort(key=_specificity)
        # Policies were located under scratch names while their order was unknown.
        for i, policy in enumerate(policies):
            scratch = _scratch(policy)
            for key in [k for k in self.src.lines if k.split(".")[0] == scratch]:
                final = f"policies[{i}]{key[len(scratch):]}"
                self.src.lines[final] = self.src.lines.pop(key)
                if key in self.src.labels:
                    self.src.labels[final] = self.src.labels.pop(key)
            self.src.lines.setdefault(f"policies[{i}]", broker.line)
        return policies

    def redelivery(self, policy: dict[str, Any], count: str, node: _Node) -> None:
        policy["max_redeliveries"] = count
        self.src.lines[f"{_scratch(policy)}.max_redeliveries"] = node.line
        self.src.labels[f"{_scratch(policy)}.max_redeliveries"] = node.where(
            "maximumRedeliveries")


def _scratch(policy: Mapping[str, Any]) -> str:
    return f"#policy{id(policy)}"


def _specificity(policy: Mapping[str, Any]) -> tuple[int, int, int]:
    """Sort key: exact names first, then patterns with more literal segments, ``>`` last."""
    name = str(policy["match"]).partition("://")[2]
    segments = name.split(".")
    literal = sum(1 for s in segments if s not in ("*", ">"))
    return (1 if ">" in segments or "*" in segments else 0, -literal,
            1 if segments[-1] == ">" else 0)


def _covers(pattern: str, match: str) -> bool:
    p_kind, _, p_name = pattern.partition("://")
    m_kind, _, m_name = match.partition("://")
    return p_kind == m_kind and name_matches(p_name, m_name)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _unknown(kind: str, name: str, known: Any) -> str:
    msg = f"unknown {kind}"
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f"{msg}; did you mean {close[0]!r}?" if close else msg


def _libpq_quote(value: str) -> str:
    if value and not any(c.isspace() or c in "'\\" for c in value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _read_properties(text: str) -> dict[str, str]:
    """The subset of Java .properties that credentials files use: key=value lines."""
    props = {}
    for line in text.splitlines():
        m = re.match(r"\s*([^#!\s=:][^\s=:]*)\s*[=:\s]\s*(.*)", line)
        if m:
            props[m.group(1)] = m.group(2).strip()
    return props

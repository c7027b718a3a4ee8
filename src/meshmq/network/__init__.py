"""The network of brokers: links between brokers (docs/networks.md, docs/design.md
"The network of brokers").

``manager`` owns listeners, connectors and their bridges; ``bridge_state`` is the
bridge's sans-I/O state machine and ``bridge`` its asyncio driver; ``responder`` is the
accepting end; ``forwarder`` and ``receiver`` are the two halves of a link. Everything
here reaches the broker through ``host.BrokerHost`` and reads the core through
``meshmq.core.network_view``.
"""

"""A node: N shard processes that clients, peers and operators see as one broker
(docs/design.md, "Shards"). The supervisor binds the ports, starts and restarts the
shards and serves the node's management endpoint; only the command line imports this."""

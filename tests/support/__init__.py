"""Shared test helpers: in-process and subprocess brokers, polling, STOMP listeners."""

"""Typed, frozen configuration validated once (TOML native, activemq.xml importer)."""

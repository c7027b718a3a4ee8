"""Clients built on meshmq's own codecs (the failover client lands here)."""

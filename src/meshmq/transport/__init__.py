"""Thin asyncio adapters: listeners, one protocol object per connection."""

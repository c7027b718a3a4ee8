"""meshmq: an ActiveMQ-compatible message broker that forms networks of brokers.

Importing ``meshmq`` is cheap: it never imports asyncio adapters, pyspark or
optional dependencies. Subpackages are imported where they are used.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

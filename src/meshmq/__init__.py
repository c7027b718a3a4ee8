"""meshmq: an ActiveMQ-compatible message broker that forms networks of brokers.

Importing ``meshmq`` is cheap: it never imports asyncio adapters, pyspark or
optional dependencies. Subpackages are imported where they are used.

The supported entry points (everything else is internal and may change):

- the ``meshmq`` command (``meshmq.cli.main:main``) and its configuration files
  (docs/config.md);
- ``meshmq.__version__``;
- ``meshmq.client``: the failover clients, their options and errors (its ``__all__``),
  and ``meshmq.client.agent``, the Python Cartridge Agent compatibility layer;
- ``meshmq.errors``: the exception hierarchy rooted at ``MeshmqError``;
- ``meshmq.pipeline``: the PySpark trace audit and the Structured Streaming source
  (imported only when used; needs the ``spark`` extra).

tests/unit/test_public_api.py pins these names: changing them is a deliberate decision.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

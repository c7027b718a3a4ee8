"""``GET /metrics``: the broker's figures for Prometheus (management/metrics.py lists
them), in the text format or OpenMetrics when the scraper's Accept header asks for it.

A registry per request holds only this broker's collector, so several brokers in one
process never mix their series; collecting reads state already kept, on the loop.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from meshmq.management.api import runtime_of
from meshmq.management.metrics import BrokerCollector

routes = web.RouteTableDef()


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(runtime_of(request)))
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return web.Response(body=encode(registry), headers={"Content-Type": content_type})

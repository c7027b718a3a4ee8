from tests.interop.conftest import client

__all__ = ["client"]

"""Persistence behind one contract (``meshmq.store.base.Store``)."""

"""Routing to schedulers: each one's client and health, the router, the pool, stream failover."""

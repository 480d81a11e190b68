"""The web layer: the router, SSE, dependencies and console info (thin clients of the core)."""

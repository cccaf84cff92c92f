"""Backends an alias can be served by, beyond the local engine: upstream servers and pools.

    base.py       the seam: a Call, the Backend protocol, Retryable, in-flight tracking
    health.py     one server's health state machine and counts (pure)
    upstream.py   an OpenAI-compatible server: forward the body, relay the bytes
    pool.py       the members of one alias: least_busy / round_robin, the one retry; local members
    upstreams.py  every server of the config: probing, discovery, reloads, rows
    dispatch.py   what the routes call: an alias -> the local path or a pool
"""

"""Whether a config may listen where it is asked to: the admin routes (/admin/*, the router
API) answer anyone while no key is configured, which is fine on loopback and not on 0.0.0.0
(the Docker image's bind). `modelyard serve` refuses such a start (exit 2) with this message.
"""
from __future__ import annotations

import ipaddress

from gateway.config.schema import Config


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; any other name or address counts as exposed."""
    if host.strip("[]").lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def open_admin_problem(config: Config, host: str) -> str | None:
    """Why serving `config` on `host` would expose the admin routes to anyone, or None."""
    if is_loopback(host) or config.auth.enabled or config.auth.admin_closed:
        return None  # with any key configured, /admin/* takes only auth.admin_key
    return (f"refusing to listen on {host} with the admin routes open: no API key is "
            "configured, so anyone who can reach this address could load, unload and "
            "reconfigure models; set auth.admin_key (or admin_key_file) in the config, or "
            "listen on 127.0.0.1")


def close_admin_if_exposed(config: Config, host: str) -> Config:
    """`config` with its admin routes closed when it would serve them open on a non-loopback
    address: for serving files or a folder without a config (no key to guard them with), which
    then starts, public API open and admin routes answering 403, instead of refusing to."""
    if is_loopback(host) or config.auth.enabled:
        return config
    return config.model_copy(update={"auth": config.auth.model_copy(update={"admin_closed": True})})

"""modelyard's version, for every layer of the gateway (build info, fingerprints, the CLI).

A leaf module: it imports nothing of the gateway, so anything may import it without a cycle.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

UNKNOWN = "0+unknown"  # running from a tree that was never installed


def version() -> str:
    try:
        return package_version("modelyard")
    except PackageNotFoundError:
        return UNKNOWN

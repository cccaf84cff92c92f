"""Human-friendly durations and sizes for the config file: `30s`, `10m`, `1h`, `512MiB`, `4GiB`.

Both parsers accept a plain number too (seconds, bytes) and raise ValueError with a message that
shows what is accepted, so the config loader can hand it to the user unchanged.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping

DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# IEC units are powers of 1024, SI units powers of 1000; a bare K/M/G/T means the IEC unit,
# like docker and llama-swap read them.
SIZE_UNITS = {
    "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
}
NUMBER = r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+"  # also in the config's JSON Schema
_NUMBER_UNIT = re.compile(rf"\s*({NUMBER})\s*([a-zA-Z]*)\s*")

DURATION_HINT = "use seconds or a number with a unit: 500ms, 30s, 10m, 1h, 1d"
SIZE_HINT = "use bytes or a number with a unit: 512MiB, 4GiB, 2GB"


def parse_duration(value: object) -> float:
    """Seconds from `30s`, `10m`, `1.5h`, `500ms`, `1d`, or a plain non-negative number of seconds."""
    seconds = _parse(value, DURATION_UNITS, "duration", DURATION_HINT, default_unit="s")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from `512MiB`, `4GiB`, `2GB`, `1.5G`, or a plain non-negative number of bytes."""
    size = _parse(value, SIZE_UNITS, "size", SIZE_HINT, default_unit="b")
    return round(size)


def _parse(value: object, units: Mapping[str, float], what: str, hint: str,
           default_unit: str) -> float:
    # bool is an int subclass; `idle_timeout: yes` is a mistake, not one second
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"invalid {what} {value!r}: {hint}")
    if isinstance(value, (int, float)):
        number, unit = float(value), default_unit
    else:
        match = _NUMBER_UNIT.fullmatch(value)
        if match is None:
            raise ValueError(f"invalid {what} {value!r}: {hint}")
        number, unit = float(match.group(1)), (match.group(2).lower() or default_unit)
        if unit not in units:
            raise ValueError(f"invalid {what} {value!r}: unknown unit {match.group(2)!r}; {hint}")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"invalid {what} {value!r}: must be a finite number >= 0")
    return number * units[unit]


def format_size(n_bytes: int) -> str:
    """`4.0 GiB`-style text for messages and logs."""
    size = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def format_duration(seconds: float) -> str:
    """`90s` -> `1m30s`-style text for messages and logs."""
    if seconds < 60:
        return f"{seconds:g}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts)


LISTEN_HINT = 'use "HOST:PORT" ("127.0.0.1:11434", "[::1]:11434") or a port alone'


def parse_listen(value: str, default_host: str) -> tuple[str, int]:
    """(host, port) from `HOST:PORT`, `[V6]:PORT` or `PORT` (then on `default_host`)."""
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = default_host, text
    host = host.strip("[]") if host.startswith("[") else host
    if not host or (":" in host and not text.startswith("[")) or not port_text.isdigit() \
            or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{value!r} is not an address to listen on: {LISTEN_HINT} "
                         "(port 1-65535)")
    return host, int(port_text)

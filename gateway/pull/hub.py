"""Hugging Face's hub as `modelyard pull` reads it, with the hub's own environment variables:
HF_ENDPOINT (default https://huggingface.co) and HF_TOKEN (sent as a bearer token; httpx drops
it on a redirect to another host, the CDN, as the hub's own client does).

    GET {endpoint}/api/models/{repo}/tree/{rev}?recursive=true -> files, with lfs.oid (sha256)
    GET {endpoint}/{repo}/resolve/{rev}/{path} -> 302 to the CDN (X-Linked-Etag: the sha256)
        -> 200, or 206 from `Range: bytes=N-` when a partial download is resumed

One download, a small state machine:

    .NAME.part exists? --yes--> hash its bytes, ask from its size (Range)
          | no                      | 206: append            | 200: start over (no ranges)
          v                         v                        v
        ask from 0 -------------> write, hashing, progress bar --dropped--> .part kept (resume)
                                    | done
                                    v
                   sha256 == the hub's? --no--> .part deleted, PullError
                                    | yes
                                    v
                       renamed to NAME by the caller, once every file of the model is there
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

DEFAULT_ENDPOINT = "https://huggingface.co"
CHUNK = 1 << 20
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class HubError(Exception):
    """The hub refused or failed; the message explains what to do."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int | None
    sha256: str | None   # the tree's lfs.oid; None for a file kept outside LFS


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _headers() -> dict[str, str]:
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def client() -> httpx.Client:
    return httpx.Client(follow_redirects=True, headers=_headers(),
                        timeout=httpx.Timeout(60.0, connect=10.0))


def explain(status: int, what: str, repo: str) -> HubError:
    page = f"{endpoint()}/{repo}"
    if status == 401 or status == 403:
        has_token = bool(_headers())
        why = ("the token in HF_TOKEN is not allowed to read it" if has_token
               else "it needs a token: set HF_TOKEN to an access token of yours")
        return HubError(f"{what}: the hub answered {status}: the repository is gated or private "
                        f"and {why} (for a gated model, accept its terms on {page} first)")
    if status == 404:
        return HubError(f"{what}: not found on {endpoint()} (answered 404): check the "
                        f"repository name ({page}) and the file or quantization asked for")
    return HubError(f"{what}: the hub answered {status}")


def list_files(http: httpx.Client, repo: str, revision: str) -> list[RemoteFile]:
    url = f"{endpoint()}/api/models/{repo}/tree/{revision}"
    try:
        answer = http.get(url, params={"recursive": "true"})
    except httpx.HTTPError as e:
        raise HubError(f"cannot reach {endpoint()}: {e} (offline? HF_ENDPOINT names a mirror)") \
            from None
    if answer.status_code != 200:
        raise explain(answer.status_code, f"listing {repo}", repo)
    files: list[RemoteFile] = []
    for item in answer.json():
        if item.get("type") != "file":
            continue
        lfs: dict[str, Any] = item.get("lfs") or {}
        oid = str(lfs.get("oid", "")).lower()
        files.append(RemoteFile(item["path"], lfs.get("size", item.get("size")),
                                oid if SHA256.match(oid) else None))
    return files


def _header_sha256(response: httpx.Response) -> str | None:
    """The sha256 the hub says in X-Linked-Etag (on its redirect) or ETag (an LFS file)."""
    for r in [*response.history, response]:
        for name in ("x-linked-etag", "etag"):
            value = str(r.headers.get(name, "")).removeprefix("W/").strip('"').lower()
            if SHA256.match(value):
                return value
    return None


def download(http: httpx.Client, repo: str, revision: str, remote: RemoteFile, part: Path,
             progress: Any) -> None:
    """Fetch `remote` into `part`, resuming what is there; HubError says why it could not.
    `progress(total, done)` makes the bar: called once, it returns a callable taking sizes."""
    url = f"{endpoint()}/{repo}/resolve/{revision}/{remote.path}"
    digest = hashlib.sha256()
    have = part.stat().st_size if part.exists() else 0
    if have:
        with open(part, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        with http.stream("GET", url, headers=headers) as answer:
            if answer.status_code == 416 and remote.size == have:  # complete already
                pass
            elif answer.status_code not in (200, 206):
                raise explain(answer.status_code, remote.path, repo)
            else:
                if answer.status_code == 200 and have:  # the server ignored the range
                    have, digest = 0, hashlib.sha256()
                expected = remote.sha256 or _header_sha256(answer)
                if remote.sha256 and (said := _header_sha256(answer)) and said != remote.sha256:
                    raise HubError(f"{remote.path}: the hub's listing says sha256 "
                                   f"{remote.sha256} but its download says {said}")
                total = remote.size or (have + int(answer.headers.get("content-length", 0)))
                advance = progress(remote.path.rsplit("/", 1)[-1], total, have)
                with open(part, "ab" if have else "wb") as out:
                    for chunk in answer.iter_bytes():  # as it arrives: a drop keeps all it got
                        out.write(chunk)
                        digest.update(chunk)
                        advance(len(chunk))
                remote = RemoteFile(remote.path, remote.size, expected)
    except httpx.HTTPError as e:
        raise HubError(f"{remote.path}: the download broke off ({e}); run the same pull again "
                       f"to resume from the {part.stat().st_size if part.exists() else 0} bytes "
                       "kept") from None
    if remote.size is not None and part.stat().st_size != remote.size:
        raise HubError(f"{remote.path}: got {part.stat().st_size} of {remote.size} bytes; run "
                       "the same pull again to resume")
    if remote.sha256 is None:
        return  # nothing published to check it by (a file outside LFS): the size had to do
    if digest.hexdigest() != remote.sha256:
        part.unlink()
        raise HubError(f"{remote.path}: sha256 {digest.hexdigest()} is not the {remote.sha256} "
                       "the hub publishes; the download was deleted")

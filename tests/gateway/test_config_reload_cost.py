"""A config reload reads only the headers of files that changed, however many entries it has
(issue #33 item 7): the servability answers are remembered per path and file identity, not in
a small fixed number of slots that a big config overflows."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import engine.servable
from gateway.config import ConfigError, load_config
from tests.support.ggufgen import write_servable

N_FILES = 300  # more than the 256 answers the header check used to keep


def _config(root: Path, n_files: int, entries_per_file: int = 1) -> Path:
    lines = ["models:"]
    for i in range(n_files):
        write_servable(root / f"m{i}.gguf")
        for j in range(entries_per_file):
            lines += [f"  - model: m{i}.gguf", f"    aliases: [e{i}-{j}]"]
    path = root / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def header_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every header the servability check reads, in order."""
    reads: list[Path] = []
    real = engine.servable.read_header

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(engine.servable, "read_header", counting)
    return reads


def test_an_unchanged_reload_reads_no_header(tmp_path: Path, header_reads: list[Path]) -> None:
    config = _config(tmp_path, N_FILES)
    assert len(load_config(config).models) == N_FILES
    assert len(header_reads) == N_FILES  # the first load reads each file once
    header_reads.clear()
    assert len(load_config(config).models) == N_FILES
    assert header_reads == []


def test_a_reload_reads_only_the_changed_file(tmp_path: Path, header_reads: list[Path]) -> None:
    config = _config(tmp_path, N_FILES)
    load_config(config)
    changed = tmp_path / "m7.gguf"
    st = changed.stat()
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # same bytes, newer
    header_reads.clear()
    load_config(config)
    assert header_reads == [changed.resolve()]


def test_entries_sharing_a_file_read_it_once(tmp_path: Path, header_reads: list[Path]) -> None:
    config = _config(tmp_path, 3, entries_per_file=20)
    assert len(load_config(config).models) == 60
    assert sorted(header_reads) == sorted((tmp_path / f"m{i}.gguf").resolve() for i in range(3))


def test_the_remembered_answers_stay_bounded(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             header_reads: list[Path]) -> None:
    monkeypatch.setattr(engine.servable, "MAX_REMEMBERED", 4)
    files = [write_servable(tmp_path / f"b{i}.gguf") for i in range(6)]
    for f in files:
        assert engine.servable.why_not_servable(f) is None
    header_reads.clear()
    for f in files[2:]:  # the four most recent are remembered
        engine.servable.why_not_servable(f)
    assert header_reads == []
    engine.servable.why_not_servable(files[0])  # the oldest was forgotten: read again
    assert header_reads == [files[0].resolve()]


def test_a_file_replaced_by_another_of_the_same_size_and_mtime_is_read_again(
        tmp_path: Path, header_reads: list[Path]) -> None:
    """Size and mtime alike (a copy made with `cp -p`, then moved over): the inode tells."""
    config = _config(tmp_path, 3)
    load_config(config)
    target = tmp_path / "m1.gguf"
    st = target.stat()
    copy = write_servable(tmp_path / "copy.tmp")
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    copy.replace(target)
    new = target.stat()
    assert (new.st_size, new.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert new.st_ino != st.st_ino
    header_reads.clear()
    load_config(config)
    assert header_reads == [target.resolve()]


def test_an_edited_file_is_judged_anew_on_reload(tmp_path: Path) -> None:
    """The remembered answer is for the bytes it was given: a file made unservable between two
    loads fails the second with its reason, and made whole again passes the third."""
    config = _config(tmp_path, 2)
    load_config(config)
    target = tmp_path / "m0.gguf"
    good, mtime = target.read_bytes(), target.stat().st_mtime_ns

    def rewrite(data: bytes, seconds_later: int) -> None:
        # an in-place rewrite of the same size: only the mtime tells, and two writes within a
        # filesystem's timestamp granularity could share one, so each is dated explicitly
        target.write_bytes(data)
        os.utime(target, ns=(mtime, mtime + seconds_later * 1_000_000_000))

    rewrite(good.replace(b"llama.block_count", b"llama.block_cOunt"), 1)
    with pytest.raises(ConfigError, match=r"m0\.gguf.*block_count"):
        load_config(config)
    rewrite(good, 2)
    assert len(load_config(config).models) == 2

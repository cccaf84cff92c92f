"""Compile LLVM IR for this CPU with llvmlite, caching object code on disk.

Kernels are compiled once, at model load, never during a request. The cache key is the IR text
plus everything that changes the machine code (CPU name, CPU features, llvmlite version), so a
cached object is only ever loaded on a machine that could have produced it.

Building the IR text itself costs tens of milliseconds for some modules, so `compile_cached`
also remembers which object a builder produced for given parameters, keyed by the builder's
name and parameters and a fingerprint of the kernel sources: a warm load skips the IR entirely,
and any edit to the sources sends it back to building (and compiling, if the IR changed).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llvmlite
import llvmlite.binding as llvm

log = logging.getLogger(__name__)
report_log = logging.getLogger("modelyard.kernels")  # what a user sees while a load compiles
REPORT_EVERY = 2.0  # seconds between progress lines while compiling

_init_lock = threading.Lock()
_initialized = False


def _init() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _initialized = True


@functools.cache
def host_cpu() -> tuple[str, str]:
    """(cpu name, feature string) of the machine we run on (asking LLVM takes ~0.2 ms)."""
    _init()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def host_has(feature: str) -> bool:
    """True when the host CPU has `feature` (an LLVM feature name such as 'avx2')."""
    return f"+{feature}" in host_cpu()[1].split(",")


def cache_dir() -> Path:
    root = os.environ.get("MODELYARD_CACHE") or os.path.join(Path.home(), ".cache", "modelyard")
    return Path(root) / "kernels"


def _target_machine() -> llvm.TargetMachine:
    # MCJIT takes ownership of its target machine: always hand it a fresh one.
    cpu, features = host_cpu()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=cpu, features=features, opt=3, codemodel="jitdefault")


def cache_key(ir_text: str) -> str:
    cpu, features = host_cpu()
    h = hashlib.sha256()
    for part in (ir_text, cpu, features, llvmlite.__version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


# A module whose text holds this line is compiled without LLVM's machine scheduler: for the
# row-interleaved K-quant tiles it hoisted a block's unpacked quants ahead of their dot
# products and spilled them (engine.kernels.gemm). LLVM's options are process-wide; every
# compile holds _lib_lock, so the option is set for this module's code generation alone.
NO_MACHINE_SCHEDULER = "; modelyard: compile without the machine scheduler\n"


def _optimize_to_object(ir_text: str) -> bytes:
    if NO_MACHINE_SCHEDULER not in ir_text:
        return _emit(ir_text)
    llvm.set_option("", "-enable-misched=false")
    try:
        return _emit(ir_text)
    finally:
        llvm.set_option("", "-enable-misched=true")


def _emit(ir_text: str) -> bytes:
    tm = _target_machine()
    mod = llvm.parse_assembly(ir_text)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    obj: bytes = tm.emit_object(mod)
    return obj


def _store(path: Path, data: bytes) -> None:
    """Write a cache file atomically (a concurrent reader sees all or nothing). The cache only
    saves time: where it cannot be written (read-only, full), the kernels still compile and run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("kernel cache not written (%s): %s", path, e)


CFunction = Callable[..., Any]
"""A compiled function called through ctypes (`CompiledLibrary.function`)."""


class CompiledLibrary:
    """Machine code for one IR module, loaded into this process."""

    def __init__(self, ir_text: str | None, *, key: str | None = None) -> None:
        """Compile ir_text (or load its cached object); with ir_text None, the cached object
        `key` (see compile_cached)."""
        _init()
        self.key: str = cache_key(ir_text) if ir_text is not None else str(key)
        path = cache_dir() / f"{self.key}.o"
        self.from_cache = path.is_file()
        if self.from_cache:
            obj = path.read_bytes()
        elif ir_text is None:
            raise FileNotFoundError(path)
        else:
            reporter = getattr(_reporting, "reporter", None)
            if reporter is not None:
                reporter.starting()
            obj = _optimize_to_object(ir_text)
            _store(path, obj)
            if reporter is not None:
                reporter.compiled()
        triple = llvm.get_process_triple()
        empty = llvm.parse_assembly(f'target triple = "{triple}"\n')
        self._engine = llvm.create_mcjit_compiler(empty, _target_machine())
        self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self._engine.finalize_object()
        self._functions: dict[str, CFunction] = {}

    def address(self, name: str) -> int:
        addr: int = self._engine.get_function_address(name)
        if not addr:
            raise KeyError(f"compiled module has no function {name!r}")
        return addr

    def function(self, name: str, restype: type | None, *argtypes: type) -> CFunction:
        fn = self._functions.get(name)
        if fn is None:
            fn = ctypes.CFUNCTYPE(restype, *argtypes)(self.address(name))
            self._functions[name] = fn
        return fn


class CompileReport:
    """Says, for one load, that kernels are being compiled (only a cold cache compiles), how
    far it got every REPORT_EVERY seconds, and how long it took; silent when all was cached."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.count = 0
        self.started: float | None = None
        self.last_said = 0.0

    def starting(self) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = self.last_said = now
            report_log.info("compiling kernels for %s (first run only; cached in %s)",
                            self.label, cache_dir())
        elif now - self.last_said >= REPORT_EVERY:
            self.last_said = now
            report_log.info("compiling kernels for %s: %d compiled so far (%.0fs)",
                            self.label, self.count, now - self.started)

    def compiled(self) -> None:
        self.count += 1

    def finish(self) -> None:
        if self.started is not None:
            report_log.info("compiled %d kernels for %s in %.1fs", self.count, self.label,
                            time.monotonic() - self.started)


_reporting = threading.local()


@contextlib.contextmanager
def reporting(label: str) -> Iterator[CompileReport]:
    """Report the kernels compiled on this thread while the block runs (a model's load). Inside
    another report (warmup's around a load) the outer one goes on counting."""
    outer: CompileReport | None = getattr(_reporting, "reporter", None)
    if outer is not None:
        yield outer
        return
    report = _reporting.reporter = CompileReport(label)
    try:
        yield report
    finally:
        _reporting.reporter = None
        report.finish()


_libraries: dict[str, CompiledLibrary] = {}
_lib_lock = threading.Lock()
_SOURCES = ("kernels/**/*.py", "formats/*.py")  # what the IR builders read
_sources_digest: str | None = None


def _sources_fingerprint() -> str:
    global _sources_digest
    if _sources_digest is None:
        root = Path(__file__).resolve().parents[1]  # engine/
        h = hashlib.sha256()
        for pattern in _SOURCES:
            for path in sorted(root.glob(pattern)):
                h.update(path.name.encode())
                h.update(path.read_bytes())
        _sources_digest = h.hexdigest()
    return _sources_digest


def compile_ir(ir_text: str) -> CompiledLibrary:
    """Compile (or load from the disk cache) an IR module; one instance per IR text per process."""
    key = cache_key(ir_text)
    with _lib_lock:
        lib = _libraries.get(key)
        if lib is None:
            lib = CompiledLibrary(ir_text)
            _libraries[key] = lib
        return lib


def compile_cached(name: str, params: tuple[object, ...], build: Callable[[], str]) -> CompiledLibrary:
    """compile_ir(build()), where a warm cache finds the object without calling `build`.

    `params` must be everything `build` depends on besides the kernel sources and the host CPU.
    """
    cpu, features = host_cpu()
    h = hashlib.sha256()
    for part in (name, repr(params), _sources_fingerprint(), cpu, features, llvmlite.__version__):
        h.update(part.encode())
        h.update(b"\0")
    index = cache_dir() / "index" / h.hexdigest()[:32]
    with _lib_lock:
        lib = _libraries.get(index.name)
        if lib is not None:
            return lib
    try:
        key = index.read_text().strip()
    except OSError:
        key = ""
    if len(key) == 32 and (cache_dir() / f"{key}.o").is_file():
        with _lib_lock:
            lib = _libraries.get(key)
            if lib is None:
                lib = _libraries[key] = CompiledLibrary(None, key=key)
            _libraries[index.name] = lib
            return lib
    lib = compile_ir(build())
    _store(index, lib.key.encode())
    with _lib_lock:
        _libraries[index.name] = lib
    return lib


def host_cpu_is_x86() -> bool:
    """True on x86-64 (or 32-bit x86) hosts, where `pause` and the AVX2 kernels exist."""
    return llvm.get_process_triple().split("-")[0] in ("x86_64", "i386", "i686")

"""numpy's BLAS kept to one thread while the engine computes around it.

The encoder's attention (engine/encoder.py) multiplies small per-head matrices with numpy, whose
OpenBLAS would start threads of its own: on a machine whose cores the engine's worker pool
already keeps busy, they contend (its spinning threads against the pool's) and a 10 ms product
took a second (8 BERT-base texts: attention 0.15 s single-threaded, 4.5-16 s threaded). The
pool is the engine's parallelism, so BLAS runs on the calling thread. Found the way threadpoolctl
finds it (the loaded library's set_num_threads symbol); a numpy without OpenBLAS is left alone.
"""
from __future__ import annotations

import ctypes
import functools

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_", "openblas_set_num_threads")


@functools.cache
def single_threaded_blas() -> bool:
    """Set numpy's OpenBLAS to one thread (once); whether one was found."""
    import numpy  # noqa: F401, PLC0415  (its BLAS is loaded with it)

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return False
    done = False
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(1))
                done = True
                break
    return done

"""engine.float_products: an encoder layer's F16/F32 groups (Q, K, V with biases as one product)
on the FMA panel GEMM everywhere, and F16 groups on the AMX tiles where the CPU has them, each
against an independent float64 product of what ggml multiplies (an F16 weight's input rounded
to f16) and the AMX path against its numpy twin; what the packed copies add, as counted and as
the header-only estimate says."""
from __future__ import annotations

import numpy as np
import pytest

from engine.float_products import FloatProducts, amx_added_bytes
from engine.formats import quants
from engine.formats.ggml_types import GGMLQuantizationType as T
from engine.kernels import amx_gemm
from engine.kernels.amx_gemm import reference_f16_input
from engine.kernels.pool import Pool

MODES = [False] + ([True] if amx_gemm.available() else [])
IDS = ["fma", "amx"][:len(MODES)]


def _matrix(a: np.ndarray) -> quants.QuantMatrix:
    qtype = T.F16 if a.dtype == np.float16 else T.F32
    return quants.QuantMatrix(np.ascontiguousarray(a).view(np.uint8).reshape(a.shape[0], -1),
                              qtype, a.shape[0], a.shape[1])


def _group(dtype: type, widths: list[int], k: int, seed: int = 0
           ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((n, k)) * 0.05).astype(dtype) for n in widths]
    bs: list[np.ndarray | None] = [(rng.standard_normal(n) * 0.1).astype(np.float32) for n in widths]
    bs[1] = None  # a member without a bias
    return ws, bs


@pytest.mark.parametrize("amx", MODES, ids=IDS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_a_group_is_each_members_product_plus_its_bias(amx: bool, threads: int, dtype: type) -> None:
    ws, bs = _group(dtype, [96, 64, 160], 200)
    x = (np.random.default_rng(1).standard_normal((150, 200)) * 2).astype(np.float32)
    ms = [_matrix(w) for w in ws]
    with Pool(threads) as pool:
        fp = FloatProducts(pool, threads, amx=amx)
        try:
            assert fp.pack(list(zip(ms, bs)), file_backed=False) and fp.covers(ms)
            outs = fp.matmul(ms, x)
        finally:
            fp.close()
    rounded = x.astype(np.float16).astype(np.float64) if dtype == np.float16 else x.astype(np.float64)
    for w, b, got in zip(ws, bs, outs):
        bias = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
        magnitude = np.abs(rounded) @ np.abs(w.astype(np.float64)).T + np.abs(bias) + 1e-30
        want = rounded @ w.astype(np.float64).T + bias
        assert got.shape == (150, w.shape[0])
        assert np.all(np.abs(got - want) <= 2.0 ** -14 * magnitude)
        if amx and dtype == np.float16:  # the AMX path's own twin, to f32's summation error
            twin = reference_f16_input(w, x) + bias
            assert np.all(np.abs(got - twin) <= 4 * 200 * np.finfo(np.float32).eps * magnitude)


@pytest.mark.parametrize("amx", MODES, ids=IDS)
def test_the_added_bytes_are_the_amx_halves_and_the_estimate_says_so(amx: bool) -> None:
    k = 200  # columns padded to 224 on AMX; rows 96 + 64 + 160 = 320 (five 64-row panels)
    ws, bs = _group(np.float16, [96, 64, 160], k)
    ms = [_matrix(w) for w in ws]
    with Pool(1) as pool:
        fp = FloatProducts(pool, 1, amx=amx)
        fp.pack(list(zip(ms, bs)), file_backed=False)
        added = fp.added_bytes
        fp.close()
    names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]
    table = {n: (T.F16, w.shape[0], w.shape[1]) for n, w in zip(names, ws)}
    if amx:
        assert added == 4 * 320 * 224 - 2 * 320 * k == amx_added_bytes(table)
    else:
        assert added == 0  # F16 panels of whole 64-row panels: the file's bytes
    assert amx_added_bytes({"token_embd.weight": (T.F16, 320, k),
                            "blk.0.ffn_up.weight": (T.F32, 320, k)}) == 0

"""Q2_K, Q3_K (and llama.cpp's Q3_K_M mix), IQ4_NL and IQ4_XS against llama.cpp, on the tiny
random-weight llamas of tests/data/synth (README there: how they were made, how close is close).

Every 2D tensor of a file has the named type (the mix: Q3_K/Q4_K/Q5_K/Q6_K), so a wrong
dequantization or dot product shows at once: these types sit 4-13 logits away from their F32
originals, against tolerances of 0.5. llama.cpp made the references with flash attention off,
so the engine runs them with flash_attn=False; the tolerances are the manifest's own.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from engine.formats.ggml_types import GGMLQuantizationType as Q
from engine.formats.repack import RepackedMatrix
from engine.kernels import gemm, jit
from engine.model import Chunk
from tests.support.ggufgen import tensor_type_field
from tests.support.refs import SYNTH_DIR

MANIFEST = json.loads((SYNTH_DIR / "manifest.json").read_text())
ENTRIES = {e["file"][:-len(".gguf")]: e for e in MANIFEST["models"] if e["arch"] == "llama"}
NAMES = ["llama_d256_kq_q2_k", "llama_d256_kq_q3_k_s", "llama_d256_kq_q3_k_m_mixed",
         "llama_d256_kq_iq4_nl", "llama_d256_kq_iq4_xs"]
NEAR_TIE = 0.1  # a greedy split is allowed only where llama.cpp's top two are this close


def _load(name: str, **kw) -> engine.Model:
    return engine.load(SYNTH_DIR / f"{name}.gguf", n_ctx=128, n_threads=2, flash_attn=False, **kw)


def _assert_within(ours: np.ndarray, ref: np.ndarray, tol: dict, what: str) -> None:
    diff = np.abs(ours - ref)
    agree = int((ours.argmax(-1) == ref.argmax(-1)).sum())
    print(f"{what}: max {diff.max():.2e} mean {diff.mean():.2e} top-1 {agree}/{len(ref)}")
    assert diff.max() <= tol["max_abs"], what
    assert diff.mean() <= tol["mean_abs"], what
    assert agree >= tol["top1_agree_min"], what


def test_the_files_cover_every_new_type() -> None:
    assert set(NAMES) == set(ENTRIES)
    for name in NAMES:  # the engine reads each tensor as the type llama.cpp wrote
        with _load(name) as model:
            w = model.transformer.weights
            got = {"token_embd.weight": w.token_embd.qtype.name}
            for i, layer in enumerate(w.layers):
                for key, m in (("attn_q", layer.wq), ("attn_k", layer.wk), ("attn_v", layer.wv),
                               ("attn_output", layer.wo), ("ffn_gate", layer.w_gate),
                               ("ffn_up", layer.w_up), ("ffn_down", layer.w_down)):
                    got[f"blk.{i}.{key}.weight"] = m.qtype.name
        assert got == ENTRIES[name]["tensor_types"], name
    mixed = set(ENTRIES["llama_d256_kq_q3_k_m_mixed"]["tensor_types"].values())
    assert mixed == {"Q3_K", "Q4_K", "Q5_K", "Q6_K"}


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_llama_cpp_batched_and_sequential(name: str) -> None:
    ref = np.load(SYNTH_DIR / f"{name}.npz")
    ids = ref["ids"].tolist()
    with _load(name, n_slots=2) as model:
        tr = model.transformer
        batched = tr.forward([Chunk(0, ids, 0)], "all")[0]                          # [40, n_vocab]
        sequential = np.stack([tr.forward([Chunk(1, [t], i)], "last")[0] for i, t in enumerate(ids)])
    tol = ENTRIES[name]["suggested_tolerance"]
    _assert_within(batched, ref["logits"], tol, f"{name} batched")
    _assert_within(sequential, ref["logits_sequential"], tol, f"{name} sequential")
    # Position 0 sees one key (attention is the identity on v there), so its logits are the
    # matmuls' alone: ours take llama.cpp's activation blocks and integer sums, up to float order.
    np.testing.assert_allclose(batched[0], ref["logits"][0], rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_tokens_match_llama_cpp_until_a_near_tie(name: str) -> None:
    ref = np.load(SYNTH_DIR / f"{name}.npz")
    ids, want = ref["ids"].tolist(), ref["greedy"].tolist()
    margins = ENTRIES[name]["logit_stats"]["greedy_top1_top2_margins"]
    with _load(name) as model:
        got = list(model.generate(ids, max_tokens=len(want), stop_at_eog=False))
    tie = next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(want))
    assert got[:tie] == want[:tie], f"llama.cpp {want}, ours {got} (first near-tie at step {tie})"


def test_every_instruction_selection_gives_the_same_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels are picked at run time from the CPU's features: a host with AVX2 only (no
    VNNI, no AVX-512 row pairs) and one without AVX2 (portable IR) compute the same bits. The
    exceptions are by design: where such a host keeps a type in the file's layout that this one
    repacks, and the two kernels round differently (not gemm.FILE_LAYOUT_BITS: the interleaved
    kernel sums a block whole in integers, the file layout in 8 lanes), it stays within
    llama.cpp's tolerance instead."""
    real = jit.host_has
    types = {"llama_d256_kq_q2_k": Q.Q2_K, "llama_d256_kq_q3_k_s": Q.Q3_K,
             "llama_d256_kq_q3_k_m_mixed": Q.Q3_K, "llama_d256_kq_iq4_nl": Q.IQ4_NL,
             "llama_d256_kq_iq4_xs": Q.IQ4_XS}
    assert set(types) == set(NAMES)

    def repacked(model: engine.Model, q: Q) -> bool:
        mats = model.transformer.weights.matrices()
        return any(isinstance(m, RepackedMatrix) and m.qtype == q for m in mats)

    fast, repacked_here = {}, {}
    for name in NAMES:
        ids = np.load(SYNTH_DIR / f"{name}.npz")["ids"].tolist()
        with _load(name) as model:
            fast[name], repacked_here[name] = model.logits(ids), repacked(model, types[name])
    for hidden in ({"avxvnni", "avx512vnni", "avx512vl", "avx512bw", "avx512f"}, {"avx2"}):
        monkeypatch.setattr(jit, "host_has", lambda f, hidden=hidden: f not in hidden and real(f))
        for name in NAMES:
            ref = np.load(SYNTH_DIR / f"{name}.npz")
            with _load(name) as model:
                mk = model.transformer.matmul_kernels
                assert mk.portable == ("avx2" in hidden) and not mk.vnni and not mk.wide
                logits = model.logits(ref["ids"].tolist())
                q = types[name]
                if repacked_here[name] != repacked(model, q) and q not in gemm.FILE_LAYOUT_BITS:
                    _assert_within(logits, ref["logits"], ENTRIES[name]["suggested_tolerance"], name)
                else:
                    np.testing.assert_array_equal(logits, fast[name], err_msg=name)


def test_a_type_without_kernels_is_a_clear_load_error(tmp_path) -> None:
    """IQ3_S blocks have Q3_K's size (256 values, 110 bytes), so retyping one tensor keeps the
    file valid; the engine names the tensor and the type rather than computing it wrongly."""
    data = bytearray((SYNTH_DIR / "llama_d256_kq_q3_k_s.gguf").read_bytes())
    at = tensor_type_field(bytes(data), "blk.1.ffn_up.weight")
    assert int.from_bytes(data[at:at + 4], "little") == Q.Q3_K
    data[at:at + 4] = int(Q.IQ3_S).to_bytes(4, "little")
    path = tmp_path / "iq3_s.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(engine.ModelLoadError, match=r"blk\.1\.ffn_up\.weight: type IQ3_S is not supported"):
        engine.load(path, n_ctx=64)

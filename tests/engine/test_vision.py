"""engine/vision against llama.cpp's mtmd (tests/data/vlm) and the float64 twin
(tests/support/vision_reference.py): pixels, projector embeddings, weight types, bad input."""
from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize
from PIL import Image

from engine.gguf import ModelLoadError
from engine.kernels import amx_gemm
from engine.vision import ImageError, VisionModel, preprocess
from engine.vision.mmproj import resident_bytes
from tests.support.refs import VLM_DIR
from tests.support.vision_reference import encode_reference

MANIFEST = json.loads((VLM_DIR / "manifest.json").read_text())
CASES = [(b["base"], k, im) for b in MANIFEST["bases"] for k, im in enumerate(b["images"])]
BASES = [b["base"] for b in MANIFEST["bases"]]


# the FMA panel GEMM everywhere; the AMX tiles too where the CPU has them (engine/kernels/amx_gemm)
MODES = [False] + ([True] if amx_gemm.available() else [])


@pytest.fixture(scope="module", params=MODES, ids=["fma", "amx"][:len(MODES)])
def amx(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture(scope="module")
def models(amx: bool) -> dict[str, VisionModel]:
    out = {b: VisionModel(VLM_DIR / f"{b}_mmproj_f32.gguf", amx=amx) for b in BASES}
    yield out
    for m in out.values():
        m.close()


@pytest.mark.parametrize("base,k,case", CASES, ids=[f"{b}-{k}" for b, k, _ in CASES])
def test_pixels_and_embeddings_match_llama_cpp(models: dict[str, VisionModel], base: str, k: int,
                                               case: dict) -> None:
    ref = np.load(VLM_DIR / case["npz"])
    data = (VLM_DIR / case["image"]).read_bytes()
    vm, tol = models[base], case["suggested_tolerance"]
    pre = vm.preprocess(data)
    assert len(pre.tiles) == case["n_image_chunks"]
    for j, pixels in enumerate(pre.tiles):
        assert pixels.shape == ref[f"pixels_{j}"].shape
        assert np.abs(pixels - ref[f"pixels_{j}"]).max() <= tol["pixels_max_abs"]
    enc = vm.encode(data)
    assert enc.n_tokens == case["n_image_tokens"]
    assert [c.rows.shape[0] for c in enc.chunks] == case["n_image_tokens_per_chunk"]
    for j, chunk in enumerate(enc.chunks):
        assert np.abs(chunk.rows - ref[f"embd_{j}"]).max() <= tol["embd_max_abs"], j


@pytest.mark.parametrize("base", BASES)
def test_embeddings_match_the_float64_twin(models: dict[str, VisionModel], base: str) -> None:
    ref = np.load(VLM_DIR / f"{base}_image1.npz")
    got = models[base].encode_pixels(ref["pixels_0"])
    want = encode_reference(VLM_DIR / f"{base}_mmproj_f32.gguf", ref["pixels_0"])
    # the engine rounds GELU through ggml's f16 table; the twin is exact
    assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max()


def _retyped(src: Path, dst: Path, qtype: GGMLQuantizationType) -> Path:
    """The same projector with its 2-D weights stored as qtype (vectors stay F32, as llama.cpp's
    converter leaves them; a patch kernel whose rows cannot hold Q8_0 blocks goes F16)."""
    r = GGUFReader(src)
    w = GGUFWriter(str(dst), "clip")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vtype = f.types[0]
        if vtype == GGUFValueType.ARRAY:
            w.add_array(f.name, [float(f.parts[i][0]) for i in f.data])
        elif vtype == GGUFValueType.STRING:
            w.add_string(f.name, bytes(f.parts[f.data[0]]).decode())
        else:
            w.add_key_value(f.name, f.parts[f.data[0]].tolist()[0], vtype)
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        data = np.asarray(t.data, np.float32).reshape(shape)
        q = qtype if data.ndim >= 2 else GGMLQuantizationType.F32
        if q == GGMLQuantizationType.Q8_0 and shape[-1] % 32:
            q = GGMLQuantizationType.F16
        if q == GGMLQuantizationType.F32:
            w.add_tensor(t.name, data)
        else:
            w.add_tensor(t.name, quantize(data, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F16, GGMLQuantizationType.BF16,
                                   GGMLQuantizationType.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("base", BASES)
def test_weight_types_match_the_float64_twin(tmp_path: Path, base: str,
                                             qtype: GGMLQuantizationType) -> None:
    path = _retyped(VLM_DIR / f"{base}_mmproj_f32.gguf", tmp_path / "mmproj.gguf", qtype)
    pixels = np.load(VLM_DIR / f"{base}_image0.npz")["pixels_0"]
    want = encode_reference(path, pixels)  # the same stored weights, dequantized by gguf-py
    with VisionModel(path) as vm:
        got = vm.encode_pixels(pixels)
    assert {t.qtype for t in vm.projector.file.tensors.values()} >= {qtype}
    # Q8_0 matmuls quantize their activations to 8 bits as llama.cpp does
    rel = 2e-2 if qtype == GGMLQuantizationType.Q8_0 else 2e-3
    assert np.abs(got - want).max() <= rel * np.abs(want).max()


@pytest.mark.parametrize("base", BASES)
def test_the_memory_estimate_counts_what_the_encoder_packs(tmp_path: Path, base: str, amx: bool) -> None:
    """F16 weights packed as bf16 halves take 4 bytes an element, not the file's 2: the budget's
    figure (resident_bytes) grows by what the encoder actually packs."""
    path = _retyped(VLM_DIR / f"{base}_mmproj_f32.gguf", tmp_path / "mmproj.gguf", GGMLQuantizationType.F16)
    with VisionModel(path, amx=amx) as vm:
        enc = vm.encoder
        packed = list(enc._panels.values()) + [q[0] for q in enc._qkv if q is not None]
        extra = sum(m.data.nbytes - 2 * m.n_rows * m.n_cols for m in packed)  # packing's padding aside
        f16 = sum(2 * m.n_rows * m.n_cols for m in packed)
    grown = resident_bytes(path, amx) - path.stat().st_size
    assert grown == (f16 if amx else 0)
    assert extra >= grown  # the estimate is a floor of the packed copies (padding is extra)


def _png(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def test_formats_decode_to_the_same_pixels(models: dict[str, VisionModel]) -> None:
    img = Image.open(VLM_DIR / "image1_64x64.png").convert("RGB")
    vm = models["gemma3_vlm"]
    want = vm.preprocess(_png(img)).tiles[0]
    rgba = img.copy()
    rgba.putalpha(128)
    assert np.array_equal(vm.preprocess(_png(rgba)).tiles[0], want)  # alpha is dropped
    lossless_webp = io.BytesIO()
    img.save(lossless_webp, "WEBP", lossless=True)
    assert np.array_equal(vm.preprocess(lossless_webp.getvalue()).tiles[0], want)
    for fmt in ("JPEG", "GIF"):  # lossy: the same geometry, pixels near
        got = vm.preprocess(_png(img, fmt)).tiles[0]
        assert got.shape == want.shape and np.abs(got - want).mean() < 0.1


def test_bad_images_are_refused_with_a_reason(models: dict[str, VisionModel]) -> None:
    vm = models["gemma3_vlm"]
    good = (VLM_DIR / "image0_40x24.png").read_bytes()
    with pytest.raises(ImageError, match="cannot decode"):
        vm.encode(b"not an image at all")
    with pytest.raises(ImageError, match="cannot decode"):
        vm.encode(good[: len(good) // 2])


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header says width x height, with almost no pixel data (a bomb's shape)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


def test_a_decompression_bomb_is_refused_before_decoding() -> None:
    side = int(preprocess.BOMB_PIXELS ** 0.5) + 1
    with pytest.raises(ImageError, match="decompression bomb"):
        preprocess.decode(_png_claiming(side, side))
    with pytest.raises(ImageError, match="cannot decode"):  # under the bar: decoding finds no data
        preprocess.decode(_png_claiming(8000, 8000))


def test_an_image_over_the_pixel_budget_is_box_reduced_to_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    rgb = rng.integers(0, 256, (60, 100, 3), dtype=np.uint8)           # 6000 pixels
    monkeypatch.setattr(preprocess, "PIXEL_BUDGET", 1000)
    got = np.asarray(preprocess.decode(_png(Image.fromarray(rgb))))
    # factor 3 is the smallest that fits (factor 2: 50 x 30 = 1500 > 1000): 34 x 20
    assert got.shape == (20, 34, 3)
    # whole 3x3 blocks are their mean (Pillow rounds in fixed point: within one unit); the last
    # column's blocks are partial
    want = rgb[:60, :99].reshape(20, 3, 33, 3, 3).mean(axis=(1, 3))
    assert np.abs(got[:, :33].astype(np.float64) - want).max() <= 1.0
    monkeypatch.setattr(preprocess, "PIXEL_BUDGET", 6000)               # at the budget: untouched
    assert np.array_equal(np.asarray(preprocess.decode(_png(Image.fromarray(rgb)))), rgb)


def test_a_text_model_is_not_a_projector() -> None:
    with pytest.raises(ModelLoadError, match="clip"):
        VisionModel(VLM_DIR / "gemma3_vlm_text_f32.gguf")


def test_chunk_keys_follow_the_image_content(models: dict[str, VisionModel]) -> None:
    vm = models["idefics3_vlm"]
    a = vm.encode((VLM_DIR / "image0_40x24.png").read_bytes())
    b = vm.encode((VLM_DIR / "image1_64x64.png").read_bytes())
    again = vm.encode((VLM_DIR / "image0_40x24.png").read_bytes())
    assert [c.key for c in a.chunks] == [c.key for c in again.chunks]
    assert len({c.key for c in a.chunks}) == len(a.chunks)
    assert not {c.key for c in a.chunks} & {c.key for c in b.chunks}


def test_gemma3_pools_4x4_when_the_file_leaves_the_scale_factor_out() -> None:
    """Published Gemma 3 mmproj files carry no clip.vision.projector.scale_factor: mtmd's
    default (clip.cpp, PROJECTOR_TYPE_GEMMA3: n_merge = 4) makes 64x64 patches 256 rows."""
    from engine.gguf import GGUFFile
    from engine.vision import check_header

    f = GGUFFile(VLM_DIR / "gemma3_vlm_mmproj_f32.gguf")
    try:
        md = dict(f.metadata)
        assert md.pop("clip.vision.projector.scale_factor") == 2   # the tiny file names its own
        md["clip.vision.image_size"], md["clip.vision.patch_size"] = 896, 14
        assert check_header("x.gguf", md, f.tensors).scale_factor == 4
    finally:
        f.close()


@pytest.mark.parametrize("base", BASES)
def test_two_threads_give_one_threads_bits(models: dict[str, VisionModel], base: str, amx: bool) -> None:
    """Heads spread over threads, GEMMs split by panels, norms by rows: each value is computed
    by one thread in the same order, so the threaded encoder is bit-identical."""
    pixels = models[base].preprocess((VLM_DIR / "image1_64x64.png").read_bytes()).tiles[0]
    with VisionModel(VLM_DIR / f"{base}_mmproj_f32.gguf", n_threads=2, amx=amx) as threaded:
        assert np.array_equal(threaded.encode_pixels(pixels), models[base].encode_pixels(pixels))

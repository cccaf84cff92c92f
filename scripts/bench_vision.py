"""Time one image's encode (ViT + projector) of a full-size Gemma 3 mmproj against llama.cpp's mtmd.

    flock /tmp/modelyard-bench.lock python scripts/bench_vision.py \
        [--rounds 3] [--threads 2] [--peer-bin /work/llama/build/bin] [--layers 27]
        [--check [--peer-python /opt/llama-venv/bin/python]]

The files are made here (random weights, fixed seed, cached in --dir): a Gemma 3 projector of
SigLIP-400M's shape (27 blocks, width 1152, FFN 4304, 16 heads, patch 14, 896 px: 4096 patches,
pooled 4x4 to 256 rows, projected to --text-width, 2560 as Gemma 3 4B), F16 weights as the
published mmproj files carry them, and a one-block gemma3 text model of that width (mtmd needs
one; its speed is not measured). The image is an 896x896 PNG, so neither side resizes.

Rounds alternate: ours (engine.vision.VisionModel.encode_pixels, the model loaded once) then
llama-mtmd-cli (a fresh process each round; its own "image slice encoded in N ms" line, which
times mtmd_encode_chunk: the same ViT + projector work). Medians are reported, and the ratio
ours/peer in speed (peer ms / our ms): the issue's bar is >= 1.5 at 2 threads. CPU seconds
are printed beside (a shared machine's wall time swings with the neighbours' load). --check
first compares our projector output with mtmd's (llama-cpp-python's mtmd_cpp) for the file.
"""
from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY_TEXT = ROOT / "tests" / "data" / "vlm" / "gemma3_vlm_text_f32.gguf"
SIGLIP = dict(image_size=896, patch_size=14, width=1152, n_ff=4304, n_head=16)


def _writer(path: Path, arch: str):  # noqa: ANN202 - gguf has no stubs
    from gguf import GGUFWriter

    return GGUFWriter(str(path), arch)


def make_mmproj(path: Path, text_width: int, n_layer: int, seed: int = 0) -> None:
    """A random-weight Gemma 3 projector of SigLIP-400M's shape, F16 matrices, f32 norms."""
    rng = np.random.default_rng(seed)
    s = SIGLIP
    w, f, p = s["width"], s["n_ff"], s["patch_size"]
    n_pos = (s["image_size"] // p) ** 2
    gw = _writer(path, "clip")
    gw.add_name("bench gemma3 siglip-400m mmproj (random)")
    gw.add_file_type(1)  # MOSTLY_F16
    gw.add_string("clip.projector_type", "gemma3")
    gw.add_bool("clip.has_vision_encoder", True)
    gw.add_bool("clip.has_audio_encoder", False)
    gw.add_bool("clip.use_gelu", True)
    k = "clip.vision."
    for key, v in (("image_size", s["image_size"]), ("patch_size", p), ("embedding_length", w),
                   ("feed_forward_length", f), ("block_count", n_layer),
                   ("projection_dim", text_width), ("attention.head_count", s["n_head"])):
        gw.add_uint32(k + key, v)
    gw.add_float32(k + "attention.layer_norm_epsilon", 1e-6)
    gw.add_array(k + "image_mean", [0.5, 0.5, 0.5])
    gw.add_array(k + "image_std", [0.5, 0.5, 0.5])
    # no clip.vision.projector.scale_factor: the published Gemma 3 files leave it to the default 4

    def mat(*shape: int, scale: float | None = None) -> np.ndarray:  # numpy order (ggml reversed)
        sd = scale if scale is not None else 1.0 / np.sqrt(shape[-1] if len(shape) == 2 else 3 * p * p)
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(sd)).astype(np.float16)

    def vec(n: int, mean: float = 0.0, sd: float = 0.02) -> np.ndarray:
        return (mean + sd * rng.standard_normal(n)).astype(np.float32)

    gw.add_tensor("v.patch_embd.weight", mat(w, 3, p, p))
    gw.add_tensor("v.patch_embd.bias", vec(w))
    # f32: ggml adds it to f32 rows (an f16 one is refused by mtmd's graph)
    gw.add_tensor("v.position_embd.weight", mat(n_pos, w, scale=0.02).astype(np.float32))
    for i in range(n_layer):
        b = f"v.blk.{i}."
        gw.add_tensor(b + "ln1.weight", vec(w, 1.0))
        gw.add_tensor(b + "ln1.bias", vec(w))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            gw.add_tensor(b + name + ".weight", mat(w, w))
            gw.add_tensor(b + name + ".bias", vec(w))
        gw.add_tensor(b + "ln2.weight", vec(w, 1.0))
        gw.add_tensor(b + "ln2.bias", vec(w))
        gw.add_tensor(b + "ffn_up.weight", mat(f, w))
        gw.add_tensor(b + "ffn_up.bias", vec(f))
        gw.add_tensor(b + "ffn_down.weight", mat(w, f))
        gw.add_tensor(b + "ffn_down.bias", vec(w))
    gw.add_tensor("v.post_ln.weight", vec(w, 1.0))
    gw.add_tensor("v.post_ln.bias", vec(w))
    gw.add_tensor("mm.soft_emb_norm.weight", vec(w, 1.0))
    gw.add_tensor("mm.input_projection.weight", mat(w, text_width))
    _finish(gw)


def make_text(path: Path, width: int, seed: int = 1) -> None:
    """A one-block gemma3 text model of `width`, with the tiny reference model's tokenizer."""
    from engine.gguf import GGUFFile

    rng = np.random.default_rng(seed)
    tiny = GGUFFile(TINY_TEXT)
    md = dict(tiny.metadata)
    tiny.close()
    n_vocab = len(md["tokenizer.ggml.tokens"])
    head, n_head, n_kv, n_ff = 32, 2, 1, 128
    gw = _writer(path, "gemma3")
    gw.add_name("bench gemma3 text (random)")
    gw.add_file_type(0)
    for key, v in md.items():
        if key.startswith("general.") or key == "gemma3.vocab_size":
            continue
        if key == "gemma3.embedding_length":
            v = width
        if key == "gemma3.block_count":
            v = 1
        _add(gw, key, v)

    def t(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))

    ones = np.ones
    gw.add_tensor("token_embd.weight", t(n_vocab, width))
    b = "blk.0."
    gw.add_tensor(b + "attn_norm.weight", ones(width, np.float32))
    gw.add_tensor(b + "attn_q.weight", t(n_head * head, width))
    gw.add_tensor(b + "attn_k.weight", t(n_kv * head, width))
    gw.add_tensor(b + "attn_v.weight", t(n_kv * head, width))
    gw.add_tensor(b + "attn_q_norm.weight", ones(head, np.float32))
    gw.add_tensor(b + "attn_k_norm.weight", ones(head, np.float32))
    gw.add_tensor(b + "attn_output.weight", t(width, n_head * head))
    gw.add_tensor(b + "post_attention_norm.weight", ones(width, np.float32))
    gw.add_tensor(b + "ffn_norm.weight", ones(width, np.float32))
    gw.add_tensor(b + "ffn_gate.weight", t(n_ff, width))
    gw.add_tensor(b + "ffn_up.weight", t(n_ff, width))
    gw.add_tensor(b + "ffn_down.weight", t(width, n_ff))
    gw.add_tensor(b + "post_ffw_norm.weight", ones(width, np.float32))
    gw.add_tensor("output_norm.weight", ones(width, np.float32))
    _finish(gw)


def _add(gw, key: str, v: object) -> None:  # noqa: ANN001
    from gguf import GGUFValueType

    if isinstance(v, bool):
        gw.add_bool(key, v)
    elif isinstance(v, int):
        gw.add_uint32(key, v)
    elif isinstance(v, float):
        gw.add_float32(key, v)
    elif isinstance(v, str):
        gw.add_string(key, v)
    elif isinstance(v, (list, tuple)):
        gw.add_array(key, list(v))  # ints as int32 (token types), floats as f32 (scores)
    else:
        raise TypeError(f"{key}: {type(v).__name__} ({GGUFValueType})")


def _finish(gw) -> None:  # noqa: ANN001
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()


def make_image(path: Path, side: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(2)
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(path)


def ours(model, pixels: np.ndarray) -> tuple[float, float]:  # noqa: ANN001
    """(wall ms, CPU s of this process's threads) of one encode."""
    c0, t0 = time.process_time(), time.perf_counter()
    model.encode_pixels(pixels)
    return (time.perf_counter() - t0) * 1e3, time.process_time() - c0


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def peer(bin_dir: Path, text: Path, mmproj: Path, image: Path, threads: int) -> tuple[float, float]:
    """(encode ms as mtmd reports it, CPU s of the whole llama-mtmd-cli process: load included)."""
    cmd = [str(bin_dir / "llama-mtmd-cli"), "-m", str(text), "--mmproj", str(mmproj),
           "--image", str(image), "-p", "describe", "-n", "1", "-t", str(threads),
           "-c", "1024", "--temp", "0", "--no-warmup"]
    c0 = _children_cpu()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    m = re.search(r"(?:image slice encoded|mtmd batch encoding done) in (\d+) ms", r.stdout + r.stderr)
    if r.returncode != 0 or m is None:
        raise RuntimeError(f"llama-mtmd-cli failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    return float(m.group(1)), _children_cpu() - c0


# run by --peer-python (llama-cpp-python's venv): mtmd's projector output for one RGB image
MTMD_EMBD = r"""
import ctypes, sys
import numpy as np
import llama_cpp
from llama_cpp import mtmd_cpp
text, mmproj, image, out = sys.argv[1:5]
llama_cpp.llama_backend_init()
model = llama_cpp.llama_model_load_from_file(text.encode(), llama_cpp.llama_model_default_params())
cp = mtmd_cpp.mtmd_context_params_default()
cp.use_gpu, cp.n_threads, cp.warmup = False, 2, False
ctx = mtmd_cpp.mtmd_init_from_file(mmproj.encode(), model, cp)
img = np.ascontiguousarray(np.load(image))
u8 = img.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte))
bmp = mtmd_cpp.mtmd_bitmap_init(img.shape[1], img.shape[0], u8)
chunks = mtmd_cpp.mtmd_input_chunks_init()
t = mtmd_cpp.mtmd_input_text()
t.text, t.text_len, t.add_special, t.parse_special = b"<__media__>", 11, False, True
assert mtmd_cpp.mtmd_tokenize(ctx, chunks, ctypes.byref(t), (ctypes.c_void_p * 1)(bmp), 1) == 0
n_embd = llama_cpp.llama_model_n_embd(model)
for i in range(mtmd_cpp.mtmd_input_chunks_size(chunks)):
    ch = mtmd_cpp.mtmd_input_chunks_get(chunks, i)
    if mtmd_cpp.mtmd_input_chunk_get_type(ch) == mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_IMAGE:
        assert mtmd_cpp.mtmd_encode_chunk(ctx, ch) == 0
        n = mtmd_cpp.mtmd_input_chunk_get_n_tokens(ch)
        p = ctypes.cast(mtmd_cpp.mtmd_get_output_embd(ctx), ctypes.POINTER(ctypes.c_float))
        np.save(out, np.ctypeslib.as_array(p, shape=(n * n_embd,)).reshape(n, n_embd).copy())
"""


def check(peer_python: Path, text: Path, mmproj: Path, image: Path, ours_rows: np.ndarray) -> None:
    """Our embeddings against mtmd's for the same file and image (max difference / max |mtmd|)."""
    import tempfile

    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        rgb, out, script = Path(tmp) / "rgb.npy", Path(tmp) / "embd.npy", Path(tmp) / "embd.py"
        np.save(rgb, np.asarray(Image.open(image).convert("RGB")))
        script.write_text(MTMD_EMBD)
        r = subprocess.run([str(peer_python), str(script), str(text), str(mmproj), str(rgb), str(out)],
                           capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            raise RuntimeError(f"mtmd_cpp failed:\n{r.stderr[-3000:]}")
        ref = np.load(out)
    rel = float(np.abs(ours_rows - ref).max() / np.abs(ref).max())
    print(f"check: ours {ours_rows.shape} vs mtmd {ref.shape}: max |diff| / max |mtmd| = {rel:.2e}"
          f" (the vlm references' tolerance: 1e-3)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=27, help="ViT blocks (27: SigLIP-400M)")
    ap.add_argument("--text-width", type=int, default=2560)
    ap.add_argument("--peer-bin", type=Path, default=Path("/work/llama/build/bin"))
    ap.add_argument("--no-peer", action="store_true", help="time ours only")
    ap.add_argument("--check", action="store_true",
                    help="also compare our embeddings with mtmd's (llama-cpp-python's mtmd_cpp)")
    ap.add_argument("--peer-python", type=Path, default=Path("/opt/llama-venv/bin/python"))
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "modelyard" / "bench_vision")
    args = ap.parse_args()

    args.dir.mkdir(parents=True, exist_ok=True)
    mmproj = args.dir / f"gemma3-siglip400m-{args.layers}l-{args.text_width}-f16.mmproj.gguf"
    text = args.dir / f"gemma3-text-{args.text_width}.gguf"
    image = args.dir / "random-896.png"
    for path, make in ((mmproj, lambda p: make_mmproj(p, args.text_width, args.layers)),
                       (text, lambda p: make_text(p, args.text_width)),
                       (image, lambda p: make_image(p, SIGLIP["image_size"]))):
        if not path.exists():
            print(f"making {path}", flush=True)
            tmp = path.with_name("tmp-" + path.name)
            make(tmp)
            tmp.rename(path)

    from engine.vision import VisionModel

    model = VisionModel(mmproj, n_threads=args.threads)
    pixels = model.preprocess(image.read_bytes()).tiles[0]
    rows = model.encode_pixels(pixels)  # warm-up: first touches of the weights, scratch buffers
    print(f"ours: {rows.shape[0]} rows of {rows.shape[1]} per image", flush=True)
    if args.check:
        check(args.peer_python, text, mmproj, image, rows)
    mine: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    for r in range(args.rounds):
        mine.append(ours(model, pixels))
        line = f"round {r + 1}: ours {mine[-1][0]:.0f} ms ({mine[-1][1]:.1f} CPU s)"
        if not args.no_peer:
            theirs.append(peer(args.peer_bin, text, mmproj, image, args.threads))
            line += f"   mtmd {theirs[-1][0]:.0f} ms ({theirs[-1][1]:.1f} CPU s, load included)"
        print(line, flush=True)
    model.close()
    a, ac = (statistics.median(v) for v in zip(*mine))
    print(f"\nimage encode, {args.layers} blocks, {args.threads} threads, median of {args.rounds}:")
    print(f"  ours {a:.0f} ms, {ac:.1f} CPU s")
    if theirs:
        b, bc = (statistics.median(v) for v in zip(*theirs))
        print(f"  mtmd {b:.0f} ms, {bc:.1f} CPU s (whole process)")
        print(f"  speed ours/mtmd = {b / a:.2f}x wall  (bar: >= 1.5x); CPU time {bc / ac:.2f}x")


if __name__ == "__main__":
    main()

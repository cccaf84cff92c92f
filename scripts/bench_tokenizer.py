"""Time tokenizer loading and encoding of the string shapes that used to be slow.

    python scripts/bench_tokenizer.py [--repeat 5] [--model PATH ...]

For each model (default: the cached SmolLM2 and Gemma 3 files): the header read and the
Tokenizer build (paid at every model load), the first long-word encode (it builds the BPE merge
table and loads the compiled merge loop), then encode() of a 64 KiB run of one character, 64 KiB
of letters without spaces, 64 KiB of English, and 16 Ki CJK characters. Figures are the median
thread CPU time of --repeat runs (robust to other load on the machine) with the word cache
cleared before each run; the same merges done by the Python heap loops (the compiled loops'
twins) are shown beside them.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.default_model import cache_root  # noqa: E402
from engine.gguf import read_header  # noqa: E402
from engine.tokenizer import SPM_SPACE, Tokenizer  # noqa: E402
from engine.tokenizer.bpe import BpeEncoder, byte_encode  # noqa: E402
from engine.tokenizer.merge import spm_merge  # noqa: E402
from engine.tokenizer.spm import SpmEncoder  # noqa: E402


def shapes() -> dict[str, str]:
    rng = random.Random(0)
    english = ("The quick brown fox jumps over the lazy dog, and then it runs away again. " * 900)
    return {
        "64 KiB of 'a'": "a" * 65536,
        "64 KiB of letters, no spaces": "".join(rng.choice("etaoinshrdlucmfw") for _ in range(65536)),
        "64 KiB of English": english[:65536],
        "16 Ki CJK characters": "".join(chr(0x4E00 + rng.randrange(20000)) for _ in range(16384)),
    }


def cpu_ms(fn, repeat: int, before=lambda: None) -> float:
    runs = []
    for _ in range(repeat):
        before()
        t = time.thread_time()
        fn()
        runs.append((time.thread_time() - t) * 1000)
    return statistics.median(runs)


def python_loop(tok: Tokenizer, text: str) -> None:
    """The same merges done by the Python heap loops (the compiled loops' twins)."""
    encoder = tok._encoder
    if isinstance(encoder, BpeEncoder):
        for word in tok.pre_tokenize(text):
            encoder.word(byte_encode(word))
    else:
        assert isinstance(encoder, SpmEncoder)
        spm_merge(text.replace(" ", SPM_SPACE), tok._id_of, encoder.scores)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--model", type=Path, nargs="*",
                    default=[cache_root() / "SmolLM2-135M-Instruct.Q4_1.gguf",
                             cache_root() / "gemma-3-270m-q4_k_m.gguf"])
    args = ap.parse_args()
    for path in args.model:
        t = time.perf_counter()
        meta, _ = read_header(path)
        header_ms = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        tok = Tokenizer.from_metadata(meta)
        build_ms = (time.perf_counter() - t) * 1000
        print(f"{path.name}: {tok.n_vocab} tokens ({tok.model}); header read {header_ms:.0f} ms, "
              f"Tokenizer build {build_ms:.0f} ms (wall)")
        t = time.perf_counter()
        tok.encode("x" * 300)
        print(f"  first long text (merge tables + kernel load, once per tokenizer): "
              f"{(time.perf_counter() - t) * 1000:.0f} ms (wall)")
        clear = getattr(tok._encoder, "_word_cache", {}).clear  # BPE remembers words
        for name, text in shapes().items():
            ms = cpu_ms(lambda tok=tok, text=text: tok.encode(text), args.repeat, clear)
            line = f"  {name:30s} {ms:8.1f} ms  {len(tok.encode(text)):6d} tokens"
            loop_ms = cpu_ms(lambda tok=tok, text=text: python_loop(tok, text), args.repeat)
            line += f"   (Python merge loop: {loop_ms:.1f} ms)"
            print(line)


if __name__ == "__main__":
    main()

"""Tokenizer tests.

The real vocabulary (SmolLM2, GPT-2 byte-level BPE, pre-tokenizer "smollm") is checked against
llama.cpp's own ids in tests/data/smollm2. Everything else uses small synthetic
vocabularies with expectations derived by hand from llama.cpp's algorithm, or from a naive
re-statement of that algorithm written here.
"""
from __future__ import annotations

import itertools
import json
import logging
import random
from pathlib import Path

import pytest

from engine.tokenizer import KNOWN_PRE_TOKENIZERS, SPM_SPACE, Tokenizer, TokenType
from tests.support.ggufgen import byte_to_unicode
from tests.support.refs import REFS_DIR

REFS = REFS_DIR
TOKENIZE = json.loads((REFS / "tokenize.json").read_text())
GREEDY = json.loads((REFS / "greedy.json").read_text())

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = (TokenType.NORMAL, TokenType.UNKNOWN,
                                                TokenType.CONTROL, TokenType.USER_DEFINED,
                                                TokenType.BYTE)


# -- the real vocabulary ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm_meta(smollm2_path: Path) -> dict[str, object]:
    """tokenizer.* metadata read with gguf-py itself, not with our reader."""
    from gguf import GGUFReader

    reader = GGUFReader(smollm2_path)
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}


@pytest.fixture(scope="module")
def smollm(smollm_meta: dict[str, object]) -> Tokenizer:
    return Tokenizer.from_metadata(smollm_meta)


@pytest.mark.real_model
def test_smollm2_vocabulary_facts_match_llama_cpp(smollm: Tokenizer) -> None:
    assert smollm.n_vocab == TOKENIZE["n_vocab"]
    assert smollm.bos_id == TOKENIZE["bos_id"]
    assert smollm.eos_id == TOKENIZE["eos_id"]
    assert smollm.eog_ids == frozenset(TOKENIZE["eog_ids"])
    assert smollm.add_bos is TOKENIZE["add_bos"]
    assert smollm.model == TOKENIZE["tokenizer_model"]
    assert smollm.pre == TOKENIZE["tokenizer_pre"]


@pytest.mark.real_model
@pytest.mark.parametrize("item", TOKENIZE["items"], ids=lambda it: repr(it["text"])[:40])
def test_smollm2_encode_decode_matches_llama_cpp(smollm: Tokenizer, item: dict) -> None:
    text = item["text"]
    ids = smollm.encode(text, add_special=False, parse_special=True)
    plain = smollm.encode(text, parse_special=False)
    assert ids == item["ids"]
    assert plain == item["ids_special_false"]
    assert smollm.decode(ids) == text
    assert smollm.decode(plain) == text
    # add_bos_token is false in this file, so add_special changes nothing
    assert smollm.encode(text, add_special=True, parse_special=True) == item["ids"]


@pytest.mark.real_model
@pytest.mark.parametrize("name", sorted(GREEDY["prompts"]))
def test_smollm2_completion_prompts_match_llama_cpp(smollm: Tokenizer, name: str) -> None:
    p = GREEDY["prompts"][name]
    for parse_special in (False, True):
        assert smollm.encode(p["prompt"], add_special=True, parse_special=parse_special) \
            == p["prompt_ids"]
    assert smollm.decode(p["prompt_ids"]) == p["prompt"]
    assert smollm.decode(p["raw_ids"]) == p["raw_text"]


@pytest.mark.real_model
def test_smollm2_chat_prompt_matches_llama_cpp(smollm: Tokenizer) -> None:
    chat = GREEDY["chat"]
    args = chat["templated_prompt_tokenize_args"]
    ids = smollm.encode(chat["templated_prompt"], add_special=args["add_bos"],
                        parse_special=args["special"])
    assert ids == chat["prompt_ids"]
    assert smollm.decode(ids) == chat["templated_prompt"]
    expected = chat["templated_prompt"].replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert smollm.decode(ids, skip_special=True) == expected
    assert smollm.decode(chat["raw_ids"]) == chat["raw_text"]


@pytest.mark.real_model
def test_token_bytes_are_raw_bytes(smollm: Tokenizer) -> None:
    emoji = next(it for it in TOKENIZE["items"] if it["text"] == "😀")
    assert b"".join(smollm.token_bytes(i) for i in emoji["ids"]) == "😀".encode()
    assert smollm.token_bytes(1) == b"<|im_start|>"
    hello = smollm.encode(" world")
    assert len(hello) == 1 and smollm.token_bytes(hello[0]) == b" world"


@pytest.mark.real_model
def test_decode_replaces_invalid_utf8(smollm: Tokenizer) -> None:
    emoji_ids = next(it for it in TOKENIZE["items"] if it["text"] == "😀")["ids"]
    truncated = emoji_ids[:2]  # F0 9F 98: three bytes of a four-byte character
    raw = b"".join(smollm.token_bytes(i) for i in truncated)
    assert smollm.decode(truncated) == raw.decode("utf-8", errors="replace")
    lone = smollm.encode("\x80")  # U+0080 is two bytes, C2 80; its ids are byte symbols
    continuation = [i for i in lone if smollm.token_bytes(i) == b"\x80"]
    assert continuation and smollm.decode(continuation) == "\ufffd"


@pytest.mark.real_model
def test_random_text_round_trips(smollm: Tokenizer) -> None:
    rng = random.Random(1234)
    alphabet = ("abcXYZ019 \t\n\r\x0b\x00\x7f'\".,;:!?<>|()[]{}_-+=*&^%$#@~`\\/"
                "éüßÅñç日本語中文한국어Привет😀🍕👨\u200d👩\u0301\u00a0\u2028\u3000\ufeff\ufffd")
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        if rng.random() < 0.3:
            text += rng.choice(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
        for parse_special in (False, True):
            assert smollm.decode(smollm.encode(text, parse_special=parse_special)) == text


@pytest.mark.real_model
def test_lone_surrogates_are_encoded_as_replacement_character(smollm: Tokenizer) -> None:
    assert smollm.encode("a\ud800b") == smollm.encode("a\ufffdb")


@pytest.mark.real_model
def test_bad_ids_and_text_raise_clear_errors(smollm: Tokenizer) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smollm.decode([1, smollm.n_vocab])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smollm.token_bytes(-1)
    with pytest.raises(TypeError):
        smollm.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        smollm.decode(["1"])  # type: ignore[list-item]
    import numpy as np

    ids = smollm.encode("Hello world")
    assert smollm.decode(np.array(ids)) == "Hello world"  # numpy ids, as sampling yields them


# -- incremental decoding --------------------------------------------------------------------------
@pytest.mark.real_model
@pytest.mark.parametrize("text", ["😀", "I love pizza 🍕🍕 and 🚀!", "👨\u200d👩\u200d👧\u200d👦",
                                  "你好，世界", "日本語のテキストです。", "café naïve résumé façade",
                                  "<|im_start|>user\nHi<|im_end|>\n"])
def test_incremental_decoder_concatenates_to_decode(smollm: Tokenizer, text: str) -> None:
    ids = smollm.encode(text, parse_special=True)
    for skip_special in (False, True):
        dec = smollm.incremental_decoder(skip_special=skip_special)
        parts = [dec.push(i) for i in ids]
        assert not dec.pending
        parts.append(dec.flush())
        assert "".join(parts) == smollm.decode(ids, skip_special=skip_special)
        assert all("\ufffd" not in p for p in parts)  # no character was ever split


@pytest.mark.real_model
def test_incremental_decoder_holds_back_partial_characters(smollm: Tokenizer) -> None:
    ids = next(it for it in TOKENIZE["items"] if it["text"] == "😀")["ids"]  # 3 tokens, 4 bytes
    dec = smollm.incremental_decoder()
    assert [dec.push(i) for i in ids] == ["", "", "😀"]
    dec.push(ids[0])
    assert dec.pending
    raw = smollm.token_bytes(ids[0])
    assert dec.flush() == raw.decode("utf-8", errors="replace")
    assert not dec.pending
    assert dec.push(ids[0]) + dec.push(ids[1]) + dec.push(ids[2]) == "😀"  # reusable after flush


# -- synthetic byte-level BPE vocabularies --------------------------------------------------------
def _byte_symbols() -> list[str]:
    """GPT-2's byte -> character map as the tests' GGUF writer restates it (not the engine's)."""
    b2u = byte_to_unicode()
    return [b2u[b] for b in range(256)]


def bpe_meta(pre: str | None = "gpt-2", merges: tuple[str, ...] = (),
             specials: tuple[tuple[str, int], ...] = (), extra: tuple[str, ...] = (),
             **flags: object) -> dict[str, object]:
    tokens = [t for t, _ in specials] + _byte_symbols()
    types = [int(k) for _, k in specials] + [1] * 256
    for m in merges:
        joined = m.replace(" ", "")
        if joined not in tokens:
            tokens.append(joined)
            types.append(1)
    for t in extra:
        tokens.append(t)
        types.append(1)
    meta: dict[str, object] = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": list(merges),
    }
    if pre is not None:
        meta["tokenizer.ggml.pre"] = pre
    meta.update({f"tokenizer.ggml.{k}": v for k, v in flags.items()})
    return meta


SAMPLE = ("Hello, world! I'M here: don't panic.\n\n  12345 + 3.14 = x\t\r\nnaïve café 日本語 "
          "😀🍕 (parens) [1,2,3] \"quoted\" it's   done   \u00a0end")


@pytest.mark.parametrize("pre", sorted(KNOWN_PRE_TOKENIZERS))
def test_every_known_pre_tokenizer_splits_losslessly(pre: str, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.tokenizer"):
        tok = Tokenizer.from_metadata(bpe_meta(pre))
    assert not caplog.records
    words = tok.pre_tokenize(SAMPLE)
    assert "".join(words) == SAMPLE
    assert all(words)
    assert len(words) > 10
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE


@pytest.mark.parametrize("pre, expected", [
    ("smollm", ["1", "2", "3", "4", "5"]),         # digits one by one
    ("qwen2", ["1", "2", "3", "4", "5"]),
    ("llama-bpe", ["123", "45"]),                  # up to three digits
    ("deepseek-v3", ["123", "45"]),
    ("default", ["123", "45"]),
    ("falcon", ["123", "45"]),
    ("gpt-2", ["12345"]),                          # a whole number
    ("deepseek-llm", ["12345"]),
])
def test_digit_grouping_per_pre_tokenizer(pre: str, expected: list[str]) -> None:
    assert Tokenizer.from_metadata(bpe_meta(pre)).pre_tokenize("12345") == expected


def test_gpt2_family_contractions_are_case_sensitive() -> None:
    gpt2 = Tokenizer.from_metadata(bpe_meta("gpt-2"))
    llama3 = Tokenizer.from_metadata(bpe_meta("llama-bpe"))
    assert gpt2.pre_tokenize("I'M don't") == ["I", "'", "M", " don", "'t"]
    assert llama3.pre_tokenize("I'M don't") == ["I", "'M", " don", "'t"]


def test_pre_tokenizer_whitespace_and_punctuation_rules() -> None:
    gpt2 = Tokenizer.from_metadata(bpe_meta("gpt-2"))
    llama3 = Tokenizer.from_metadata(bpe_meta("llama-bpe"))
    # \s+(?!\S): a run of spaces leaves its last space to the next word
    assert gpt2.pre_tokenize("Hello   world  ") == ["Hello", "  ", " world", "  "]
    assert gpt2.pre_tokenize("(hello)") == ["(", "hello", ")"]
    # llama-3: one non-letter may lead a word; newlines group with preceding whitespace
    assert llama3.pre_tokenize("(hello)") == ["(hello", ")"]
    assert llama3.pre_tokenize("a \n\n b") == ["a", " \n\n", " b"]
    assert llama3.pre_tokenize("x...\n\ny") == ["x", "...\n\n", "y"]


def test_smollm_pre_splits_digits_before_words() -> None:
    tok = Tokenizer.from_metadata(bpe_meta("smollm"))
    # the digit pass runs first, so " 2024" keeps its space apart from the digits
    assert tok.pre_tokenize("year 2024!") == ["year", " ", "2", "0", "2", "4", "!"]


def test_unknown_pre_falls_back_to_default_with_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.tokenizer"):
        tok = Tokenizer.from_metadata(bpe_meta("no-such-pre"))
    assert tok.pre == "no-such-pre" and tok.pre_tokenizer == "default"
    assert any("no-such-pre" in r.getMessage() for r in caplog.records)
    assert tok.pre_tokenize("12345") == ["123", "45"]


def test_missing_pre_falls_back_to_default_with_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.tokenizer"):
        tok = Tokenizer.from_metadata(bpe_meta(None))
    assert tok.pre_tokenizer == "default"
    assert caplog.records


@pytest.mark.parametrize("meta, match", [
    ({"tokenizer.ggml.model": "ugm", "tokenizer.ggml.tokens": ["a"]}, "unsupported tokenizer"),
    ({"tokenizer.ggml.tokens": ["a"]}, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.model": "gpt2"}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"]}, "merges"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "a"],
      "tokenizer.ggml.merges": []}, "duplicate"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"],
      "tokenizer.ggml.token_type": [1], "tokenizer.ggml.merges": []}, "token_type"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"],
      "tokenizer.ggml.merges": [], "tokenizer.ggml.add_bos_token": True}, "BOS"),
])
def test_bad_metadata_is_a_clear_value_error(meta: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Tokenizer.from_metadata(meta)


def _naive_bpe(word_symbols: list[str], merges: list[str]) -> list[str]:
    """Merge by rank, one pair at a time, leftmost on ties: the definition, restated plainly."""
    rank = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
    parts = list(word_symbols)
    while True:
        candidates = [(rank[(a, b)], i) for i, (a, b) in enumerate(itertools.pairwise(parts))
                      if (a, b) in rank]
        if not candidates:
            return parts
        _, i = min(candidates)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def test_bpe_merges_follow_rank_order_against_naive_reference() -> None:
    b = _byte_symbols()
    sp = b[ord(" ")]
    merges = ("a b", "b c", "ab c", "c c", "a a", "aa a", f"{sp} a", f"{sp}a b", "b b")
    tok = Tokenizer.from_metadata(bpe_meta("gpt-2", merges=merges))
    rng = random.Random(7)
    for _ in range(300):
        word = "".join(rng.choice("abc") for _ in range(rng.randint(1, 12)))
        for text in (word, " " + word):
            expected = _naive_bpe([b[x] for x in text.encode()], list(merges))
            got = [tok.token_text(i) for i in tok.encode(text)]
            assert got == expected, text
    # hand-derived: "abc" merges a+b (rank 0) before b+c (rank 1), then ab+c
    assert [tok.token_text(i) for i in tok.encode("abc")] == ["abc"]
    # "aaa": the leftmost "a a" merges first, leaving "aa a", which is itself a merge
    assert [tok.token_text(i) for i in tok.encode("aaa")] == ["aaa"]
    # "aaaa": after the first "a a", the remaining "a a" (rank 4) beats "aa a" (rank 5)
    assert [tok.token_text(i) for i in tok.encode("aaaa")] == ["aa", "aa"]


def test_long_words_take_the_compiled_loop_with_the_same_result() -> None:
    b = _byte_symbols()
    merges = ("a b", "b c", "ab c", "c c", "a a", "aa a", "b b", "aa aa", "abc abc")
    tok = Tokenizer.from_metadata(bpe_meta("gpt-2", merges=merges))
    rng = random.Random(11)
    for n in (48, 60, 200, 2000):  # at and above the length that goes to the compiled loop
        for alphabet in ("a", "ab", "abc"):
            word = "".join(rng.choice(alphabet) for _ in range(n))
            expected = _naive_bpe([b[x] for x in word.encode()], list(merges))
            assert [tok.token_text(i) for i in tok.encode(word)] == expected, word


@pytest.mark.real_model
def test_smollm2_long_words_merge_alike_in_both_loops(smollm: Tokenizer) -> None:
    from engine.tokenizer.bpe import BpeEncoder
    from engine.tokenizer.bpe import byte_encode as _byte_encode

    bpe = smollm._encoder
    assert isinstance(bpe, BpeEncoder)

    rng = random.Random(5)
    for alphabet in ("a", "ab", "thequickbrownfox", "日本語中文かな", "éèàç", "0123456789"):
        for n in (48, 300, 4000):
            word = "".join(rng.choice(alphabet) for _ in range(n))
            assert bpe.long_word(word) == bpe.word(_byte_encode(word)), word[:20]


def test_llama3_ignore_merges_uses_whole_word_tokens() -> None:
    # "hello" is a token but no merges build it: llama-3 style vocabularies still use it whole
    meta = bpe_meta("llama-bpe", extra=("hello",), add_bos_token=False)
    tok = Tokenizer.from_metadata(meta)
    assert [tok.token_text(i) for i in tok.encode("hello")] == ["hello"]
    plain = Tokenizer.from_metadata(bpe_meta("gpt-2", extra=("hello",)))
    assert [plain.token_text(i) for i in plain.encode("hello")] == list("hello")


def test_llama3_adds_bos_by_default_and_file_flag_wins() -> None:
    specials = (("<|begin_of_text|>", CONTROL), ("<|end_of_text|>", CONTROL))
    tok = Tokenizer.from_metadata(bpe_meta("llama-bpe", specials=specials, bos_token_id=0,
                                           eos_token_id=1))
    assert tok.add_bos and tok.encode("a", add_special=True)[0] == 0
    assert tok.encode("a", add_special=False)[0] != 0
    off = Tokenizer.from_metadata(bpe_meta("llama-bpe", specials=specials, bos_token_id=0,
                                           eos_token_id=1, add_bos_token=False))
    assert not off.add_bos and off.encode("a", add_special=True)[0] != 0
    eos = Tokenizer.from_metadata(bpe_meta("gpt-2", specials=specials, bos_token_id=0,
                                           eos_token_id=1, add_eos_token=True))
    assert eos.encode("a", add_special=True)[-1] == 1
    assert eos.decode(eos.encode("a", add_special=True), skip_special=True) == "a"


def test_special_tokens_longest_first_and_user_defined_always() -> None:
    specials = (("<a>", CONTROL), ("<a><b>", CONTROL), ("ab", CONTROL), ("bcd", CONTROL),
                ("<tool>", USER_DEFINED))
    tok = Tokenizer.from_metadata(bpe_meta("gpt-2", specials=specials))
    ida, idab, _id_ab, id_bcd, id_tool = range(5)
    assert tok.encode("<a><b>", parse_special=True) == [idab]
    assert tok.encode("<a><a><b><a>", parse_special=True) == [ida, idab, ida]
    # every occurrence of the longer token is cut first, even to the right of a shorter one
    assert tok.encode("abcd", parse_special=True) == tok.encode("a") + [id_bcd]
    # control tokens stay text without parse_special; user-defined tokens never do
    assert ida not in tok.encode("x<a>y")
    assert tok.decode(tok.encode("x<a>y")) == "x<a>y"
    assert tok.encode("x<tool>y") == tok.encode("x") + [id_tool] + tok.encode("y")
    assert tok.encode("x<tool>y", parse_special=True) == tok.encode("x<tool>y")
    # decode renders control tokens unless skipped; user-defined tokens are plain text
    ids = tok.encode("<a>hi<tool>", parse_special=True)
    assert tok.decode(ids) == "<a>hi<tool>"
    assert tok.decode(ids, skip_special=True) == "hi<tool>"


def test_end_of_generation_tokens_found_by_text() -> None:
    specials = (("<|endoftext|>", CONTROL), ("<|im_end|>", NORMAL), ("<|fim_pad|>", CONTROL),
                ("<|im_start|>", CONTROL), ("<|eot_id|>", USER_DEFINED))
    tok = Tokenizer.from_metadata(bpe_meta("gpt-2", specials=specials, eos_token_id=0))
    assert tok.eog_ids == {0, 1, 2, 4}
    assert tok.eos_id == 0
    assert tok.eot_id == 0  # the lowest id among the end-of-turn texts (<|endoftext|> is one)
    # tokens recognised by text become control tokens: parsed only with parse_special
    assert tok.token_type(1) == CONTROL and tok.token_type(4) == CONTROL
    assert tok.encode("<|eot_id|>") != [4]
    assert tok.encode("<|eot_id|>", parse_special=True) == [4]


def test_out_of_range_special_id_is_ignored(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.tokenizer"):
        tok = Tokenizer.from_metadata(bpe_meta("gpt-2", eos_token_id=10_000))
    assert tok.eos_id is None and caplog.records


# -- synthetic SentencePiece vocabularies ---------------------------------------------------------
def spm_meta(pieces: dict[str, float], **flags: object) -> dict[str, object]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)
    types = [int(UNKNOWN), int(CONTROL), int(CONTROL)] + [int(BYTE)] * 256 + [1] * len(pieces)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + list(pieces.values())
    meta: dict[str, object] = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                               "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores}
    meta.update({f"tokenizer.ggml.{k}": v for k, v in flags.items()})
    return meta


def spm_pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.token_text(i) for i in ids]


def _naive_spm(text: str, scores: dict[str, float]) -> list[str]:
    """Greedy SPM as defined: merge the adjacent pair forming the highest-scoring token
    (leftmost on ties) until none is left; characters with no token become byte tokens."""
    syms = list(text)
    while True:
        best = None
        for i in range(len(syms) - 1):
            joined = syms[i] + syms[i + 1]
            if joined in scores and (best is None or scores[joined] > best[0]):
                best = (scores[joined], i)
        if best is None:
            break
        i = best[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    out = []
    for s in syms:
        out += [s] if s in scores else [f"<0x{b:02X}>" for b in s.encode()]
    return out


W = SPM_SPACE
HELLO = {W: -1.0, "h": -2.0, "e": -2.0, "l": -2.0, "o": -2.0, "w": -2.0, "r": -2.0, "d": -2.0,
         "a": -2.0, "b": -2.0, "c": -2.0,
         "ll": -3.0, "he": -3.5, "hell": -4.0, "hello": -4.5, W + "h": -5.0, W + "hello": -5.5,
         "or": -3.0, "wor": -4.0, "ld": -4.2, "world": -4.8, W + "w": -6.0, W + "world": -6.5,
         "ab": -1.0, "bc": -1.5}


def test_spm_hand_derived_merges() -> None:
    tok = Tokenizer.from_metadata(spm_meta(HELLO))
    assert tok.add_bos and tok.add_space_prefix and tok.bos_id == 1 and tok.eos_id == 2
    # "▁hello▁world": ll, he, hell, hello; or, wor, ld, world; ▁hello, ▁world
    ids = tok.encode("hello world")
    assert spm_pieces(tok, ids) == [W + "hello", W + "world"]
    # "ab" (-1) beats "bc" (-1.5); "abc" is no token, so c stays alone
    no_prefix = Tokenizer.from_metadata(spm_meta(HELLO, add_space_prefix=False))
    assert spm_pieces(no_prefix, no_prefix.encode("abc")) == ["ab", "c"]
    scores = dict(HELLO, bc=-0.5)
    swapped = Tokenizer.from_metadata(spm_meta(scores, add_space_prefix=False))
    assert spm_pieces(swapped, swapped.encode("abc")) == ["a", "bc"]
    # equal scores: the leftmost pair wins
    tie = Tokenizer.from_metadata(spm_meta({"a": -1.0, "aa": -1.0}, add_space_prefix=False))
    assert spm_pieces(tie, tie.encode("aaa")) == ["aa", "a"]


def test_spm_byte_fallback_and_round_trip() -> None:
    tok = Tokenizer.from_metadata(spm_meta(HELLO))
    ids = tok.encode("hé€")
    assert spm_pieces(tok, ids) == [W + "h", "<0xC3>", "<0xA9>", "<0xE2>", "<0x82>", "<0xAC>"]
    for text in ("hé€", "hello world", "  two  spaces ", "new\nline", "😀 hello"):
        assert tok.decode(tok.encode(text)) == text


def test_spm_special_tokens_bos_and_space_prefix_after_specials() -> None:
    tok = Tokenizer.from_metadata(spm_meta(HELLO))
    ids = tok.encode("<s>hello</s>world", add_special=True, parse_special=True)
    # BOS from add_special, then <s> from the text; text after a special token gets a space
    assert spm_pieces(tok, ids) == ["<s>", "<s>", W + "hello", "</s>", W + "world"]
    assert spm_pieces(tok, tok.encode("<unk>", parse_special=True)) == ["<unk>"]
    assert "<unk>" not in spm_pieces(tok, tok.encode("<unk>"))
    with_bos = tok.encode("hello world", add_special=True)
    assert with_bos[0] == tok.bos_id
    assert tok.decode(with_bos) == "<s> hello world"
    # llama.cpp's llama_detokenize: removing BOS keeps the first token's space
    assert tok.decode(with_bos, skip_special=True) == " hello world"


def test_spm_incremental_decoder_keeps_the_prefix_space() -> None:
    tok = Tokenizer.from_metadata(spm_meta(HELLO))
    ids = tok.encode("hello wörld")
    dec = tok.incremental_decoder()
    streamed = "".join(dec.push(i) for i in ids) + dec.flush()
    assert streamed == " hello wörld"  # a continuation's leading space is real text
    assert tok.decode(ids) == "hello wörld"


def test_spm_matches_naive_greedy_on_random_vocabularies() -> None:
    rng = random.Random(99)
    alphabet = "ab c" + "é"
    for _ in range(30):
        scores: dict[str, float] = dict.fromkeys(("a", "b", " ".replace(" ", W)), -10.0)
        for _ in range(25):
            piece = "".join(rng.choice("ab" + W) for _ in range(rng.randint(2, 5)))
            scores[piece] = -float(rng.randint(1, 6))  # integer scores: many ties
        tok = Tokenizer.from_metadata(spm_meta(scores, add_space_prefix=False))
        for _ in range(20):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
            expected = _naive_spm(text.replace(" ", W), scores)
            assert spm_pieces(tok, tok.encode(text)) == expected, text
            assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("text, qwen2, qwen35", [
    ("nai\u0308ve cafe\u0301",                                   # NFD: letters + combining marks
     ["nai", "\u0308ve", " cafe", "\u0301"], ["nai\u0308ve", " cafe\u0301"]),
    ("नमस्ते दुनिया",                                               # vowel signs and virama are \p{M}
     ["नमस", "्त", "े", " द", "ुन", "िय", "ा"], ["नमस्ते", " दुनिया"]),
    ("x !\u0301 ok", ["x", " !\u0301", " ok"], ["x", " !", "\u0301", " ok"]),
    ("go\u0300\n\n", ["go", "\u0300\n\n"], ["go\u0300", "\n\n"]),
])
def test_qwen35_letter_runs_keep_their_combining_marks(text: str, qwen2: list[str],
                                                       qwen35: list[str]) -> None:
    """llama.cpp's qwen35 rule (src/unicode.cpp unicode_regex_split_custom_qwen35, the regex
    of llama-vocab.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35): qwen2's with [\\p{L}\\p{M}]+ for letter
    runs and marks excluded from the punctuation run. So a mark stays with its letters, where
    qwen2 starts a new word at it (its optional leading non-letter) or adds it to punctuation;
    a mark after punctuation that a space led is a word of its own (` ?[^\\s\\p{L}\\p{M}\\p{N}]+`
    stops at it, then `[\\p{L}\\p{M}]+` takes it)."""
    assert Tokenizer.from_metadata(bpe_meta("qwen2")).pre_tokenize(text) == qwen2
    assert Tokenizer.from_metadata(bpe_meta("qwen35")).pre_tokenize(text) == qwen35

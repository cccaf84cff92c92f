"""Tokenizers built from GGUF `tokenizer.ggml.*` metadata, behaving like llama.cpp's.

Two vocabulary models are supported (`tokenizer.ggml.model`):

  gpt2   byte-level BPE. Text -> pre-tokenizer regexes (chosen by `tokenizer.ggml.pre`, applied
         one after another, each splitting the pieces of the previous one) -> each piece's UTF-8
         bytes mapped to printable characters -> merges applied lowest rank first.
  llama  SentencePiece as llama.cpp runs it (SPM): spaces become U+2581, a space is prefixed to
         the text, adjacent symbols merge highest-score first, and characters no token covers
         fall back to <0xXX> byte tokens.

Before either runs, special tokens are cut out of the text (llama.cpp's tokenizer_st_partition):
longest token text first, every occurrence. Control and unknown tokens are cut out only with
`parse_special=True`; user-defined tokens always are, as in llama.cpp and Hugging Face.

Merging is O(n log n) for any text (engine/tokenizer/merge.py); long words (BPE) and long texts
(SentencePiece) merge in the compiled twin of that loop (engine/kernels/merge.py).

Decoding is the byte-exact inverse: token_bytes() gives each token's raw bytes; invalid UTF-8
is replaced only when bytes become text. IncrementalDecoder streams that text token by token.

Each vocabulary model is an Encoder subclass chosen by vocab.py's ENCODERS table
(engine/tokenizer/encoder.py says what one provides); the Tokenizer names no model.

One module per concern: vocab.py (special tokens, the Tokenizer), metadata.py (reading the keys),
encoder.py (the vocabulary model seam), bpe.py, spm.py, pretokenizers.py, merge.py (the merge
loops), decode.py (streaming decode).
"""

from .decode import IncrementalDecoder
from .encoder import Encoder
from .pretokenizers import KNOWN_PRE_TOKENIZERS, PreTokenizer, split_words
from .spm import SPM_SPACE
from .vocab import ENCODERS, Tokenizer, TokenType, vocabulary_model

__all__ = ["ENCODERS", "KNOWN_PRE_TOKENIZERS", "SPM_SPACE", "Encoder", "IncrementalDecoder",
           "PreTokenizer", "TokenType", "Tokenizer", "split_words", "vocabulary_model"]

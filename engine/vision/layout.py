"""Where an image's chunks go in a prompt, with mtmd's marker tokens around each chunk.

    prompt text  "... <__media__> ..."  (the media marker, one per image, in order)
    gemma3       the text around the marker gets "<start_of_image>" / "<end_of_image>" before
                 it is split, so they are tokenized with their neighbours, as mtmd does
    idefics3     per tile row by row: "<fake_token_around_image><row_R_col_C>" (tokenized on its
                 own) + tile, the "\n" token between rows; then the tokens "\n\n",
                 <fake_token_around_image>, <global-img>, the overview, <fake_token_around_image>
    mlp          the image's rows alone
Text parts are tokenized each on its own with parse_special (the first one with add_special),
marker strings too; what mtmd looks up as a token ("\n\n") is one vocabulary id.
"""
from __future__ import annotations

from collections.abc import Sequence

from engine.prompt import EmbeddingSpan, Prompt, Span, TokenSpan
from engine.tokenizer.vocab import Tokenizer
from engine.vision.mmproj import VisionParams
from engine.vision.model import EncodedImage

MEDIA_MARKER = "<__media__>"

# one piece of an image's layout: text tokenized on its own, literal ids, or a chunk index
Piece = str | tuple[int, ...] | int


def _byte_level(text: str) -> str:
    """GPT-2's byte -> symbol mapping (how byte-level BPE vocabularies store "\\n" as "Ċ")."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return "".join(table[b] for b in text.encode())


def lookup_token(tok: Tokenizer, text: str) -> int:
    """The one vocabulary id whose text is `text` (mtmd's lookup_token)."""
    for stored in (text, _byte_level(text), text.replace(" ", "\u2581")):
        if (i := tok.token_id(stored)) is not None:
            return i
    ids = tok.encode(text, parse_special=True)
    if len(ids) != 1:
        raise ValueError(f"the vocabulary has no single token for {text!r}")
    return ids[0]


def text_wrap(hp: VisionParams) -> tuple[str, str]:
    return ("<start_of_image>", "<end_of_image>") if hp.projector == "gemma3" else ("", "")


def bidirectional(hp: VisionParams) -> bool:
    """Do the image's rows attend to each other? Where the text family does (mtmd turns causal
    attention off for a Gemma 3 image chunk)."""
    return hp.projector == "gemma3"


def chunk_layout(hp: VisionParams, image: EncodedImage, tok: Tokenizer) -> list[Piece]:
    if hp.projector != "idefics3" or image.grid == (0, 0):
        return list(range(len(image.chunks)))
    rows, cols = image.grid
    fake = lookup_token(tok, "<fake_token_around_image>")
    out: list[Piece] = []
    for r in range(rows):
        for c in range(cols):
            out += [f"<fake_token_around_image><row_{r + 1}_col_{c + 1}>", r * cols + c]
        if r != rows - 1:
            out.append((lookup_token(tok, "\n"),))
    out += [(lookup_token(tok, "\n\n"), fake, lookup_token(tok, "<global-img>")), rows * cols, (fake,)]
    return out


def image_prompt(text: str, images: Sequence[EncodedImage], hp: VisionParams,
                 tok: Tokenizer, marker: str = MEDIA_MARKER) -> Prompt:
    """The prompt `text` with its media markers replaced by the images' chunks and markers."""
    before, after = text_wrap(hp)
    parts = text.replace(marker, before + marker + after).split(marker)
    if len(parts) != len(images) + 1:
        raise ValueError(f"the prompt has {len(parts) - 1} media markers for {len(images)} images")
    spans: list[Span] = []
    ids: list[int] = tok.encode(parts[0], add_special=True, parse_special=True)
    for image, part in zip(images, parts[1:]):
        for piece in chunk_layout(hp, image, tok):
            if isinstance(piece, str):
                ids += tok.encode(piece, parse_special=True)
            elif isinstance(piece, tuple):
                ids += piece
            else:
                spans += [TokenSpan(tuple(ids)), EmbeddingSpan(
                    image.chunks[piece].rows, image.chunks[piece].key,
                    bidirectional=bidirectional(hp))]
                ids = []
        ids += tok.encode(part, parse_special=True)
    return Prompt([*spans, TokenSpan(tuple(ids))])

"""A reranker's input for one (query, document) pair, as llama-server builds it
(tools/server/server-common.cpp, format_prompt_rerank).

    the file has a rerank template (tokenizer.chat_template.rerank, Qwen3-Reranker's):
        the template with {query} and {document} replaced, tokenized with special tokens parsed
        and none added
    else (a BERT cross-encoder):
        [BOS if add_bos] query [EOS if add_eos] [SEP if add_sep] document [EOS if add_eos]
        query and document tokenized without special tokens; EOS is the separator when the
        vocabulary has no EOS
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .loaded import ModelTokenizer

TEMPLATE_KEY = "tokenizer.chat_template.rerank"


def rerank_template(metadata: Mapping[str, Any]) -> str | None:
    value = metadata.get(TEMPLATE_KEY)
    return value if isinstance(value, str) else None


def rerank_ids(tokenizer: ModelTokenizer, metadata: Mapping[str, Any], query: str,
               document: str) -> list[int]:
    """The token ids a reranker scores for (query, document)."""
    template = rerank_template(metadata)
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", document)
        return tokenizer.encode(text, add_special=False, parse_special=True)
    q = tokenizer.encode(query)
    d = tokenizer.encode(document)
    eos = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
    out: list[int] = []
    if tokenizer.add_bos and tokenizer.bos_id is not None:
        out.append(tokenizer.bos_id)
    out += q
    if tokenizer.add_eos and eos is not None:
        out.append(eos)
    if tokenizer.add_sep and tokenizer.sep_id is not None:
        out.append(tokenizer.sep_id)
    out += d
    if tokenizer.add_eos and eos is not None:
        out.append(eos)
    return out

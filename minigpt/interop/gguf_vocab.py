"""A minigpt tokenizer as GGUF metadata: llama.cpp's `gpt2` (byte-level BPE) tokenizer and its pre-tokenizer.

A GGUF file carries the whole tokenizer: every token's text in id order (in the byte-level alphabet of
GPT-2, the same strings as tokenizer.json: fast_tokenizer.vocab_and_merges), the merges, each token's type,
and the name of the pre-tokenizer, which llama.cpp implements by name rather than by regex. So a split
pattern exports only where llama.cpp has a pre-tokenizer that splits identically:

    rustbpe's default (GPT-4's pattern; the `bpe` tokenizer)     llama-bpe (Llama 3's, the same splits)
    tiktoken's cl100k_base pattern                                llama-bpe
    GPT-2's pattern (Hugging Face ByteLevel), tiktoken's gpt2     gpt-2

The tests run llama.cpp's own tokenizer on the val split for each of them. A byte tokenizer has no merges,
and llama.cpp's BPE refuses a file without them; a char tokenizer is no byte-level BPE: both are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import tiktoken

from minigpt.data.tokenizers import TiktokenTokenizer, Tokenizer
from minigpt.errors import UserError
from minigpt.interop.fast_tokenizer import GPT2_PATTERN, fast_tokenizer, vocab_and_merges

GPT4_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""  # noqa: E501
CL100K_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""  # noqa: E501
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
PRE_TOKENIZERS = {GPT4_PATTERN: "llama-bpe", CL100K_PATTERN: "llama-bpe", GPT2_PATTERN: "gpt-2",
                  R50K_PATTERN: "gpt-2"}


def pre_tokenizer_of(encoding: tiktoken.Encoding) -> str:
    """llama.cpp's name for the pre-tokenizer that splits text as `encoding`'s pattern does."""
    pre = PRE_TOKENIZERS.get(encoding._pat_str)
    if pre is None:
        raise UserError(f"tokenizer {encoding.name}'s split pattern has no llama.cpp pre-tokenizer known to "
                        "split the same way (known: the bpe, gpt2 and cl100k patterns); nothing exported")
    return pre


@dataclass
class Vocabulary:
    """What a GGUF file says of its tokenizer (llama.cpp's names)."""

    pre: str  # the pre-tokenizer
    tokens: list[str]  # every id's text, in id order
    types: list[int]  # gguf.TokenType of each id
    merges: list[str]  # "left right", in priority order
    eot_id: int


def gguf_vocabulary(tok: Tokenizer, vocab_size: int) -> Vocabulary:
    """`tok` as GGUF sees it, `vocab_size` ids long: ids past the tokenizer's (a padded model vocabulary)
    become unused placeholder tokens, so llama.cpp's vocabulary is as long as the embedding table."""
    if not isinstance(tok, TiktokenTokenizer):
        why = "has no merges, which llama.cpp's BPE needs" if tok.kind == "byte" else "is no byte-level BPE"
        raise UserError(f"tokenizer {tok.name} {why}; GGUF export needs tokenizer=bpe (or gpt2, cl100k)")
    pre = pre_tokenizer_of(tok.encoding)
    tokens, merges = vocab_and_merges(fast_tokenizer(tok))
    n_ranks, specials = len(tok.encoding._mergeable_ranks), set(tok.encoding._special_tokens.values())
    # after the ranks come the special tokens, and placeholders for ids between them that name no token
    types = [gguf.TokenType.NORMAL if i < n_ranks else gguf.TokenType.CONTROL if i in specials
             else gguf.TokenType.UNUSED for i in range(len(tokens))]
    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
    return Vocabulary(pre, tokens, types, merges, tok.eot_id)


def add_vocabulary(writer: gguf.GGUFWriter, vocab: Vocabulary) -> None:
    writer.add_tokenizer_model("gpt2")  # llama.cpp's name for byte-level BPE
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.eot_id)  # a document starts after <|endoftext|> (an empty prompt's token)
    writer.add_eos_token_id(vocab.eot_id)  # and ends with it
    writer.add_pad_token_id(vocab.eot_id)
    # minigpt's generate encodes a prompt as it is; llama.cpp would prepend BOS unless told not to
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)

"""A minigpt tokenizer as a `tokenizers` tokenizer (the Rust library behind Hugging Face's fast tokenizers):
the vocabulary and merges that both a tokenizer.json (hf_tokenizer.py) and a GGUF file (gguf_vocab.py) carry.

    bpe, gpt2, cl100k  tiktoken ranks + split pattern -> transformers' own TikTokenConverter: a byte-level
                       BPE whose merges are read off the ranks, with the pattern as its pre-tokenizer
    byte               the same converter on the 256 one-byte ranks with no merges: each byte its own id
    char               a BPE model over the corpus' characters with no merges, decoded by concatenation

`<|endoftext|>` (and any other special token) keeps its id, so the ids equal ours for every text.
"""

from __future__ import annotations

import json

from tokenizers import AddedToken, decoders, models
from tokenizers import Tokenizer as FastTokenizer
from transformers.convert_slow_tokenizer import TikTokenConverter

from minigpt.data.tokenizers import EOT, ByteTokenizer, CharTokenizer, TiktokenTokenizer, Tokenizer
from minigpt.errors import UserError

BYTE_PATTERN = r"[\s\S]+"  # a byte tokenizer has no pre-tokens: the whole text is one piece
# GPT-2's split pattern: what a ByteLevel pre-tokenizer with use_regex=True applies
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class RanksConverter(TikTokenConverter):
    """transformers' converter, handed the ranks in memory: its own loader reads a file through tiktoken's
    download cache, which is keyed on the path alone and would serve a stale copy of an earlier file."""

    def __init__(self, ranks: dict[bytes, int], pattern: str):
        super().__init__(vocab_file=None, pattern=pattern)
        self.ranks = ranks

    def load_tiktoken_bpe(self, tiktoken_url: str) -> dict[bytes, int]:
        return self.ranks


def fast_tokenizer(tok: Tokenizer) -> FastTokenizer:
    """The `tokenizers.Tokenizer` that encodes every text to `tok`'s ids."""
    if isinstance(tok, TiktokenTokenizer):
        fast = RanksConverter(tok.encoding._mergeable_ranks, tok.encoding._pat_str).converted()
        specials = dict(tok.encoding._special_tokens)
    elif isinstance(tok, ByteTokenizer):
        fast = RanksConverter({bytes([b]): b for b in range(256)}, BYTE_PATTERN).converted()
        specials = {EOT: tok.eot_id}
    elif isinstance(tok, CharTokenizer):
        fast = FastTokenizer(models.BPE({c: i for i, c in enumerate(tok.chars)}, [], fuse_unk=False))
        fast.decoder = decoders.Fuse()  # the characters concatenated (no spaces, no byte mapping)
        specials = {EOT: tok.eot_id}
    else:
        raise UserError(f"tokenizer kind {tok.kind} has no Hugging Face conversion")
    _add_specials(fast, specials, tok.name)
    return fast


def _add_specials(fast: FastTokenizer, specials: dict[str, int], name: str) -> None:
    """Add the special tokens at their ids. tokenizers numbers added tokens consecutively after the
    vocabulary, so ids a tokenizer leaves unused between them (cl100k has such gaps) get placeholders."""
    next_id = fast.get_vocab_size(with_added_tokens=False)
    by_id = {i: s for s, i in specials.items()}
    if min(by_id, default=next_id) < next_id:
        raise UserError(f"tokenizer {name} has a special token among its ranks; it cannot be converted")
    for i in range(next_id, max(by_id, default=next_id - 1) + 1):
        content = by_id.get(i, f"<|unused_{i}|>")
        fast.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        if fast.token_to_id(content) != i:
            raise UserError(f"tokenizer {name}: {content} got id {fast.token_to_id(content)}, not {i}")


def vocab_and_merges(fast: FastTokenizer) -> tuple[list[str], list[str]]:
    """Every token's text in id order (byte-level BPE spells bytes as GPT-2's printable characters) and the
    merges as "left right" strings, in priority order."""
    spec = json.loads(fast.to_str())
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, merges

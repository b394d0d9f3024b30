"""minigpt tokenizers as Hugging Face fast tokenizers (`tokenizer.json`), and back.

    bpe, gpt2, cl100k  tiktoken ranks + split pattern -> transformers' own TikTokenConverter: a byte-level
                       BPE whose merges are read off the ranks, with the pattern as its pre-tokenizer
    byte               the same converter on the 256 one-byte ranks with no merges: each byte its own id
    char               a BPE model over the corpus' characters with no merges, decoded by concatenation

`<|endoftext|>` (and any other special token) keeps its id, and `split_special_tokens` makes the HF
tokenizer treat its spelling inside a text as text, as minigpt's `encode` does: ids equal ours for every text.
The vocabulary (`vocab_and_merges`) is also what a GGUF file carries (gguf_vocab.py).

Reading a tokenizer.json back (`tokenizer_from_hf`) recovers these three shapes, and the byte-level BPE of
GPT-2-style folders, whose ranks are the token ids; anything else needs a minigpt tokenizer folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import tiktoken
from tokenizers import AddedToken, decoders, models
from tokenizers import Tokenizer as HFTokenizer
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter, bytes_to_unicode

from minigpt.data.tokenizers import EOT, ByteTokenizer, CharTokenizer, TiktokenTokenizer, Tokenizer
from minigpt.errors import UserError

BYTE_PATTERN = r"[\s\S]+"  # a byte tokenizer has no pre-tokens: the whole text is one piece
# GPT-2's split pattern: what a ByteLevel pre-tokenizer with use_regex=True applies
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TOKENIZER_JSON = "tokenizer.json"


class RanksConverter(TikTokenConverter):
    """transformers' converter, handed the ranks in memory: its own loader reads a file through tiktoken's
    download cache, which is keyed on the path alone and would serve a stale copy of an earlier file."""

    def __init__(self, ranks: dict[bytes, int], pattern: str):
        super().__init__(vocab_file=None, pattern=pattern)
        self.ranks = ranks

    def load_tiktoken_bpe(self, tiktoken_url: str) -> dict[bytes, int]:
        return self.ranks


# ---------------------------------------------------------------------------------------------------- out


def hf_tokenizer(tok: Tokenizer) -> HFTokenizer:
    """The `tokenizers.Tokenizer` that encodes every text to `tok`'s ids."""
    if isinstance(tok, TiktokenTokenizer):
        fast = RanksConverter(tok.encoding._mergeable_ranks, tok.encoding._pat_str).converted()
        specials = dict(tok.encoding._special_tokens)
    elif isinstance(tok, ByteTokenizer):
        fast = RanksConverter({bytes([b]): b for b in range(256)}, BYTE_PATTERN).converted()
        specials = {EOT: tok.eot_id}
    elif isinstance(tok, CharTokenizer):
        fast = HFTokenizer(models.BPE({c: i for i, c in enumerate(tok.chars)}, [], fuse_unk=False))
        fast.decoder = decoders.Fuse()  # the characters concatenated (no spaces, no byte mapping)
        specials = {EOT: tok.eot_id}
    else:
        raise UserError(f"tokenizer kind {tok.kind} has no Hugging Face conversion")
    _add_specials(fast, specials, tok.name)
    return fast


def _add_specials(fast: HFTokenizer, specials: dict[str, int], name: str) -> None:
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


def save_hf_tokenizer(tok: Tokenizer | HFTokenizer, folder: Path, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json in `folder` for a minigpt tokenizer (or its conversion,
    `hf_tokenizer`), written by transformers itself: `AutoTokenizer.from_pretrained(folder)` loads them with
    no custom code."""
    fast = tok if isinstance(tok, HFTokenizer) else hf_tokenizer(tok)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=fast, bos_token=EOT, eos_token=EOT, model_max_length=model_max_length,
        # "<|endoftext|>" typed in a text is text, as in minigpt; no spaces are "cleaned up" when decoding
        split_special_tokens=True, clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(str(folder))


def vocab_and_merges(fast: HFTokenizer) -> tuple[list[str], list[str]]:
    """Every token's text in id order (byte-level BPE spells bytes as GPT-2's printable characters) and the
    merges as "left right" strings, in priority order."""
    spec = json.loads(fast.to_str())
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, merges


# ---------------------------------------------------------------------------------------------------- in


def tokenizer_from_hf(folder: Path) -> Tokenizer:
    """The minigpt tokenizer a HF folder's tokenizer.json describes; UserError for one it cannot express."""
    file = Path(folder) / TOKENIZER_JSON
    if not file.is_file():
        raise UserError(f"{folder} has no {TOKENIZER_JSON}; pass a minigpt tokenizer folder "
                        "(tokenizer_dir=DIR)")
    spec = json.loads(file.read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    if model.get("type") != "BPE" or EOT not in specials:
        raise UserError(f"{file} is not a byte-level or character BPE with {EOT}; pass a minigpt tokenizer "
                        "folder (tokenizer_dir=DIR)")
    vocab: dict[str, int] = model["vocab"]
    pattern = _byte_level_pattern(spec.get("pre_tokenizer"))
    if pattern is None:
        return _char_tokenizer(vocab, model["merges"], specials, file)
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes(byte_of[c] for c in text): i for text, i in vocab.items()}
    if pattern == BYTE_PATTERN and len(ranks) == 256 and specials == {EOT: 256}:
        return ByteTokenizer()
    _check_merges_follow_ranks(model["merges"], vocab, file)
    real = {s: i for s, i in specials.items() if not s.startswith("<|unused_")}
    encoding = tiktoken.Encoding(name=f"bpe-{max(real.values()) + 1}", pat_str=pattern, mergeable_ranks=ranks,
                                 special_tokens=real)
    return TiktokenTokenizer("bpe", encoding)


def _byte_level_pattern(pre: dict | None) -> str | None:
    """The split pattern of a byte-level pre-tokenizer: Split(regex) + ByteLevel(no regex), or ByteLevel with
    GPT-2's built-in regex; None when there is no ByteLevel step (a character tokenizer)."""
    steps = (pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]) if pre else []
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return GPT2_PATTERN
    if kinds == ["Split", "ByteLevel"] and "Regex" in steps[0].get("pattern", {}):
        return steps[0]["pattern"]["Regex"]
    if not kinds:
        return None
    raise UserError(f"the pre-tokenizer {'+'.join(map(str, kinds))} has no minigpt equivalent; pass a "
                    "minigpt tokenizer folder (tokenizer_dir=DIR)")


def _check_merges_follow_ranks(merges: list, vocab: dict[str, int], file: Path) -> None:
    """tiktoken merges the pair whose result has the lowest id; HF BPE the pair listed first. They agree
    exactly when listing order is id order (true of tiktoken-converted and GPT-2 tokenizers; several merges
    may make one token)."""
    ids = [vocab.get(m.replace(" ", "", 1) if isinstance(m, str) else "".join(m), -1) for m in merges]
    if any(b < a for a, b in zip(ids, ids[1:], strict=False)) or -1 in ids:
        raise UserError(f"{file}'s merges are not in the order of their token ids, so tiktoken would "
                        "tokenise differently; pass a minigpt tokenizer folder (tokenizer_dir=DIR)")


def _char_tokenizer(vocab: dict[str, int], merges: list, specials: dict[str, int],
                    file: Path) -> CharTokenizer:
    chars = sorted(vocab, key=vocab.get)
    if merges or any(len(c) != 1 for c in chars) or specials != {EOT: len(chars)} or chars != sorted(chars):
        raise UserError(f"{file} is a BPE without byte-level steps that is not a minigpt character "
                        "tokenizer; pass a minigpt tokenizer folder (tokenizer_dir=DIR)")
    return CharTokenizer(chars)

"""minigpt tokenizers as Hugging Face fast tokenizers (`tokenizer.json`), and back.

Out: the conversion of interop/fast_tokenizer.py, wrapped and saved by transformers itself, with
`split_special_tokens` so the HF tokenizer treats "<|endoftext|>" spelled inside a text as text, as minigpt's
`encode` does: ids equal ours for every text.

In: reading a tokenizer.json back (`tokenizer_from_hf`) recovers the shapes fast_tokenizer.py writes, and the
byte-level BPE of GPT-2-style folders, whose ranks are the token ids; anything else needs a minigpt tokenizer
folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import tiktoken
from tokenizers import Tokenizer as FastTokenizer
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from minigpt.data.tokenizers import EOT, ByteTokenizer, CharTokenizer, TiktokenTokenizer, Tokenizer
from minigpt.errors import UserError
from minigpt.interop.fast_tokenizer import BYTE_PATTERN, GPT2_PATTERN, fast_tokenizer

TOKENIZER_JSON = "tokenizer.json"


# ---------------------------------------------------------------------------------------------------- out


def save_hf_tokenizer(tok: Tokenizer | FastTokenizer, folder: Path, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json in `folder` for a minigpt tokenizer (or its conversion,
    `fast_tokenizer`), written by transformers itself: `AutoTokenizer.from_pretrained(folder)` loads them with
    no custom code."""
    fast = tok if isinstance(tok, FastTokenizer) else fast_tokenizer(tok)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=fast, bos_token=EOT, eos_token=EOT, model_max_length=model_max_length,
        # "<|endoftext|>" typed in a text is text, as in minigpt; no spaces are "cleaned up" when decoding
        split_special_tokens=True, clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(str(folder))


# ---------------------------------------------------------------------------------------------------- in


def tokenizer_from_hf(folder: Path) -> Tokenizer:
    """The minigpt tokenizer a HF folder's tokenizer.json describes; UserError for one it cannot express."""
    file = Path(folder) / TOKENIZER_JSON
    if not file.is_file():
        raise UserError(f"{folder} has no {TOKENIZER_JSON}; pass a minigpt tokenizer folder "
                        "(tokenizer_dir=DIR)")
    spec, vocab, merges, specials = _read_bpe(file)
    pre = spec.get("pre_tokenizer")
    pattern = _byte_level_pattern(pre if isinstance(pre, dict) else {"type": pre} if pre else None)
    if pattern is None:
        return _char_tokenizer(vocab, merges, specials, file)
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    if any(c not in byte_of for text in vocab for c in text):
        raise UserError(f"{file} has tokens outside the byte-level alphabet; pass a minigpt tokenizer folder "
                        "(tokenizer_dir=DIR)")
    ranks = {bytes(byte_of[c] for c in text): i for text, i in vocab.items()}
    if pattern == BYTE_PATTERN and len(ranks) == 256 and specials == {EOT: 256}:
        return ByteTokenizer()
    _check_merges_follow_ranks(merges, vocab, file)
    real = {s: i for s, i in specials.items() if not s.startswith("<|unused_")}
    encoding = tiktoken.Encoding(name=f"bpe-{max(real.values()) + 1}", pat_str=pattern, mergeable_ranks=ranks,
                                 special_tokens=real)
    return TiktokenTokenizer("bpe", encoding)


def _read_bpe(file: Path) -> tuple[dict, dict[str, int], list, dict[str, int]]:
    """(the whole spec, vocab, merges, special tokens) of a tokenizer.json holding a BPE model with
    <|endoftext|>; UserError for a file that is damaged or holds another kind of tokenizer."""
    try:
        spec = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{file} is not valid JSON ({e})") from None
    model = spec.get("model") if isinstance(spec, dict) else None
    added = spec.get("added_tokens", []) if isinstance(spec, dict) else None
    vocab, merges = (model.get("vocab"), model.get("merges", [])) if isinstance(model, dict) else (None, None)
    well_formed = (isinstance(vocab, dict) and isinstance(merges, list) and isinstance(added, list)
                   and all(isinstance(i, int) for i in vocab.values())
                   and all(isinstance(t, dict) and isinstance(t.get("id"), int) for t in added))
    specials = {t.get("content"): t["id"] for t in added if t.get("special")} if well_formed else {}
    if not well_formed or model.get("type") != "BPE" or EOT not in specials:
        raise UserError(f"{file} is not a byte-level or character BPE with {EOT}; pass a minigpt tokenizer "
                        "folder (tokenizer_dir=DIR)")
    return spec, vocab, merges, specials


def _byte_level_pattern(pre: dict | None) -> str | None:
    """The split pattern of a byte-level pre-tokenizer: Split(regex) + ByteLevel(no regex), or ByteLevel with
    GPT-2's built-in regex; None when there is no ByteLevel step (a character tokenizer)."""
    steps = (pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]) if pre else []
    kinds = [s.get("type") if isinstance(s, dict) else s for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return GPT2_PATTERN
    pattern = steps[0].get("pattern") if kinds == ["Split", "ByteLevel"] else None
    if isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str):
        return pattern["Regex"]
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

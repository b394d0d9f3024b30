"""Prompts, stop strings and streamed decoding, with the real char and byte tokenizers."""

from __future__ import annotations

import pytest
import torch
from model_helpers import tiny_config

from minigpt.data.tokenizers import ByteTokenizer, CharTokenizer
from minigpt.errors import UserError
from minigpt.generation.text import TextStream, encode_prompt, read_prompt, unescape
from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate
from minigpt.sampling.next_token import sample
from minigpt.sampling.params import SamplingParams
from minigpt.sampling.sequences import StopStrings


def test_empty_prompt_starts_from_eot_and_unknown_chars_are_user_errors():
    tok = CharTokenizer.from_texts(["abc de"])
    assert encode_prompt(tok, "") == [tok.eot_id]
    assert tok.decode(encode_prompt(tok, "bad cab")) == "bad cab"
    with pytest.raises(UserError, match="'z'"):
        encode_prompt(tok, "zebra")


def test_prompt_file(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("héllo\n", encoding="utf-8")
    assert read_prompt("", str(f)) == "héllo\n"
    assert read_prompt("inline", None) == "inline"
    with pytest.raises(UserError, match="does not exist"):
        read_prompt("", str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(UserError, match="is empty"):
        read_prompt("", str(tmp_path / "empty.txt"))


def test_stream_pieces_join_to_the_text_and_wait_for_whole_characters():
    tok = ByteTokenizer()
    text = "a€b 🙂 c"
    ids = tok.encode(text)
    stream = TextStream(tok.decode)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.finish(text) == text
    assert "\ufffd" not in "".join(pieces)
    assert pieces[1:4] == ["", "", "€"]  # the euro sign's three bytes arrive one token at a time


def test_stop_strings_stop_cut_and_are_never_streamed():
    tok = ByteTokenizer()
    stop = StopStrings(["\n\n", "END"], tok.decode)
    text = "x = 1\nEN y\n\nmore"
    ids = tok.encode(text)
    stream = TextStream(tok.decode, stop.holdback())
    printed = ""
    for n, i in enumerate(ids, 1):
        printed += stream.push(i)
        if stop(0, ids[:n]):
            break
    assert tok.decode(ids[:n]) == "x = 1\nEN y\n\n"  # stopped at the token completing the stop string
    final = stop.cut(tok.decode(ids[:n]))
    assert final == "x = 1\nEN y"
    assert printed + stream.finish(final) == final
    assert stop.cut("no stop here") == "no stop here" and not StopStrings([], tok.decode)


def test_stop_strings_end_generation_in_the_loop():
    tok = ByteTokenizer()
    torch.manual_seed(0)
    cfg = tiny_config(n_layer=1, n_head=2, n_embd=16, block_size=16)
    model = build_model(cfg, vocab_size=tok.vocab_size).eval()
    params = SamplingParams(1.0, vocab_size=tok.vocab_size)

    def run(**kw):
        g = torch.Generator().manual_seed(0)
        return generate(model, [[65]], max_new_tokens=20, params=params, generator=g, **kw)

    free = run()
    target = tok.decode(free.tokens[0][5:7])  # a string the free run produces at tokens 5-6
    res = run(stop_fn=StopStrings([target], tok.decode))
    assert target in tok.decode(res.tokens[0]) and len(res.tokens[0]) <= 7
    assert free.tokens[0][: len(res.tokens[0])] == res.tokens[0]


def test_padded_model_vocabulary_is_never_sampled():
    logits = torch.zeros(1000, 10)
    logits[:, 8:] = 5.0  # the padding ids are the most likely
    for params in (SamplingParams(1.0, vocab_size=8), SamplingParams(0.0, vocab_size=8)):
        assert int(sample(logits, params, torch.Generator().manual_seed(0)).max()) < 8


def test_stop_strings_from_the_command_line_are_unescaped():
    assert unescape(r"\n\n") == "\n\n" and unescape(r"a\tb") == "a\tb"
    assert unescape(r"keep \\n literal") == r"keep \n literal" and unescape("héllo") == "héllo"

"""The body of `scripts/generate.py`: load a checkpoint, sample, stream, summarise; or run a REPL.

Kept out of the script so tests can call it with a config object and in-memory streams.
Output: samples on `out` (the prompt, then the continuation), one summary line on `err`. Either may be a pipe
whose reader stops early (`| head`): the rest of its output is then dropped quietly (output.py), and the
samples are still generated to the end and returned whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TextIO

import torch

from minigpt.checkpoint.load import load_model
from minigpt.device.probe import in_out_layout_speedup
from minigpt.errors import UserError
from minigpt.generation.config import GenerateConfig
from minigpt.generation.output import ClosableOutput
from minigpt.generation.session import Session
from minigpt.generation.text import TextStream, encode_prompt, read_prompt, unescape
from minigpt.model.gpt import GPT
from minigpt.sampling.decode import stream_tokens
from minigpt.sampling.naive import naive_stream_tokens
from minigpt.sampling.sequences import GenerationStats, StopStrings, default_keep, window_length

SEPARATOR = "\n" + "-" * 40 + "\n"
log = logging.getLogger(__name__)


def load_for_generation(cfg: GenerateConfig) -> tuple[torch.nn.Module, Any, dict]:
    """(model ready to decode, tokenizer, meta) from `cfg.checkpoint`, or the newest run under outputs/."""
    model, tokenizer, meta = load_model(cfg.checkpoint, cfg.device.type, cfg.weights_dtype)
    return prepare_for_decoding(model), tokenizer, meta


# The (in, out) layout must beat nn.Linear's own by this factor to be chosen: the two differ by 2-3x where
# they differ at all (gpt.py), so a smaller ratio is timing noise, not a reason to copy every weight.
IN_OUT_MIN_SPEEDUP = 1.2


def prepare_for_decoding(model: GPT) -> GPT:
    """`prepare_for_inference` with the weight layout measured on this machine: the one step that makes a
    loaded model a decoder rather than a trainee. On a CPU, one-row products with the head's weight are timed
    in both layouts (~0.1 s; fp32 and bf16 prefer opposite ones on AVX2, see gpt.py); a GPU keeps
    nn.Linear's."""
    weight = model.lm_head.weight
    in_out = False
    if weight.device.type == "cpu":
        speedup = in_out_layout_speedup(weight)
        in_out = speedup >= IN_OUT_MIN_SPEEDUP
        log.debug("decode weights %s: one-row products measured %.2fx as fast laid out (in, out)",
                 "laid out (in, out)" if in_out else "kept (out, in)", speedup)
    return model.prepare_for_inference(in_out_layout=in_out)


def _stops(cfg: GenerateConfig, tokenizer: Any) -> tuple[list[int], StopStrings]:
    eot = getattr(tokenizer, "eot_id", None)
    return ([] if eot is None else [eot]), StopStrings([unescape(s) for s in cfg.stop], tokenizer.decode)


def run_samples(
    cfg: GenerateConfig, model: torch.nn.Module, tokenizer: Any, out: TextIO, err: TextIO
) -> tuple[list[str], GenerationStats]:
    """Generate `cfg.num_samples` continuations of the prompt as one batch; return their texts and stats."""
    out, err = ClosableOutput(out), ClosableOutput(err)
    prompt = read_prompt(cfg.prompt, cfg.prompt_file)
    ids = encode_prompt(tokenizer, prompt)
    stop_ids, stop_strings = _stops(cfg, tokenizer)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(cfg.seed)
    stats = GenerationStats()
    run = stream_tokens if cfg.kv_cache else naive_stream_tokens
    keep = default_keep(model.config.block_size, cfg.window_keep_ratio)
    seen = window_length(len(ids), model.config.block_size, keep)
    if seen < len(ids):  # the window rule (sampling/sequences.py) cuts it: say so rather than hide it
        err.write(f"note: the prompt has {len(ids)} tokens, more than the model's context of "
                  f"{model.config.block_size}; it continues from the last {seen} of them\n")
    steps = run(
        model, [ids] * cfg.num_samples, max_new_tokens=cfg.max_new_tokens,
        params=cfg.sampling(tokenizer.vocab_size), generator=generator,
        stop_ids=stop_ids, stop_fn=stop_strings or None, keep=keep, stats=stats,
    )  # fmt: skip
    outputs: list[list[int]] = [[] for _ in range(cfg.num_samples)]
    live = TextStream(tokenizer.decode, stop_strings.holdback()) if cfg.stream else None
    out.write(prompt)
    for step in steps:
        for b, t in enumerate(step.emitted):
            if t is not None:
                outputs[b].append(t)
        # A token that completes a stop string ends its row (done); `finish` prints what precedes it.
        if live is not None and step.emitted[0] is not None and not step.done[0]:
            out.write(live.push(step.emitted[0]))
    texts = [stop_strings.cut(tokenizer.decode(o)) for o in outputs]
    # The first sample streamed live (the batch decodes in lockstep, so interleaving them would be
    # unreadable); the others are printed whole once the batch is done.
    out.write(live.finish(texts[0]) if live is not None else texts[0])
    for text in texts[1:]:
        out.write(SEPARATOR + prompt + text)
    out.write("\n")
    err.write(stats.summary() + "\n")
    return texts, stats


def run_interactive(
    cfg: GenerateConfig, model: torch.nn.Module, tokenizer: Any, read_line: Callable[[], str | None],
    out: TextIO, err: TextIO,
) -> Session:  # fmt: skip
    """A REPL: each line's text is appended to the conversation and the model continues it.

    `read_line` returns the next line, or None at end of input (Ctrl-D); an empty line also ends it.
    """
    out, err = ClosableOutput(out), ClosableOutput(err)
    stop_ids, stop_strings = _stops(cfg, tokenizer)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(cfg.seed)

    def rebuilt(width: int) -> None:
        err.write(f"[context window full: cache rebuilt from the last {width} tokens]\n")

    session = Session(
        model, cfg.sampling(tokenizer.vocab_size), generator, stop_ids=stop_ids, stop_fn=stop_strings or None,
        keep=default_keep(model.config.block_size, cfg.window_keep_ratio), on_rebuild=rebuilt,
    )  # fmt: skip
    err.write("interactive: each line is appended to the session and continued; empty line or Ctrl-D quits\n")
    while (line := read_line()) is not None and line != "":
        try:
            ids = encode_prompt(tokenizer, line)
        except UserError as e:  # a typo should not end the session
            err.write(f"error: {e}\n")
            continue
        stream = TextStream(tokenizer.decode, stop_strings.holdback())
        reply = []
        for token in session.turn(ids, cfg.max_new_tokens):
            reply.append(token)
            if not (stop_strings and stop_strings(0, reply)):  # a completed stop string is never printed
                out.write(stream.push(token))
        out.write(stream.finish(stop_strings.cut(tokenizer.decode(reply))) + "\n")
        err.write(f"[prefilled {session.last_prefill} tokens, generated {len(reply)}; "
                  f"context {session.width}/{session.block_size} tokens]\n")
    return session

"""The body of `scripts/generate.py`: load a checkpoint, sample, stream, summarise; or run a REPL.

Kept out of the script so tests can call it with a config object and in-memory streams.
Output: samples on `out` (the prompt, then the continuation), one summary line on `err`. Either may be a pipe
whose reader stops early (`| head`): the rest of its output is then dropped quietly (output.py), and the
samples are still generated to the end and returned whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import torch

from minigpt.checkpoint.format import TOKENIZER_HASHES
from minigpt.errors import UserError
from minigpt.fast.step import DecodeStep
from minigpt.generation.config import GenerateConfig
from minigpt.generation.decoder import load_decoder
from minigpt.generation.output import ClosableOutput
from minigpt.generation.session import Session
from minigpt.generation.speculative import speculative_stream_tokens
from minigpt.generation.text import TextStream, encode_prompt, read_prompt, unescape
from minigpt.sampling.decode import stream_tokens
from minigpt.sampling.naive import naive_stream_tokens
from minigpt.sampling.params import SamplingParams
from minigpt.sampling.sequences import (
    GenerationStats,
    Sampled,
    StopFn,
    StopStrings,
    default_keep,
    window_length,
)

SEPARATOR = "\n" + "-" * 40 + "\n"


@dataclass
class Loaded:
    """What the generate command decodes with: the model's decode step (its `model` the model), its tokenizer
    and meta, and the draft's decode step (with draft=)."""

    step: DecodeStep
    tokenizer: Any
    meta: dict
    draft: DecodeStep | None = None
    compile_s: float = 0.0  # choosing kernels for and compiling the decode steps (compile=true), on load
    chose: str = ""  # why compile=auto compiled the model's step or not ('' for compile=true or false)


def load_for_generation(cfg: GenerateConfig) -> Loaded:
    """`cfg.checkpoint` (or the newest run under outputs/) ready to decode as `cfg` asks, and `cfg.draft`."""
    load = lambda path: load_decoder(path, cfg.device.type, cfg.weights_dtype, compile=cfg.compile,
                                     batch_size=cfg.num_samples, steps=cfg.max_new_tokens,
                                     cache_dir=cfg.cache_dir)
    start = time.perf_counter()
    step, tokenizer, meta, chose = load(cfg.checkpoint)
    draft = None
    if cfg.draft is not None:
        draft, _, draft_meta, _ = load(cfg.draft)
        if draft_meta.get(TOKENIZER_HASHES) != meta.get(TOKENIZER_HASHES):
            raise UserError(f"draft={cfg.draft!r} was trained with another tokenizer than the checkpoint; "
                            "speculative decoding needs one tokenizer (its drafts are token ids)")
    # a compiled step's kernels are chosen by compiling and timing candidates: part of compiling it
    compiled = step.compiled or (draft is not None and draft.compiled)
    choosing = time.perf_counter() - start if compiled else 0.0
    return Loaded(step, tokenizer, meta, draft, choosing + compile_now(cfg, step, draft), chose)


def compile_now(cfg: GenerateConfig, step: DecodeStep, draft: DecodeStep | None) -> float:
    """With a compiled step, compile the decode steps now, by a throwaway greedy generation of a few tokens
    down the path the prompt will take (speculative or not, `cfg.num_samples` rows), so that the summary's
    speed is decoding's, not compilation's; returns the seconds it took (0 for eager steps)."""
    if not (step.compiled or (draft is not None and draft.compiled)):
        return 0.0
    start = time.perf_counter()
    prompt, greedy = [0, 0], SamplingParams(0.0)  # any ids: the graphs depend on shapes, not values
    generator = torch.Generator(device=step.device)
    # two forwards at two cache lengths: the second compiles the graph that serves every length
    if draft is not None:  # two verification rounds
        k = cfg.num_draft_tokens
        stream = speculative_stream_tokens(step.model, draft.model, prompt, params=greedy,
                                           generator=generator, max_new_tokens=2 * (k + 1) + 1,
                                           num_draft_tokens=k, step=step, draft_step=draft)
    else:  # two decode steps
        stream = stream_tokens(step.model, [prompt] * cfg.num_samples, max_new_tokens=3, params=greedy,
                               generator=generator, step=step)
    for _ in stream:
        pass
    return time.perf_counter() - start


def _stops(cfg: GenerateConfig, tokenizer: Any) -> tuple[list[int], StopStrings]:
    eot = getattr(tokenizer, "eot_id", None)
    return ([] if eot is None else [eot]), StopStrings([unescape(s) for s in cfg.stop], tokenizer.decode)


def _stream(cfg: GenerateConfig, loaded: Loaded, ids: list[int], stop_ids: list[int], stop_fn: StopFn | None,
           keep: int, generator: torch.Generator, stats: GenerationStats) -> Iterator[Sampled]:
    """The decoding loop `cfg` asks for: speculative (draft=), KV-cached, or the naive reference; `keep`
    tokens survive a window rebuild."""
    step = loaded.step
    model = step.model
    kwargs = dict(max_new_tokens=cfg.max_new_tokens, params=cfg.sampling(loaded.tokenizer.vocab_size),
                  generator=generator, stop_ids=stop_ids, stop_fn=stop_fn, keep=keep, stats=stats)
    if loaded.draft is not None:
        draft = loaded.draft
        return speculative_stream_tokens(model, draft.model, ids, num_draft_tokens=cfg.num_draft_tokens,
                                         step=step, draft_step=draft, **kwargs)
    if cfg.kv_cache:
        return stream_tokens(model, [ids] * cfg.num_samples, step=step, **kwargs)
    return naive_stream_tokens(model, [ids] * cfg.num_samples, **kwargs)


def run_samples(
    cfg: GenerateConfig, loaded: Loaded, out: TextIO, err: TextIO
) -> tuple[list[str], GenerationStats]:
    """Generate `cfg.num_samples` continuations of the prompt as one batch; return their texts and stats."""
    out, err = ClosableOutput(out), ClosableOutput(err)
    tokenizer = loaded.tokenizer
    prompt = read_prompt(cfg.prompt, cfg.prompt_file)
    ids = encode_prompt(tokenizer, prompt)
    stop_ids, stop_strings = _stops(cfg, tokenizer)
    generator = torch.Generator(device=loaded.step.device).manual_seed(cfg.seed)
    stats = GenerationStats(compile_s=loaded.compile_s)
    block_size = loaded.step.model.config.block_size
    keep = default_keep(block_size, cfg.window_keep_ratio)
    seen = window_length(len(ids), block_size, keep)
    if seen < len(ids):  # the window rule (sampling/sequences.py) cuts it: say so rather than hide it
        err.write(f"note: the prompt has {len(ids)} tokens, more than the model's context of "
                  f"{block_size}; it continues from the last {seen} of them\n")
    stream = _stream(cfg, loaded, ids, stop_ids, stop_strings or None, keep, generator, stats)
    outputs: list[list[int]] = [[] for _ in range(cfg.num_samples)]
    live = TextStream(tokenizer.decode, stop_strings.holdback()) if cfg.stream else None
    out.write(prompt)
    for sampled in stream:
        for b, t in enumerate(sampled.emitted):
            if t is not None:
                outputs[b].append(t)
        # A token that completes a stop string ends its row (done); `finish` prints what precedes it.
        if live is not None and sampled.emitted[0] is not None and not sampled.done[0]:
            out.write(live.push(sampled.emitted[0]))
    texts = [stop_strings.cut(tokenizer.decode(o)) for o in outputs]
    # The first sample streamed live (the batch decodes in lockstep, so interleaving them would be
    # unreadable); the others are printed whole once the batch is done.
    out.write(live.finish(texts[0]) if live is not None else texts[0])
    for text in texts[1:]:
        out.write(SEPARATOR + prompt + text)
    out.write("\n")
    chose = f" | {loaded.chose}" if loaded.chose else ""
    err.write(f"{stats.summary()} | threads: {torch.get_num_threads()}{chose}\n")
    return texts, stats


def run_interactive(
    cfg: GenerateConfig, loaded: Loaded, read_line: Callable[[], str | None], out: TextIO, err: TextIO,
) -> Session:  # fmt: skip
    """A REPL: each line's text is appended to the conversation and the model continues it.

    `read_line` returns the next line, or None at end of input (Ctrl-D); an empty line also ends it.
    """
    model, tokenizer = loaded.step.model, loaded.tokenizer
    out, err = ClosableOutput(out), ClosableOutput(err)
    stop_ids, stop_strings = _stops(cfg, tokenizer)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(cfg.seed)

    def rebuilt(width: int) -> None:
        err.write(f"[context window full: cache rebuilt from the last {width} tokens]\n")

    session = Session(
        model, cfg.sampling(tokenizer.vocab_size), generator, stop_ids=stop_ids, stop_fn=stop_strings or None,
        keep=default_keep(model.config.block_size, cfg.window_keep_ratio), on_rebuild=rebuilt,
        step=loaded.step,
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

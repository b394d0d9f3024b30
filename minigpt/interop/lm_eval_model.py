"""The `minigpt` model of lm-evaluation-harness: `lm_eval --model minigpt --model_args checkpoint=<run>`.

lm-eval asks a model three things (its `LM` interface), all answered here from a minigpt checkpoint:

    loglikelihood(context, continuation)  log p(continuation | context), and whether greedy decoding yields it
    loglikelihood_rolling(text)           log p(text) of a whole document, in windows of the model's context
    generate_until(context, until)        a continuation, stopped at any `until` string or at <|endoftext|>

`TemplateLM` turns text requests into token requests the way it does for Hugging Face models: a context is
encoded as it is (no token in front), an empty one becomes <|endoftext|> (the token every training document
follows), and rolling windows start from it too; where a context ends in a newline it keeps it
(`_encode_pair`). Token requests are scored in batches of similar-length rows (right padding cannot change a
causal model's earlier positions) of at most block_size ids: a context that does not fit is scored from its
tail, a continuation longer than the context in lm-eval's rolling windows, each kind noted once per run.
Generation runs minigpt's KV-cached decoder (sampling/decode.py), a batch of prompts at a time.

`lm_eval --model minigpt` is a command of its own: a bad `--model_args` (a checkpoint that is not there, a
`weights_dtype` this machine cannot run) ends it in one `error:` line and exit code 2, like minigpt's scripts.

Importing this module registers the name `minigpt` with lm-eval. lm-eval has no plugin mechanism that would
import it for its own CLI, so the shipped task (harness_task.py) does: its YAML imports this package while
`lm_eval` reads the task file, before it looks the model up. Run lm-eval's other tasks through
`scripts/evaluate.py harness_tasks=[...]`, which imports it itself.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string

from minigpt.checkpoint.load import load_model
from minigpt.device.config import check_weights_dtype
from minigpt.errors import UserError, exit_with_error
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams
from minigpt.sampling.sequences import StopStrings

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 16
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's own default for generate_until
# (the text pair, or None for a rolling window; context ids; continuation ids)
TokenRequest = tuple[tuple[str, str] | None, list[int], list[int]]


@register_model("minigpt")
class MinigptLM(TemplateLM):
    """A minigpt checkpoint behind lm-eval's `LM` interface. model_args: checkpoint (a checkpoint or run
    folder; none: the newest run), device (auto | cpu | cuda | mps), weights_dtype (float32 | bfloat16 | ...),
    batch_size (rows per forward pass; lm-eval's --batch_size, and --max_batch_size caps `auto`), seed (for
    sampled generation)."""

    def __init__(self, checkpoint: str | None = None, device: str = "auto", weights_dtype: str = "float32",
                 batch_size: int | str | None = None, seed: int = 1234,
                 max_batch_size: int | None = None) -> None:
        super().__init__()
        check_weights_dtype(weights_dtype)
        self.batch_size = _batch_size(batch_size, max_batch_size)
        self.seed = _whole_number("seed", seed)
        self.model, self.tokenizer, _ = load_model(checkpoint, device or "auto", weights_dtype)
        self._device = next(self.model.parameters()).device

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> MinigptLM:
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> MinigptLM:
        """--model_args win over lm-eval's own options (--batch_size, --device). Its --device defaults to
        cuda:0 even where there is no GPU; like its Hugging Face model, that then means "pick one" (auto)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        device = str(extra.pop("device", "auto")).split(":")[0]  # cuda:0 -> cuda
        if device == "cuda" and not torch.cuda.is_available():
            device = "auto"
        known = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
        unknown = sorted(set(arg_dict) - set(known))
        try:
            if unknown:
                raise UserError(f"no key {unknown[0]} (the keys: {', '.join(known)})")
            return cls(**{**extra, "device": device, **arg_dict})
        except UserError as e:  # lm-eval's command line would print the traceback
            exit_with_error(f"--model_args: {e}")

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eot_id

    @property
    def max_length(self) -> int:
        return self.model.config.block_size

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string)  # minigpt adds no special tokens to a text

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The context's ids and the continuation's, as the whole text is tokenised.

        lm-eval moves all trailing whitespace of the context into the continuation, and cuts the ids of the
        whole text after as many ids as the context alone has. In minigpt's split patterns a space starts
        the next piece (" return"), so trailing spaces do move; but a newline ends the piece before it
        ("):\n" is one piece), so it stays with the context, where the whole text's ids have it too. Where
        the whole text's ids still do not begin with the context's, the two are encoded apart.
        """
        spaces = len(context) - len(context.rstrip(" \t"))
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, context_ids = self.tok_encode(context + continuation), self.tok_encode(context)
        if whole[: len(context_ids)] == context_ids:
            return context_ids, whole[len(context_ids):]
        return context_ids, self.tok_encode(continuation)

    # -------------------------------------------------------------------------------------------- scoring

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests: list[TokenRequest], disable_tqdm: bool = False,
                              **kwargs) -> list[tuple[float, bool]]:
        """Each request's summed log-probability of its continuation ids and whether every one of them is the
        argmax, scored in the rows `_rows` cuts it into (their sums added up)."""
        rows = [(i, inp, cont) for i, (_, context, continuation) in enumerate(requests)
                for inp, cont in self._rows(context, continuation)]
        totals, greedy = [0.0] * len(requests), [True] * len(requests)
        for batch in _batches(rows, self.batch_size, key=lambda row: len(row[1])):
            inputs = [inp for _, (_, inp, _) in batch]
            width = max(len(inp) for inp in inputs)
            idx = torch.tensor([inp + [0] * (width - len(inp)) for inp in inputs], device=self._device)
            logits, _ = self.model(idx)  # (B, T, V); the right padding is never looked at
            logprobs = F.log_softmax(logits.float(), dim=-1)
            for row, (_, (i, inp, cont)) in enumerate(batch):
                scored = logprobs[row, len(inp) - len(cont):len(inp)]  # (n, V): the positions predicting cont
                target = torch.tensor(cont, device=self._device)
                totals[i] += scored.gather(1, target[:, None]).sum().item()
                greedy[i] &= bool((scored.argmax(dim=-1) == target).all())
        self._note_what_did_not_fit([r for r in requests if r[0] is not None])
        results = list(zip(totals, greedy, strict=True))
        for (pair, _, _), result in zip(requests, results, strict=True):
            if pair is not None:
                self.cache_hook.add_partial("loglikelihood", pair, result)
        return results

    def _rows(self, context: list[int], continuation: list[int]) -> list[tuple[list[int], list[int]]]:
        """(input ids, the continuation ids its last positions predict) rows that score `continuation` after
        `context`, each input at most block_size ids. A continuation that fits is one row: the last block_size
        ids of context + continuation (minus the final one), the context cut to its tail where it must be. A
        longer one is split as rolling log-likelihood splits a document: its first block_size ids after the
        context's last id, then windows of block_size ids, each predicting ids no earlier one did."""
        L = self.max_length
        pairs = [(context, continuation)]
        if len(continuation) > L:
            windows = get_rolling_token_windows(token_list=continuation, prefix_token=context[-1],
                                                max_seq_len=L, context_len=1)
            pairs = [make_disjoint_window(w) for w in windows]
        return [((ctx + cont)[-(L + 1):-1], cont) for ctx, cont in pairs if cont]

    def _note_what_did_not_fit(self, requests: list[TokenRequest]) -> None:
        """One line each, once per run, for the requests the model's context could not hold whole."""
        L, n = self.max_length, len(requests)
        cut = sum(len(ctx) + len(cont) > L + 1 for _, ctx, cont in requests)
        long = sum(len(cont) > L for _, _, cont in requests)
        if cut:
            log.warning("note: %d of %d requests have more context than the model's %d tokens; each was "
                        "scored from the last tokens that fit", cut, n, L)
        if long:
            log.warning("note: %d of %d continuations are longer than the model's %d tokens; each was scored "
                        "in windows of %d tokens, as a rolling log-likelihood is", long, n, L, L)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Every token of each text scored once, with as much context as fits: the text as one continuation
        of <|endoftext|>, in lm-eval's rolling windows (`_rows`)."""
        texts = [request.args[0] for request in requests]
        scores = self._loglikelihood_tokens([(None, [self.prefix_token_id], self.tok_encode(text))
                                             for text in texts])
        for text, (total, _) in zip(texts, scores, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return [total for total, _ in scores]

    # -------------------------------------------------------------------------------------------- generation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or, with do_sample, sampled) continuations, cut before the first `until` string."""
        out: list[str | None] = [None] * len(requests)
        pending = [(i, r.args[0], dict(r.args[1] or {})) for i, r in enumerate(requests)]
        for kwargs in {repr(sorted(k.items())): k for _, _, k in pending}.values():
            group = [(i, ctx) for i, ctx, k in pending if k == kwargs]
            for batch in _batches(group, self.batch_size, key=lambda r: len(r[1])):
                texts = self._generate([ctx for _, (_, ctx) in batch], kwargs)
                for (_, (i, ctx)), text in zip(batch, texts, strict=True):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", (ctx, requests[i].args[1]), text)
        return out

    def _generate(self, contexts: list[str], kwargs: dict) -> list[str]:
        until = kwargs.get("until") or []
        stops = StopStrings([until] if isinstance(until, str) else list(until), self.tokenizer.decode)
        sampled = bool(kwargs.get("do_sample", False)) and float(kwargs.get("temperature", 1.0)) > 0
        params = SamplingParams(temperature=float(kwargs.get("temperature", 1.0)) if sampled else 0.0,
                                vocab_size=self.tokenizer.vocab_size)
        prompts = [self.tok_encode(c) or [self.eot_token_id] for c in contexts]
        result = generate(
            self.model, prompts, max_new_tokens=int(kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)),
            params=params, generator=torch.Generator(device=self._device).manual_seed(self.seed),
            stop_ids=[self.eot_token_id], stop_fn=stops if stops else None,
        )  # fmt: skip
        return [stops.cut(self.tok_decode(ids)) for ids in result.tokens]


def _batch_size(value: int | str | None, cap: int | None) -> int:
    """lm-eval's --batch_size: a number, or `auto`, here DEFAULT_BATCH_SIZE rows (no search for the largest
    that fits: these models are small) or fewer if lm-eval's --max_batch_size says so."""
    if value is None or str(value).startswith("auto"):
        return min(DEFAULT_BATCH_SIZE, _whole_number("max_batch_size", cap) if cap else DEFAULT_BATCH_SIZE)
    return max(1, _whole_number("batch_size", value))


def _whole_number(key: str, value: int | str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{key}={value!r} is not a whole number") from None


def _batches(items: list, size: int, key) -> Iterator[list[tuple[int, object]]]:
    """(original index, item) lists of at most `size`, longest first: a batch's rows have similar lengths."""
    order = sorted(enumerate(items), key=lambda pair: -key(pair[1]))
    for start in range(0, len(order), size):
        yield order[start:start + size]

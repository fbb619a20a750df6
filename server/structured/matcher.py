"""One model's constraints compiled into llguidance matchers, and each row's matcher in the sampler.

A model's `Grammars` holds its tokenizer as llguidance reads it (built once, at the first constrained request) and
an LRU of compiled constraints: a request whose constraint was compiled before gets a copy of that matcher
(`deep_copy`, cheap) instead of a compilation. A constraint the library cannot compile is a ValueError naming the
request's field, raised at admission, before the prompt is tokenized.

Each constrained sequence gets a copy of its constraint's matcher as a `RowMatcher` (masks.py: the sampler's
TokenConstraint, whose masks are made for all of a step's constrained rows together by the model's `StepMasks`).
"""
from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any

from .masks import RowMatcher, StepMasks
from .spec import Constraint

log = logging.getLogger(__name__)
CACHE_SIZE = 64     # compiled constraints kept per model
# JSON as models write it (json.dumps' separators) and nothing else: with flexible whitespace a model could pad an
# answer with blanks until its token budget runs out, and the answer would never close.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar of a constraint (not yet checked: LLMatcher checks it); ValueError naming the field
    on a schema the library refuses to read."""
    import llguidance as llg

    if constraint.kind == "json_schema":
        try:
            return llg.LLMatcher.grammar_from_json_schema(constraint.text, defaults=JSON_OPTIONS)
        except ValueError as exc:
            raise ValueError(f"{constraint.field}: {exc}") from None
    if constraint.kind == "regex":
        return llg.LLMatcher.grammar_from_regex(constraint.text)
    if constraint.kind == "choice":
        options = json.loads(constraint.text)
        return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o, ensure_ascii=False)
                                                                      for o in options))
    from llguidance.gbnf_to_lark import any_to_lark

    try:    # Lark as it is; GBNF (llama.cpp's, `root ::= ...`) converted to Lark by the library
        lark = any_to_lark(constraint.text)
    except Exception as exc:    # the converter's own error types (GbnfToLarkError, parse errors)
        raise ValueError(f"{constraint.field}: not a Lark grammar, and not GBNF either: {exc}") from None
    return llg.LLMatcher.grammar_from_lark(lark)


class Grammars:
    """The compiled constraints of one model (its tokenizer, its logits' width, its end-of-text id)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_id: int | None, cache_size: int = CACHE_SIZE) -> None:
        """tokenizer: the model's `tokenizers.Tokenizer` (serialized for llguidance at the first constraint)."""
        self._hf_tokenizer, self.vocab_size, self.eos_id = tokenizer, vocab_size, eos_id
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._cache_size = cache_size
        self._tokenizer: Any = None
        self.masks = StepMasks(vocab_size, eos_id)     # its rows' masks, a step at a time
        self._lock = threading.Lock()   # compiled in worker threads; the cache and the tokenizer are shared

    def _ll_tokenizer(self, field: str) -> Any:
        import llguidance as llg

        with self._lock:
            if self._tokenizer is None:
                try:
                    self._tokenizer = llg.LLTokenizer(self._hf_tokenizer.to_str(), n_vocab=self.vocab_size,
                                                      eos_token=self.eos_id)
                except Exception as exc:    # the library's own error types: a tokenizer it cannot read
                    raise ValueError(f"{field}: structured outputs are not served for this model: llguidance "
                                     f"cannot read its tokenizer ({exc})") from None
            return self._tokenizer

    def cached(self, constraint: Constraint) -> bool:
        with self._lock:
            return constraint.key in self._cache

    def compile(self, constraint: Constraint) -> Any:
        """The never-advanced matcher of `constraint` (from the cache, or compiled and cached); ValueError naming
        its field when the library cannot compile it or the model cannot end a constrained answer."""
        if self.eos_id is None:
            raise ValueError(f"{constraint.field}: this model has no end-of-text token, so a constrained answer "
                             "could never end")
        with self._lock:
            found = self._cache.get(constraint.key)
            if found is not None:
                self._cache.move_to_end(constraint.key)
                return found
        import llguidance as llg

        matcher = llg.LLMatcher(self._ll_tokenizer(constraint.field), grammar_text(constraint), log_level=0)
        if matcher.is_error():
            raise ValueError(f"{constraint.field}: cannot be compiled: {matcher.get_error()}")
        with self._lock:
            self._cache[constraint.key] = matcher
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return matcher

    def row(self, constraint: Constraint) -> "RowMatcher":
        """A fresh matcher of `constraint` for one sequence."""
        return RowMatcher(self.compile(constraint).deep_copy(), self.masks)


async def constraint_rows(grammars: Grammars, constraints: list[Constraint | None], decoder: bool = True
                          ) -> list[RowMatcher | None]:
    """Each sequence's matcher (None where unconstrained): constraints not yet compiled are compiled in a worker
    thread (llguidance releases the GIL; a large schema takes a while), each once. ValueError naming the field of
    the first that cannot be, or of any on a model that is not a decoder (an encoder-decoder forces tokens no
    grammar expects)."""
    import asyncio

    given = [c for c in constraints if c is not None]
    if not given:
        return [None] * len(constraints)
    if not decoder:
        raise ValueError(f"{given[0].field}: structured outputs are served for decoder models only")
    loop = asyncio.get_running_loop()
    for constraint in {c.key: c for c in given}.values():
        if not grammars.cached(constraint):
            await loop.run_in_executor(None, grammars.compile, constraint)
    return [None if c is None else grammars.row(c) for c in constraints]

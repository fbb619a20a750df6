"""Streaming detokenization and stop-sequence matching.

Byte-level BPE tokens can end in the middle of a UTF-8 character; decoding such a prefix gives
U+FFFD. The detokenizer decodes a short window of ids and only releases text once it no longer ends
in U+FFFD, so a streamed chunk never splits a character. It works for any `tokenizers` decoder
because it diffs decoded windows instead of decoding tokens one by one (spacing can depend on the
neighbouring token).
"""
from __future__ import annotations

from typing import Sequence

from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"
# Prompt ids kept as left context: enough for any decoder that looks at the previous token.
_PROMPT_CONTEXT = 4


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-_PROMPT_CONTEXT:])
        # Text of ids[prefix:read] was already released; ids[read:] are pending.
        self._prefix = 0
        self._read = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""

    def push(self, token_id: int) -> str:
        """Add one generated id; return the newly completed text (possibly "")."""
        self._ids.append(token_id)
        return self._release(final=False)

    def push_many(self, token_ids: Sequence[int]) -> str | None:
        """Add several generated ids at once; the text they complete, as `push` one by one would release it in all —
        or None, adding nothing, when their text ends inside a character (then `push` them one by one: each
        releases what it completes, and the text held back belongs to the last)."""
        self._ids.extend(token_ids)
        done = self._decode(self._ids[self._prefix:self._read])
        full = self._decode(self._ids[self._prefix:])
        if full.endswith(_REPLACEMENT):
            del self._ids[len(self._ids) - len(token_ids):]
            return None
        return self._release_decoded(done, full)

    def flush(self) -> str:
        """Release whatever is pending, even an incomplete character (end of generation)."""
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        done = self._decode(self._ids[self._prefix:self._read])
        full = self._decode(self._ids[self._prefix:])
        if not final and full.endswith(_REPLACEMENT):
            return ""
        return self._release_decoded(done, full)

    def _release_decoded(self, done: str, full: str) -> str:
        if len(full) <= len(done):
            return ""
        # Move the window: the next diff starts from the ids just released.
        self._prefix, self._read = self._read, len(self._ids)
        if self._prefix > 0 and len(self._ids) > 4 * _PROMPT_CONTEXT:
            # Keep the id list short; offsets shift by the same amount.
            cut = self._prefix
            self._ids = self._ids[cut:]
            self._prefix, self._read = 0, self._read - cut
        return full[len(done):]


class StopMatcher:
    """Cuts generated text at the first stop sequence; holds back text that may start one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._pending = ""   # text not yet released (a possible stop-sequence prefix)
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add text; return what is safe to release. Sets `stopped` when a stop sequence appears."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        self._pending += text
        cut = self._first_stop()
        if cut >= 0:
            self.stopped = True
            out, self._pending = self._pending[:cut], ""
            return out
        hold = self._longest_stop_prefix_suffix()
        out = self._pending[: len(self._pending) - hold]
        self._pending = self._pending[len(self._pending) - hold:]
        return out

    def flush(self) -> str:
        """Release held-back text (generation ended without completing a stop sequence)."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def _first_stop(self) -> int:
        """Start of the stop sequence that completes first in the pending text (-1: none).

        Generation order decides: the stop whose last character comes earliest wins (a stop that would only
        complete later cannot, since generation ends at the first); of stops completing at the same
        character, the longest. So the answer does not depend on how the text was split into pieces."""
        best_end, best_start = None, -1
        for stop in self._stops:
            i = self._pending.find(stop)
            if i < 0:
                continue
            end = i + len(stop)
            if best_end is None or end < best_end or (end == best_end and i < best_start):
                best_end, best_start = end, i
        return best_start

    def _longest_stop_prefix_suffix(self) -> int:
        # Longest suffix of the pending text that is a proper prefix of some stop sequence.
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:n]):
                    best = n
                    break
        return best

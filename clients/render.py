"""Human-readable rendering of results for the CLI (the --json form is types.to_jsonable)."""
from __future__ import annotations

import math
from collections.abc import Sequence

from .types import (Classification, Embedding, FillMaskResult, GeneratedToken, Generation, ModelStatus,
                    TokenEntity)


def _quote(text: str, width: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def classifications(texts: Sequence[str], results: Sequence[Classification]) -> str:
    lines: list[str] = []
    for text, result in zip(texts, results):
        lines.append(f"{result.label}  {result.score:.4f}  {_quote(text)}")
        width = max((len(s.label) for s in result.scores), default=0)
        for s in result.scores:
            lines.append(f"    {s.label:<{width}}  {s.score:.4f}")
    return "\n".join(lines)


def fill_masks(texts: Sequence[str], results: Sequence[FillMaskResult]) -> str:
    lines: list[str] = []
    for text, result in zip(texts, results):
        lines.append(_quote(text))
        for mask in result.masks:
            best = "  ".join(f"{c.token!r} {c.score:.3f}" for c in mask.candidates)
            lines.append(f"    mask at token {mask.position}: {best}")
            if mask.candidates:
                lines.append(f"    -> {mask.candidates[0].sequence}")
    return "\n".join(lines)


def token_entities(texts: Sequence[str], results: Sequence[Sequence[TokenEntity]]) -> str:
    lines: list[str] = []
    for text, entities in zip(texts, results):
        lines.append(_quote(text))
        width = max((len(e.label) for e in entities), default=0)
        for e in entities:
            lines.append(f"    {e.label:<{width}}  {e.score:.3f}  {e.start:>4}-{e.end:<4} {e.word!r}")
        if not entities:
            lines.append("    (no entities)")
    return "\n".join(lines)


def embeddings(texts: Sequence[str], vectors: Sequence[Embedding]) -> str:
    lines: list[str] = []
    for text, e in zip(texts, vectors):
        head = " ".join(f"{v:+.4f}" for v in e.values[:6])
        norm = sum(v * v for v in e.values) ** 0.5
        lines.append(f"{_quote(text)}\n    dim {len(e.values)}  norm {norm:.4f}  {e.tokens} tokens  [{head} …]")
    return "\n".join(lines)


def generation_footer(result: Generation) -> str:
    return (f"[{result.finish_reason or 'done'}; {result.usage.prompt_tokens} prompt + "
            f"{result.usage.completion_tokens} generated tokens; {result.total_time_ms:.0f} ms, "
            f"first token {result.time_to_first_token_ms:.0f} ms]")


def prompt_score(prompt_tokens: Sequence[GeneratedToken]) -> str:
    """The scored prompt in one line: its log-likelihood (the first token has no context) and perplexity."""
    scored = [t.logprob for t in prompt_tokens[1:] if t.logprob is not None]
    total = sum(scored)
    perplexity = math.exp(-total / len(scored)) if scored else float("nan")
    return (f"[prompt: {len(prompt_tokens)} tokens; log-likelihood {total:.4f} over the last {len(scored)}, "
            f"perplexity {perplexity:.3f}]")


def models(statuses: Sequence[ModelStatus]) -> str:
    if not statuses:
        return "no models"
    rows = [("NAME", "VERSION", "TASK", "STATE", "VARIANT", "REASON")]
    rows += [(m.name, str(m.version) if m.version else "-", m.task, m.state, m.variant or "-", m.reason) for m in statuses]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

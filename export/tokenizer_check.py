"""Put the checkpoint's tokenizer into the package (padding/truncation removed) and prove it is the same."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from .errors import ExportError
from .source import optional_json

log = logging.getLogger(__name__)

# Strings that tend to break tokenizers or expose normalisation differences.
HARD_STRINGS = (
    "",
    " ",
    "café naïve résumé Ångström façade",
    "Cafe\u0301 (combining accent) vs café",
    "日本語のテキストと中文字符，한국어도",
    "emoji 🙂👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "tab\tnewline\ncarriage\rreturn bell\x07 nul\x00 del\x7f esc\x1b",
    "zero\u200bwidth\u00a0nbsp \ufeffbom",
    "مرحبا بالعالم  שלום",
    "ALL CAPS and MiXeD cAsE, numbers 1234567890 and 3.14159",
    "punctuation!!! ??? ... --- ''' \"quoted\" (brackets) [square] {curly} <angle>",
    "https://example.com/path?query=1&x=y#frag user@example.org",
    "    leading and trailing spaces    ",
)


@dataclass
class TokenizerReport:
    passed: bool
    checked_strings: int
    removed_settings: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"passed": self.passed, "checked_strings": self.checked_strings,
                "removed_settings": self.removed_settings, "failures": self.failures}


def load_serving_tokenizer(path: Path) -> Tokenizer:
    """How serving must load a tokenizer.json: exactly as stored, no padding, no truncation."""
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.no_truncation()
    return tok


def package_tokenizer(checkpoint: Path, package: Path, max_length: int) -> list[str]:
    """Write tokenizer.json (padding/truncation removed) and tokenizer_config.json; return removed settings."""
    src = checkpoint / "tokenizer.json"
    try:
        raw = json.loads(src.read_text(encoding="utf-8"))
        tok = Tokenizer.from_file(str(src))
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise ExportError(f"checkpoint: {src} is not a valid tokenizer ({str(exc).splitlines()[0]})") from None
    removed = [k for k in ("padding", "truncation") if raw.get(k)]
    tok.no_padding()
    tok.no_truncation()
    tok.save(str(package / "tokenizer.json"))
    cfg = optional_json(checkpoint / "tokenizer_config.json")
    # HF writes a huge sentinel when unknown; the package states the real limit (positions of the model).
    mml = cfg.get("model_max_length")
    if not isinstance(mml, int) or mml > max_length:
        cfg["model_max_length"] = max_length
    (package / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n",
                                                   encoding="utf-8")
    if removed:
        log.info("packaged tokenizer: removed %s stored in %s", " and ".join(removed), src)
    return removed


def _same(a: Encoding, b: Encoding) -> str | None:
    for attr in ("ids", "type_ids", "attention_mask", "special_tokens_mask", "offsets"):
        if getattr(a, attr) != getattr(b, attr):
            return attr
    return None


def check_vocabulary(package: Path, vocab_size: int | None) -> None:
    """ExportError when the packaged tokenizer has an id the graph's embedding has no row for (tokens added to the
    tokenizer without resizing the model's embeddings): the server refuses such a package at load, and a request
    holding that token could not be answered at all."""
    if vocab_size is None:
        return
    vocab = Tokenizer.from_file(str(package / "tokenizer.json")).get_vocab(with_added_tokens=True)
    token, largest = max(vocab.items(), key=lambda item: item[1])
    if largest >= vocab_size:
        raise ExportError(f"tokenizer.json: token {token!r} has id {largest}, outside the model's vocabulary of "
                          f"{vocab_size} (config.json vocab_size): the embeddings were not resized for the tokenizer's "
                          "added tokens (transformers: model.resize_token_embeddings(len(tokenizer)))")


def check_tokenizer(checkpoint: Path, package: Path, texts: list[str], mask_token: str | None,
                    max_length: int, removed: list[str]) -> TokenizerReport:
    """The packaged tokenizer must reproduce the checkpoint's (its padding/truncation switched off)
    on held-out text and hard strings, and must itself carry no padding or truncation."""
    reference = load_serving_tokenizer(checkpoint / "tokenizer.json")
    packaged_raw = json.loads((package / "tokenizer.json").read_text(encoding="utf-8"))
    packaged = Tokenizer.from_file(str(package / "tokenizer.json"))  # as stored: leaks would show here
    failures: list[str] = []
    for key in ("padding", "truncation"):
        if packaged_raw.get(key) is not None:
            failures.append(f"tokenizer.json still sets {key}: {packaged_raw[key]}")

    long_text = " ".join(texts * (1 + 4 * max_length // max(1, sum(len(t.split()) for t in texts))))
    singles = [*texts, *HARD_STRINGS, long_text]
    if mask_token:
        singles += [f"the {mask_token} of the play", f"{mask_token}{mask_token} {mask_token}."]
    pairs = [(texts[i], texts[-1 - i]) for i in range(min(4, len(texts)))] + [("", "x"), ("日本", "🙂")]

    for text in singles:
        diff = _same(reference.encode(text), packaged.encode(text))
        if diff:
            failures.append(f"{diff} differ for {text[:40]!r}")
    for a, b in pairs:
        diff = _same(reference.encode(a, b), packaged.encode(a, b))
        if diff:
            failures.append(f"{diff} differ for pair {a[:20]!r}/{b[:20]!r}")
    for text in texts[:8]:
        enc = packaged.encode(text)
        if reference.decode(enc.ids) != packaged.decode(enc.ids):
            failures.append(f"decode differs for {text[:40]!r}")
    # Leak checks on the packaged file as stored: short input not padded, long input not truncated.
    short = packaged.encode("a")
    if len(short.ids) > 4 or 0 in short.attention_mask:
        failures.append(f"padding leaks: 'a' encodes to {len(short.ids)} tokens")
    n_long = len(packaged.encode(long_text).ids)
    if n_long <= max_length:
        failures.append(f"truncation leaks: a long text encodes to {n_long} <= {max_length} tokens")
    if mask_token and packaged.token_to_id(mask_token) is not None:
        ids = packaged.encode(f"a {mask_token} b").ids
        if packaged.token_to_id(mask_token) not in ids:
            failures.append(f"mask token {mask_token!r} is split instead of kept whole")
    checked = len(singles) + len(pairs)
    report = TokenizerReport(passed=not failures, checked_strings=checked, removed_settings=removed,
                             failures=failures)
    log.info("tokenizer check: %d strings, %s", checked, "passed" if report.passed else f"FAILED {failures[:3]}")
    return report

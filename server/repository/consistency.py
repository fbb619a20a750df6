"""Load-time checks that a package's parts belong together: tokenizer.json, model.json, tokenizer_config.json (when
the package has one) and the graph. They run in the loading worker thread before a version may serve; what does
not fit raises PackageError naming it, which becomes the version's NOT_SERVING reason (logged once) while the
version already serving goes on.

The parity gate vouches for what the exporter produced. These checks catch a package whose parts come from
different places (another model's tokenizer.json with re-computed hashes, a model.json claiming more context than
the graph has positions): such a package used to load and then fail every request inside the graph.

    check_tokenizer   the vocabulary is not empty, fits model.json vocab_size, holds the special tokens, and
                      turns a plain sentence into tokens
    probe_encoder     the graph computes the tokenizer's largest id, vocab_size - 1, and tokenizer-made
                      sequences of doubling length up to max_length (a claim far beyond the graph's positions
                      fails cheaply, at twice their number)
    check_prompts     a decoder's prompt path: a text of the context's length through the engine's tokenizer
(A decoder's graph is probed by the generation engine's own warm-up: the largest token id, the last position.)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
from tokenizers import Tokenizer

from server.repository.package import Package, PackageError
from server.repository.served_files import TOKENIZER_CONFIG_FILE

if TYPE_CHECKING:
    from server.text.tokenizer import TextEncoder

SAMPLE_TEXT = "The old ship left the harbour at dawn, and 42 sailors watched the shore grow small. "
# The decoder's prompt probe tokenizes at most this many tokens' worth of text: enough to cover any chunk the
# engine prefills, and bounded for a model.json whose max_length is huge (the cache allocation refuses those).
PROMPT_PROBE_TOKENS = 8192
_SPECIAL_NAMES = ("pad", "unk", "cls", "sep", "mask", "bos", "eos")


@dataclass(frozen=True)
class Vocabulary:
    """What the load-time checks learned of a tokenizer."""

    size: int            # ids it knows, added tokens included
    largest_id: int
    largest_token: str
    tokens_per_sample: int   # tokens of SAMPLE_TEXT without special tokens (>= 1)


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (onnxruntime's can span several): a reason is logged as one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def check_tokenizer(package: Package, tokenizer: Tokenizer) -> Vocabulary:
    """PackageError naming the first thing in which tokenizer.json and model.json (or tokenizer_config.json)
    disagree."""
    manifest = package.manifest
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    if not any(token not in special for token in vocab):
        raise PackageError(f"tokenizer.json: its vocabulary is empty (no token besides its {len(vocab)} special "
                           f"one{'' if len(vocab) == 1 else 's'})")
    largest_token, largest = max(vocab.items(), key=lambda item: item[1])
    if manifest.vocab_size is not None and largest >= manifest.vocab_size:
        raise PackageError(f"tokenizer.json: token {largest_token!r} has id {largest}, outside the graph's vocabulary "
                           f"of {manifest.vocab_size} (model.json vocab_size): another model's tokenizer?")
    for name, token_id in sorted(manifest.special_tokens.items()):
        if token_id is not None and tokenizer.id_to_token(token_id) is None:
            raise PackageError(f"model.json special_tokens.{name}: id {token_id} is not a token of tokenizer.json")
    if manifest.mask_token is not None:
        found = tokenizer.token_to_id(manifest.mask_token)
        if found is None:
            raise PackageError(f"model.json mask_token: {manifest.mask_token!r} is not a token of tokenizer.json")
        declared = manifest.special_token("mask")
        if declared is not None and declared != found:
            raise PackageError(f"model.json special_tokens.mask: id {declared}, but tokenizer.json has "
                               f"{manifest.mask_token!r} at id {found}")
    _check_against_config(package, tokenizer)
    sample = tokenizer.encode(SAMPLE_TEXT, add_special_tokens=False).ids
    if not sample:
        raise PackageError(f"tokenizer.json: the sentence {SAMPLE_TEXT.strip()!r} encodes to no tokens")
    return Vocabulary(size=len(vocab), largest_id=largest, largest_token=largest_token, tokens_per_sample=len(sample))


def _check_against_config(package: Package, tokenizer: Tokenizer) -> None:
    """tokenizer_config.json (the checkpoint's, packaged by the exporter) names the special tokens by text, model.json
    by id: the same token must be at that id in tokenizer.json. This catches another model's tokenizer.json of
    the same size. A package that has one has it listed (the loader refuses an unlisted one by name before this
    runs: server/repository/served_files.py), so this reads every package's: only the listed, hash-checked file."""
    if TOKENIZER_CONFIG_FILE not in package.parity.get("files", {}):
        return
    try:
        config = json.loads(package.file(TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageError(f"{TOKENIZER_CONFIG_FILE} unreadable: {one_line(exc)}") from None
    if not isinstance(config, dict):
        raise PackageError(f"{TOKENIZER_CONFIG_FILE} is not a JSON object")
    for name in _SPECIAL_NAMES:
        text = config.get(f"{name}_token")
        if isinstance(text, dict):       # HF's AddedToken serialisation
            text = text.get("content")
        token_id = package.manifest.special_token(name)
        if not isinstance(text, str) or not text or token_id is None:
            continue
        found = tokenizer.token_to_id(text)
        if found != token_id:
            at = tokenizer.id_to_token(token_id)
            where = "does not hold it" if found is None else f"has it at id {found}"
            raise PackageError(f"model.json special_tokens.{name}: id {token_id} is {at!r} in tokenizer.json, but "
                               f"{TOKENIZER_CONFIG_FILE} names {name}_token {text!r} and tokenizer.json {where}: "
                               "another model's tokenizer?")


def probe_lengths(max_length: int, first: int = 32) -> list[int]:
    """Doubling lengths from `first` below max_length, then max_length itself."""
    lengths = []
    n = first
    while n < max_length:
        lengths.append(n)
        n *= 2
    return lengths + [max_length]


def sample_text(tokens: int, vocabulary: Vocabulary) -> str:
    """A plain text of at least `tokens` tokens (special tokens aside)."""
    return SAMPLE_TEXT * (tokens // vocabulary.tokens_per_sample + 2)


Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def probe_encoder(run: Run, package: Package, encoder: "TextEncoder", vocabulary: Vocabulary,
                  feeds_of: Callable[[list[list[int]], list[list[int]]], dict[str, np.ndarray]]) -> None:
    """Runs the encoder graph on what requests will bring: the largest ids (tokenizer's and vocab_size's) and
    tokenizer-made sequences up to max_length. `feeds_of(ids_rows, type_rows)` builds the graph inputs."""
    manifest = package.manifest
    ids = {vocabulary.largest_id: f"tokenizer.json: token {vocabulary.largest_token!r} (id {vocabulary.largest_id})"}
    if manifest.vocab_size is not None:
        ids.setdefault(manifest.vocab_size - 1, f"model.json vocab_size {manifest.vocab_size}: token id "
                                                f"{manifest.vocab_size - 1}")
    width = min(4, manifest.max_length)
    for token_id, what in sorted(ids.items()):
        _run_probe(run, feeds_of([[token_id] * width], [[0] * width]),
                   f"{what} fails in the graph (its embedding has fewer rows?)")
    for length in probe_lengths(manifest.max_length):
        row = encoder.encode([(sample_text(length, vocabulary), None)], truncate=True, field="warm-up")[0]
        if len(row.ids) < length:   # a tokenizer that truncates on its own: model.json and tokenizer.json disagree
            raise PackageError(f"model.json max_length {manifest.max_length}: tokenizer.json makes at most "
                               f"{len(row.ids)} tokens of a longer text")
        _run_probe(run, feeds_of([row.ids[:length]], [row.type_ids[:length]]),
                   f"model.json max_length {manifest.max_length}: the graph fails on a sequence of {length} tokens "
                   "(its positions end before?)")


def _run_probe(run: Run, feeds: dict[str, np.ndarray], what: str) -> None:
    try:
        outputs = run(feeds)
    except Exception as exc:  # onnxruntime's own exception types
        raise PackageError(f"{what}: {one_line(exc)}") from None
    for name, value in outputs.items():
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            raise PackageError(f"{what}: output {name!r} is not finite")


def check_prompts(tokenize: Callable[[str, bool], list[int]], vocabulary: Vocabulary, vocab_size: int,
                  max_length: int) -> None:
    """A decoder's text prompts: a text longer than the context goes through the engine's own tokenizer path
    (truncated to what fits) and must come out as ids of the graph's vocabulary."""
    tokens = min(max_length, PROMPT_PROBE_TOKENS)
    try:
        ids = tokenize(sample_text(tokens, vocabulary), True)
    except Exception as exc:
        raise PackageError(f"tokenizer.json: a prompt of {tokens} tokens fails: {one_line(exc)}") from None
    if not ids:
        raise PackageError("tokenizer.json: a prompt text encodes to no tokens")
    if max(ids) >= vocab_size or min(ids) < 0:
        bad = max(ids) if max(ids) >= vocab_size else min(ids)
        raise PackageError(f"tokenizer.json: a prompt encodes to token id {bad}, outside the graph's vocabulary of "
                           f"{vocab_size} (model.json vocab_size)")

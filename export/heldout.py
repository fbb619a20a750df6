"""Held-out inputs for the gate: built-in sentences, a labelled JSONL file, or the default genre test split."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from .errors import ExportError

log = logging.getLogger(__name__)

# Plain sentences written for this gate (not from any training corpus): varied length and punctuation.
BUILTIN_TEXTS = (
    "The ship came into the harbour before the storm broke over the hills.",
    "She asked whether the letter had arrived, and he said nothing at all.",
    "Three soldiers waited by the gate while the king spoke to his council.",
    "What light is that upon the water, and who carries it so late?",
    "My lord, the messenger is here with news from the northern border.",
    "He laughed, for the jest was old and the wine was new.",
    "Give me your hand; we shall walk together to the market.",
    "Nobody remembered the name of the tower or the man who built it.",
    "If the rain stops we will ride at dawn; if not, we wait another day.",
    "The queen is dead, they said, and the city fell silent.",
    "I never thought the garden could hold so many kinds of roses.",
    "Speak softly: the children are asleep in the next room.",
    "Honest friends are rare, and rarer still are honest enemies.",
    "Music played in the hall while the guests argued about the price of bread.",
    "Tomorrow the court will hear the case of the stolen horse.",
    "A fool may ask more questions in an hour than a wise man answers in a year.",
    "Why do you weep? The battle is won and your brother is safe.",
    "The old woman counted her coins twice and then put them away.",
    "Come, let us sing, and forget for a moment the debts we owe.",
    "Between the river and the wood there stood a small grey house.",
    "Fear not the thunder; it is only the sky clearing its throat.",
    "They sailed for seven days without seeing land or bird.",
    "O gentle sleep, why dost thou leave me now?",
    "Bring the maps, the candles, and whatever bread is left.",
)

# Calibration text for the int8 variant's smoothing factors (export/int8.py): written apart from BUILTIN_TEXTS, so
# the gate judges the variant on sentences its scales never saw. Each is also used lowercased without punctuation,
# the form a punctuation restorer is fed.
CALIBRATION_TEXTS = (
    "The miller's daughter carried two baskets of apples down to the ferry.",
    "When the bells rang at noon, every shop on the bridge closed its shutters.",
    "Do you know the road to the abbey, or shall we ask the shepherd?",
    "Her uncle kept a ledger of every debt, and forgave none of them.",
    "Snow fell all night; by morning the wagons could not leave the yard.",
    "I will write to you from the coast, if the post still runs there.",
    "The captain ordered the sails furled and the lanterns lit at once!",
    "Neither the priest nor the judge would say where the money had gone.",
    "Put the kettle on, Margaret, for our guests have travelled far.",
    "A thousand crows rose from the field as the cart rattled past.",
    "Is it true that the duke has sold his horses to pay the soldiers?",
    "They built the wall in a single summer and it stood for three hundred years.",
    "Listen: somewhere below the floor a clock is ticking.",
    "The students argued until dawn about a poem none of them had read.",
    "Lend me your cloak, good sir, and I shall return it by Sunday.",
    "Rivers flood, harvests fail, and still the tax collector comes.",
    "How many ships did the admiral lose in the winter storms?",
    "Every evening the baker gave the last loaf to the boy at the corner.",
    "We found the key under a stone, exactly where the letter said it would be.",
    "Hold your tongue! The walls of this palace have ears.",
    "Old Thomas mended nets by the harbour and sang songs nobody else knew.",
    "The physician shook his head, packed his instruments, and left without a word.",
    "Autumn came early that year, and the vines were bare before the fair.",
    "Why should a poor man fear the dark, when he has nothing left to steal?",
)


def calibration_texts() -> list[str]:
    """CALIBRATION_TEXTS as written and as a punctuation restorer reads them (training.punctuation.bare_text)."""
    from training.punctuation import bare_text

    return [*CALIBRATION_TEXTS, *map(bare_text, CALIBRATION_TEXTS)]


def kv8_texts(texts: tuple[str, ...] | list[str] = BUILTIN_TEXTS) -> tuple[str, str]:
    """(calibration text, gate text) of the int8-cache variant: alternate sentences, so its scales are never
    judged on the text they were fitted to."""
    return " ".join(texts[0::2]), " ".join(texts[1::2])


PROMPT_WORDS = 4


def greedy_prompts(tokenizer, texts: tuple[str, ...] | list[str] = BUILTIN_TEXTS) -> list[list[int]]:
    """The weight-quantized decoders' greedy agreement prompts: the first words of each held-out sentence."""
    return [tokenizer.encode(" ".join(t.split()[:PROMPT_WORDS])).ids for t in texts]


SOURCE_WORDS = 48        # single words (g2p's unit) ...
SOURCE_PHRASES = 24      # ... and 5-word phrases (a translation's), one per held-out sentence


def seq2seq_sources(tokenizer, max_length: int, texts: tuple[str, ...] | list[str] = BUILTIN_TEXTS) -> list[list[int]]:
    """The weight-quantized encoder-decoders' held-out sources: the first distinct words of the held-out sentences
    (punctuation stripped), then each sentence's first five words; source ids cut at `max_length`."""
    words: list[str] = []
    seen: set[str] = set()
    for t in texts:
        for w in t.split():
            w = w.strip(".,;:?!")
            if w and w.lower() not in seen:
                seen.add(w.lower())
                words.append(w)
    phrases = [" ".join(t.split()[:5]) for t in texts][:SOURCE_PHRASES]
    out = [tokenizer.encode(x).ids[:max_length] for x in words[:SOURCE_WORDS] + phrases]
    return [ids for ids in out if ids]


@dataclass(frozen=True)
class LabelledExample:
    text: str
    text_pair: str | None
    label: int


def read_eval_data(path: Path, labels: list[str]) -> list[LabelledExample]:
    """JSONL with `text` (+ optional `text_pair`) and `label` (a label name or its index)."""
    from training.data import DataError, jsonl_rows

    path = Path(path)
    try:
        rows = jsonl_rows(path, path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"--eval-data: cannot read {path} ({exc})") from None
    except DataError as exc:
        raise ExportError(f"--eval-data: {exc}") from None
    index = {name: i for i, name in enumerate(labels)}
    out: list[LabelledExample] = []
    for n, row in rows:
        if not isinstance(row.get("text"), str):
            raise ExportError(f"--eval-data: {path}:{n}: field 'text' missing or not a string")
        pair = row.get("text_pair")
        if pair is not None and not isinstance(pair, str):
            raise ExportError(f"--eval-data: {path}:{n}: field 'text_pair' is not a string")
        label = row.get("label")
        if isinstance(label, str) and label in index:
            label_id = index[label]
        elif isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(labels):
            label_id = label
        else:
            raise ExportError(f"--eval-data: {path}:{n}: field 'label' {label!r} is not one of {labels}")
        out.append(LabelledExample(row["text"], pair or None, label_id))
    if not out:
        raise ExportError(f"--eval-data: {path} holds no examples")
    return out


def default_genre_split(labels: list[str]) -> list[LabelledExample] | None:
    """The training stage's genre test split (unseen plays), when the classifier's labels are the genres."""
    try:
        from training import data
    except ImportError:
        return None
    if sorted(labels) != sorted(getattr(data, "GENRES", ())):
        return None
    try:
        test = data.genre_data().splits["test"]
    except Exception as exc:  # corpus unavailable (offline, no cache): the gate then uses built-in text only
        log.warning("default genre test split unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
        return None
    index = {name: i for i, name in enumerate(labels)}
    return [LabelledExample(e.text, e.text_pair, index[e.label]) for e in test] or None

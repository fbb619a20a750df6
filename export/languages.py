"""The language tokens a translation package accepts as a request's `target_language` (model.json
encoder_decoder.languages), found in the checkpoint's tokenizer.json.

M2M100, NLLB-200 and mBART-50 name each language by one special token of the shared vocabulary, which
transformers' generate forces as the first generated token (`forced_bos_token_id`). Their tokenizers add these
as special added tokens in one of three spellings:
  - M2M100: `__fr__`, `__ast__` (two or three lowercase letters between double underscores);
  - NLLB-200: `fra_Latn`, `zho_Hant` (ISO 639-3 code, underscore, ISO 15924 script);
  - mBART (cc25, mBART-50): `fr_XX`, `zh_CN` (two lowercase letters, underscore, two capitals).
Every special added token of the tokenizer spelled so (and inside the target vocabulary) is a language; nothing
else is. Other families (Marian, BART, T5) have no languages: a request naming one is refused.
"""
from __future__ import annotations

import json
import logging
import re

from tokenizers import Tokenizer

log = logging.getLogger(__name__)

LANGUAGE_FAMILIES = ("m2m_100", "mbart")
LANGUAGE_TOKEN = re.compile(r"__[a-z]{2,3}__|[a-z]{3}_[A-Z][a-z]{3}|[a-z]{2}_[A-Z]{2}")


def language_tokens(tokenizer: Tokenizer, family: str, target_vocab: int) -> dict[str, int]:
    """Language token -> id, ordered by id ({} for a family without languages)."""
    if family not in LANGUAGE_FAMILIES:
        return {}
    found = {t.content: i for i, t in sorted(tokenizer.get_added_tokens_decoder().items())
             if t.special and i < target_vocab and LANGUAGE_TOKEN.fullmatch(t.content)}
    if not found:
        log.warning("tokenizer: no language tokens (special added tokens like __fr__, fra_Latn or fr_XX) in this "
                    "%s tokenizer: the package will refuse target_language", family)
    return found


def source_language(tokenizer: Tokenizer, languages: dict[str, int]) -> tuple[str, int] | None:
    """(the language token the tokenizer's post-processor puts around every source, its index in the encoded ids:
    from the start when it comes before the text, negative from the end after it), or None when the post-processor
    is not one TemplateProcessing with exactly one language token (then a request cannot name its source's
    language). NLLB-200, M2M100 and mBART-50 put it first (`eng_Latn text </s>`), mbart-large-cc25 last
    (`text </s> en_XX`)."""
    processor = json.loads(tokenizer.to_str()).get("post_processor") or {}
    if processor.get("type") != "TemplateProcessing":
        return None
    single = processor.get("single") or []
    names = [next(iter(piece.values())).get("id") for piece in single]
    found = [i for i, name in enumerate(names) if name in languages]
    if len(found) != 1 or "A" not in names:
        return None
    at, text = found[0], names.index("A")
    return names[at], (at if at < text else at - len(names))

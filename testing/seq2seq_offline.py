"""Reference decoding of ONE source on an encoder-decoder package (docs/model-package.md, "Encoder-decoder
packages") with plain onnxruntime sessions: no server, no batching, no padding, no slot buffers.

The encoder runs on the source alone; the decoder is called with `session.run` and a growing self cache (the
in-place graph's attention op appends when past and present are not one buffer), the cross keys/values fed
as the encoder returned them. Serving tests compare the engine with this: "served equals offline".

Greedy follows transformers' `generate` (and training/seq2seq.generate_greedy): the first input is
`decoder_start_token_id`; `forced_bos_token_id` replaces the first new token and `forced_eos_token_id` the last
allowed one when the package sets them; decoding stops after eos.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort

from modelpkg import Manifest, Seq2SeqSpec, past_names, present_names


@dataclass
class Seq2SeqPackage:
    manifest: Manifest
    spec: Seq2SeqSpec
    encoder: ort.InferenceSession
    decoder: ort.InferenceSession


def load_package(package_dir: str | Path, variant: str = "fp32", threads: int = 1,
                 providers: Sequence[str] = ("CPUExecutionProvider",)) -> Seq2SeqPackage:
    """The package's manifest and its two graphs of `variant` as sessions on `providers` (the CPU's by default)."""
    package_dir = Path(package_dir)
    manifest = Manifest.from_json((package_dir / "model.json").read_text(encoding="utf-8"))
    spec = manifest.encoder_decoder
    if spec is None:
        raise ValueError(f"{package_dir}: not an encoder-decoder package (model.json has no encoder_decoder)")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3

    def open_graph(name: str) -> ort.InferenceSession:
        return ort.InferenceSession(str(package_dir / name), opts, providers=list(providers))

    return Seq2SeqPackage(manifest, spec, open_graph(spec.encoder_file(variant)),
                          open_graph(spec.decoder_file(variant)))


def encode(pkg: Seq2SeqPackage, source_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """cross.{i}.key/value [1, heads, len(source), head_dim] of one source."""
    if not source_ids:
        raise ValueError("source_ids: must not be empty")
    if len(source_ids) > pkg.spec.max_source_length:
        raise ValueError(f"source_ids: {len(source_ids)} tokens, the package takes {pkg.spec.max_source_length}")
    ids = np.asarray([source_ids], dtype=np.int64)
    outs = pkg.encoder.run(pkg.spec.cross_names, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    return dict(zip(pkg.spec.cross_names, outs))


def right_padded(rows: Sequence[Sequence[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows as one right-padded int64 batch and its mask (by length: a decoder start token may be the pad id)."""
    ids = np.full((len(rows), max(map(len, rows))), pad, np.int64)
    mask = np.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, :len(row)], mask[r, :len(row)] = row, 1
    return ids, mask


def padded_batch_logits(pkg: Seq2SeqPackage, src: np.ndarray, src_mask: np.ndarray, tgt: np.ndarray,
                        tgt_mask: np.ndarray) -> np.ndarray:
    """Teacher-forced logits [B, T, target_vocab] of a right-padded batch: the encoder on the sources, the decoder's
    first call (empty self cache) on the targets with both masks."""
    spec = pkg.spec
    cross = dict(zip(spec.cross_names, pkg.encoder.run(spec.cross_names, {"input_ids": src,
                                                                          "attention_mask": src_mask})))
    empty = np.zeros((len(tgt), spec.num_heads, 0, spec.head_dim), np.float32)
    feeds = {"input_ids": tgt, "attention_mask": tgt_mask, "encoder_attention_mask": src_mask, **cross,
             **{n: empty for n in past_names(spec.num_layers)}}
    return pkg.decoder.run(["logits"], feeds)[0]


def step_logits(pkg: Seq2SeqPackage, cross: dict[str, np.ndarray], target_ids: Sequence[int]) -> np.ndarray:
    """Teacher-forced logits [len(target_ids), target_vocab] of one target (decoder start included), one call."""
    spec = pkg.spec
    ids = np.asarray([target_ids], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "encoder_attention_mask": np.ones((1, cross[spec.cross_names[0]].shape[2]), np.int64), **cross,
             **{n: np.zeros((1, spec.num_heads, 0, spec.head_dim), np.float32) for n in past_names(spec.num_layers)}}
    return pkg.decoder.run(["logits"], feeds)[0][0]


def stepped_logits(pkg: Seq2SeqPackage, source_ids: Sequence[int], target_ids: Sequence[int]) -> np.ndarray:
    """Teacher forcing through the self cache: one decoder call per target token (decoder start included),
    each reading the cache the previous calls wrote. Logits [len(target_ids), target_vocab]."""
    spec = pkg.spec
    cross = encode(pkg, source_ids)
    pasts, presents = past_names(spec.num_layers), present_names(spec.num_layers)
    past = {n: np.zeros((1, spec.num_heads, 0, spec.head_dim), np.float32) for n in pasts}
    rows = []
    for step, token in enumerate(target_ids):
        feeds = {"input_ids": np.asarray([[token]], np.int64), "attention_mask": np.ones((1, step + 1), np.int64),
                 "encoder_attention_mask": np.ones((1, len(source_ids)), np.int64), **cross, **past}
        results = pkg.decoder.run(["logits", *presents], feeds)
        rows.append(results[0][0, -1])
        past = dict(zip(pasts, results[1:]))
    return np.stack(rows)


def greedy(pkg: Seq2SeqPackage, source_ids: Sequence[int], max_new_tokens: int,
           forced: bool = True, forced_bos: int | None = None) -> list[int]:
    """Greedy new ids (the eos id included when decoding ended on it). forced=False ignores the package's
    forced_bos / forced_eos; forced_bos replaces the package's first forced token (a request's target language)."""
    spec = pkg.spec
    cross = encode(pkg, source_ids)
    max_new_tokens = min(max_new_tokens, spec.max_target_length - 1)
    enc_mask = np.ones((1, len(source_ids)), np.int64)
    pasts, presents = past_names(spec.num_layers), present_names(spec.num_layers)
    past = {n: np.zeros((1, spec.num_heads, 0, spec.head_dim), np.float32) for n in pasts}
    token = spec.decoder_start_token_id
    out: list[int] = []
    for step in range(max_new_tokens):
        feeds = {"input_ids": np.asarray([[token]], np.int64), "attention_mask": np.ones((1, step + 1), np.int64),
                 "encoder_attention_mask": enc_mask, **cross, **past}
        results = pkg.decoder.run(["logits", *presents], feeds)
        token = int(np.argmax(results[0][0, -1]))
        first = spec.forced_bos_token_id if forced_bos is None else forced_bos
        if forced and step == 0 and first is not None:
            token = first
        if forced and step == max_new_tokens - 1 and spec.forced_eos_token_id is not None:
            token = spec.forced_eos_token_id
        out.append(token)
        if token == spec.eos_token_id:
            break
        past = dict(zip(pasts, results[1:]))
    return out


def greedy_text(package_dir: str | Path, sources: Sequence[str], max_new_tokens: int) -> list[str]:
    """Tokenize each source with the package's tokenizer, decode greedily, detokenize with the target tokenizer
    (eos and other special tokens skipped)."""
    from tokenizers import Tokenizer

    package_dir = Path(package_dir)
    pkg = load_package(package_dir)
    src_tok = Tokenizer.from_file(str(package_dir / "tokenizer.json"))
    tgt_tok = Tokenizer.from_file(str(package_dir / (pkg.spec.target_tokenizer or "tokenizer.json")))
    return [tgt_tok.decode(greedy(pkg, src_tok.encode(s).ids, max_new_tokens), skip_special_tokens=True)
            for s in sources]


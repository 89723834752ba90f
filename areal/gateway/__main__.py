"""``python -m areal.gateway [--port P] [--record DIR] [--config-name NAME] [key=value ...]``: the
gateway on its own, in front of a model, for trying an agent before training it
(``areal/gateway/standalone.py``).

The model, the engine and the gateway are set with the same ``key=value`` overrides as a run
(``model.path=smollm2-135m-instruct``, ``engine.kind=sglang engine.urls=[http://...]``,
``gateway.tool_template=chatml-tools``), composed from the same ``conf/`` YAMLs over the same
schema (``--config-name smollm2`` is the SmolLM2 demo's), so an agent is tried against the model
served exactly as its training run will serve it, and the command line moves over to
``python -m areal.train`` unchanged. Keys a run has that the gateway does not use (``rollout.*``,
``trainer.*``) are checked and ignored. What only the gateway alone has (its address, its record
directory, its key) are flags.

Exit status: 0 when stopped by Ctrl-C or SIGTERM, 2 for bad input (the message names the key or
flag), 1 when the engine it launched died.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import time

from hydra.errors import HydraException

from areal.aio import run, until_signalled
from areal.config import compose
from areal.gateway.standalone import EngineDied, StandaloneConfig, StartFailed, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areal.gateway",
        description="Serve a model behind the gateway, alone: print a base URL and key for each API, record every call.",
        epilog="e.g. python -m areal.gateway model.path=smollm2-135m-instruct gateway.tool_template=chatml-tools",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="a run's config keys (python -m areal.config lists them)")
    parser.add_argument("--config-name", default="config", help="the conf/ YAML to compose (default: config)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8777, help="port to listen on (default: 8777; 0: any free one)")
    parser.add_argument("--record", default="", help="directory the calls are recorded in (default: runs/gateway/<timestamp>)")
    parser.add_argument("--api-key", default="", help="the key clients send (default: a random one at every start)")
    args = parser.parse_args(argv)
    say = functools.partial(print, flush=True)
    try:
        options = StandaloneConfig(
            record=args.record or time.strftime("runs/gateway/%Y%m%d-%H%M%S"), host=args.host, port=args.port, api_key=args.api_key
        )
        config = compose(args.config_name, args.overrides)
    except (HydraException, ValueError) as e:  # a key or a value of the command line
        return _fail(str(e), 2)
    try:
        run(until_signalled(serve(config.model.path, config.engine, config.gateway, options, say)))
    except StartFailed as e:
        return _fail(str(e), 2)
    except EngineDied as e:
        return _fail(str(e), 1)
    except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C, SIGTERM: everything was stopped on the way out
        return 0
    return 0


def _fail(message: str, status: int) -> int:
    print(f"python -m areal.gateway: {message}", file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())

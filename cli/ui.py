"""``aoq ui``: start the comparison web UI (Gradio) in front of a running ``aoq serve``."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from aoq_cli import int_at_least
from aoq_ui.client import DEFAULT_BACKEND_URL

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        default=os.environ.get("AOQ_BACKEND_URL", DEFAULT_BACKEND_URL),
        help="URL of the search service (env AOQ_BACKEND_URL; default %(default)s)",
    )
    parser.add_argument(
        "--public-backend-url",
        default=os.environ.get("AOQ_PUBLIC_BACKEND_URL"),
        help="the search service's URL as the browser reaches it: pictures load from there instead of "
        "through the UI's own server (env AOQ_PUBLIC_BACKEND_URL; default: through the UI)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=7860, help="port to listen on (default %(default)s)")
    parser.add_argument(
        "--concurrency", type=int_at_least(1), default=4, help="events handled at once (default %(default)s)"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the service per request (default %(default)s)"
    )
    parser.add_argument(
        "--examples", default=None, metavar="YAML",
        help="free-text example queries to offer, grouped (e.g. configs/emoji_queries.yaml)",
    )
    parser.add_argument(
        "--results", default=None, metavar="MD",
        help="a results page of aoq report (e.g. docs/results-emoji.md): the Metrics tab puts the served seed "
             "beside its multi-seed baseline and AOQ figures",
    )


def run(args: argparse.Namespace) -> int:
    # Imported here so that other commands never pay for importing Gradio.
    from aoq_ui.app import build_app, launch
    from aoq_ui.client import BackendClient

    if not log.isEnabledFor(logging.DEBUG):
        # One INFO line per backend call drowns the log; `aoq -v ui` shows them.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    from aoq_ui.examples import ExamplesError, load_example_queries
    from aoq_ui.seeds import ResultsError, load_seed_summary

    try:
        queries = load_example_queries(args.examples) if args.examples else []
        seeds = load_seed_summary(args.results) if args.results else None
    except (ExamplesError, ResultsError) as exc:
        print(f"aoq ui: error: {exc}", file=sys.stderr)
        return 2
    client = BackendClient(args.backend, public_url=args.public_backend_url, timeout=args.timeout)
    demo = build_app(client, concurrency=args.concurrency, example_queries=queries, seeds=seeds)
    log.info("comparison UI on http://%s:%d (search service %s)", args.host, args.port, args.backend)
    try:
        launch(demo, client, args.host, args.port, block=True)
    finally:
        client.close()
    return 0

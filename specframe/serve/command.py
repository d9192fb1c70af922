"""``specframe serve``: check the config, load the target once, serve the OpenAI API with uvicorn until SIGTERM or
Ctrl-C (in-flight requests drain first, then the batch loop stops and the process exits 0)."""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import ConfigError, SpecframeError


def serve(
    config: Optional[Path] = typer.Option(None, "--config", help="specframe YAML config (model, proposers, ...)."),
    model: Optional[str] = typer.Option(None, "--model", help="Built-in name, model directory or .gguf file."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    batch_size: int = typer.Option(8, "--batch-size", help="Requests in one target forward at most."),
    max_pending: int = typer.Option(64, "--max-pending", help="Requests queued or decoding at most; more get 429."),
    max_tokens: int = typer.Option(4096, "--max-tokens-limit", help="The most max_tokens a request may ask for."),
    allow: Optional[List[str]] = typer.Option(
        None, "--allow-proposer", help="A proposer requests may pick (repeatable; default: every installed one)."),
    served_name: Optional[str] = typer.Option(None, "--served-model-name", help="The model id clients name."),
    drain: float = typer.Option(
        55.0, "--drain-seconds", help="On SIGTERM / Ctrl-C, seconds streams in flight may take to finish; one still "
        "going then ends with an error object (code server_shutting_down) and [DONE]."),
    tool_parser: Optional[str] = typer.Option(
        None, "--tool-call-parser", help="The model's tool-call format for tool_choice auto (hermes, xlam, "
        "llama3_json, mistral, pythonic, qwen3_xml, openai, generic, or a plugin's; default: detected from the "
        "chat template, generic when none matches)."),
    reasoning_parser: Optional[str] = typer.Option(
        None, "--reasoning-parser", help="The model's reasoning format, returned as reasoning_content (deepseek_r1, "
        "qwen3, openai_gptoss, or a plugin's; default: detected from the chat template)."),
) -> None:
    """Serve the OpenAI API (completions, chat, streaming) over the batched engine (docs/serving.md)."""
    from ..cli.console import fail

    try:
        _serve(config, model, host, port, batch_size, max_pending, max_tokens, allow, served_name, drain,
               (tool_parser, reasoning_parser))
    except SpecframeError as exc:
        fail(str(exc))


def _serve(config, model, host, port, batch_size, max_pending, max_tokens, allow, served_name, drain,
           parsers=(None, None)) -> None:
    if not 1 <= batch_size <= 256:
        raise ConfigError(f"--batch-size must be in [1, 256], got {batch_size}")
    if max_pending < 1 or max_tokens < 1:
        raise ConfigError("--max-pending and --max-tokens-limit must be >= 1")
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be in [1, 65535], got {port}")
    if not 0 <= drain <= 3600:
        raise ConfigError(f"--drain-seconds must be in [0, 3600], got {drain:g}")
    try:
        import fastapi  # noqa: F401
        import sse_starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"specframe serve needs its server libraries ({exc.name} is missing): "
                          "pip install 'specframe[serve]'") from None
    sock = _listen(host, port)  # before the model loads: a port in use is one error line, not a loaded model's exit
    try:
        _load_and_run(sock, config, model, host, port, batch_size, max_pending, max_tokens, allow, served_name, drain,
                      parsers)
    finally:
        sock.close()


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (handed to uvicorn, so nothing can take the port in between).

    Raises:
        ConfigError: the address cannot be bound (in use, not this machine's, not permitted).
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except (OSError, IndexError) as exc:
        raise ConfigError(f"--host {host}: not an address to listen on ({exc}): give an IP address or a host name of "
                          "this machine") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        why = exc.strerror or str(exc)
        raise ConfigError(f"--port {port}: cannot listen on {host}:{port} ({why}): pick another --port, or stop what "
                          "listens there") from None
    sock.set_inheritable(True)
    return sock


def _load_and_run(sock, config, model, host, port, batch_size, max_pending, max_tokens, allow, served_name,
                  drain, parsers=(None, None)) -> None:
    from ..cli.console import err, load_with_progress
    from ..config import load_config
    from ..registry import build_registry
    from ..target.models import resolve_model

    registry = build_registry()
    cfg = load_config(config, registry=registry, model=model, batch_size=batch_size)
    for name in allow or ():
        registry.proposer(name)  # an unknown name: one error line listing what is installed
    tool_parser, reasoning_parser = parsers
    if tool_parser:
        registry.tool_parser(tool_parser)  # (likewise, before the model loads)
    if reasoning_parser:
        registry.reasoning_parser(reasoning_parser)
    resolve_model(cfg.model)
    sf = load_with_progress(cfg, registry)
    from .app import create_app

    app = create_app(sf, model_name=served_name, allowed=set(allow) if allow else None, max_tokens_limit=max_tokens,
                     max_pending=max_pending, drain_s=drain, tool_parser=tool_parser,
                     reasoning_parser=reasoning_parser)
    err.print(f"serving {served_name or cfg.model} on http://{host}:{port} (batch {batch_size}; OpenAI API: "
              "/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)", markup=False, soft_wrap=True)
    f = app.state.formats
    err.print(f"tool calls: {f.tool.name if f.tool else 'none'} ({f.why.get('tool')}); reasoning: "
              f"{f.reasoning.name if f.reasoning else 'none'} ({f.why.get('reasoning')})", markup=False)
    # uvicorn turns SIGTERM / SIGINT into a graceful shutdown, then hands the signal back to the handler that was
    # there before it started: with a no-op one there, a drained server ends here and the process exits 0.
    previous = {sig: signal.signal(sig, _drained) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _run_uvicorn(app, host, port, drain, sock)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sf.close()
    err.print("specframe serve: drained and stopped", markup=False)


def _run_uvicorn(app, host: str, port: int, drain: float, sock: socket.socket) -> None:
    """uvicorn on ``sock`` until SIGTERM / Ctrl-C, telling the app when the signal comes (``app.state.begin_shutdown``:
    its requests' drain bound starts); uvicorn's own graceful timeout is the bound plus 5 s."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            app.state.begin_shutdown()
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                          timeout_graceful_shutdown=int(drain) + 5)).run(sockets=[sock])


def _drained(signum: int, frame: object) -> None:
    """The handler uvicorn re-raises a shutdown signal into once it has drained: nothing more to do."""

"""The OpenAI-compatible HTTP app of ``specframe serve`` (FastAPI on Starlette; SSE via sse-starlette; metrics via
prometheus-client).

Every request is one :meth:`specframe.api.Specframe.submit` to the batch loop thread (continuous batching: requests
join and leave between steps, up to the config's ``batch_size`` in each target forward), with its own strategy when
the body carries ``"speculative"``. A streamed request's text pieces travel from the loop thread to its event stream
through an asyncio queue; a client that goes away sets the request's cancel event, and it leaves the batch before the
next step. Every refusal is a 4xx with the OpenAI error object ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any, AsyncIterator

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ConstraintError, SpecframeError, first_line
from .metrics import ServerMetrics
from .schemas import ChatRequest, CompletionRequest, unanswered_tool_message
from .structured import StructuredRequestError, chat_logprobs, completion_logprobs, request_constraint, tool_calls
from .tool_calling import AutoStream, Formats, Plan, answer_parts, plan, template_messages, with_system

__all__ = ["create_app", "error_body"]

# seconds before the drain bound at which a stream still going is ended (its last events must reach the client
# before sse-starlette cancels the generator at the bound)
DRAIN_MARGIN_S = 2.0


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Refused(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def create_app(sf: Any, *, model_name: str | None = None, allowed: set[str] | None = None,
               max_tokens_limit: int = 4096, max_pending: int = 64, drain_s: float = 55.0,
               tool_parser: str | None = None, reasoning_parser: str | None = None) -> FastAPI:
    """The app serving ``sf`` (a loaded :class:`~specframe.api.Specframe` with ``batch_size`` >= 1).

    Args:
        model_name: the id ``/v1/models`` lists and requests may name (default: the config's model).
        allowed: proposer names a request's ``speculative`` may use (None: every installed one).
        max_tokens_limit: the most ``max_tokens`` a request may ask for.
        max_pending: requests queued or decoding at most; more get a 429.
        drain_s: seconds a stream in flight at shutdown may take to finish (keep it under uvicorn's
            ``timeout_graceful_shutdown``); one still going ``DRAIN_MARGIN_S`` before the bound ends with an error
            object (``code: "server_shutting_down"``) and ``[DONE]``; a request that does not stream is answered 503
            with that error object then (counted from ``app.state.begin_shutdown()``, which the host calls at the
            shutdown signal).
        tool_parser, reasoning_parser: the tool-call and reasoning formats by name (None: the ones whose ``detect``
            accepts the model's chat template; :mod:`specframe.serve.tool_calling`).

    Raises:
        UnknownToolParserError, UnknownReasoningParserError: a parser name no installed plugin registers.
    """
    app = FastAPI(title="specframe", docs_url=None, redoc_url=None)
    template = getattr(getattr(sf.target, "tokenizer", None), "chat_template", None)
    formats = Formats.choose(sf.registry, template if isinstance(template, str) else None, tool_parser,
                             reasoning_parser)
    server = _Server(sf, model_name or sf.config.model, allowed, max_tokens_limit, max_pending, drain_s, formats)
    app.state.begin_shutdown = server.begin_shutdown
    app.state.formats = formats
    metrics = server.metrics
    _error_handlers(app, metrics)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "pending": sf.pending}

    def model_object() -> dict[str, Any]:
        return {"id": server.name, "object": "model", "created": server.created, "owned_by": "specframe"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_object()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Any:  # (OpenAI's "retrieve model": client.models.retrieve(id))
        if model_id != server.name:
            return JSONResponse(error_body(f"model {model_id!r} is not served here; this server serves "
                                           f"{server.name!r}", "not_found_error", "model", "model_not_found"),
                                status_code=404)
        return model_object()

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.running.set(sf.pending)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await server.serve(body, request, body.prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        prompt, p = server.chat_prompt(body)
        return await server.serve(body, request, prompt, chat=True, plan_=p)

    return app


def _error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Answer every refusal with the OpenAI error object: a body that fails validation (400), a :class:`_Refused`
    (its status), and Starlette's own HTTP errors (e.g. 404 for an unknown path, 405); the first two are counted in
    ``metrics.requests`` under the path and status."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.requests.labels(request.url.path, "400").inc()
        message, param = _validation_message(exc)
        return JSONResponse(error_body(message, param=param), status_code=400)

    @app.exception_handler(_Refused)
    async def _refused(request: Request, exc: _Refused) -> JSONResponse:
        metrics.requests.labels(request.url.path, str(exc.status)).inc()
        return JSONResponse(error_body(exc.message, exc.kind, exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), status_code=exc.status_code)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """``(message, param)`` of a body that failed validation: its first error, said as OpenAI's API says it."""
    errors = exc.errors()
    # (our own checks' messages say most: in a union, the branch the client meant fails with a value error while the
    # others fail on the type)
    first = next((e for e in errors if e.get("type") == "value_error"), errors[0] if errors else {})
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        return f"the body is not valid JSON: {first.get('msg', '')}", param
    if kind == "extra_forbidden":
        return f"unknown field {param!r}: specframe serve does not take it", param
    return f"{param or 'body'}: {first.get('msg', 'invalid value')}", param


class _Server:
    """What the routes share: the loaded model, the limits, the metrics; one request's way from its body to the
    batch loop and back (:meth:`serve`)."""

    def __init__(self, sf: Any, name: str, allowed: set[str] | None, max_tokens_limit: int, max_pending: int,
                 drain_s: float, formats: Formats | None = None) -> None:
        self.sf, self.name, self.allowed = sf, name, allowed
        self.formats = formats or Formats()
        self.max_tokens_limit, self.max_pending, self.drain_s = max_tokens_limit, max_pending, drain_s
        self.metrics = ServerMetrics()
        self.created = int(time.time())
        self.in_flight = 0  # requests admitted and not finished: counted at admission, so a burst cannot pass at once
        self._count = threading.Lock()
        self.stopping_at: float | None = None  # time.monotonic() of the shutdown signal (begin_shutdown)

    def begin_shutdown(self) -> None:
        """The server got SIGTERM / Ctrl-C (``app.state.begin_shutdown``, called by ``specframe serve``): requests
        in flight that do not stream have ``drain_s`` from now (less ``DRAIN_MARGIN_S``) to finish."""
        if self.stopping_at is None:
            self.stopping_at = time.monotonic()

    def _past_drain(self) -> bool:
        return self.stopping_at is not None and time.monotonic() >= self.stopping_at + self.drain_s - DRAIN_MARGIN_S

    def _finished_one(self, *_: Any) -> None:
        with self._count:
            self.in_flight -= 1

    def chat_prompt(self, body: ChatRequest) -> tuple[list[int], Plan]:
        """The token ids of a chat body under the model's chat template, and the request's plan (its constraint and
        how its answer is read: :func:`specframe.serve.tool_calling.plan`).

        Raises:
            _Refused: 400, the model has no chat template; a tool message that answers no call; structured-output
                fields that cannot be served together.
        """
        unanswered = unanswered_tool_message(body.messages)
        if unanswered is not None:
            raise _Refused(400, *unanswered)
        tok = getattr(self.sf.target, "tokenizer", None)
        if tok is None or not getattr(tok, "chat_template", None):
            raise _Refused(400, f"model {self.name} has no chat template: use /v1/completions", "messages")
        try:
            p = plan(body, self.formats, added=dict(tok.get_added_vocab()) if hasattr(tok, "get_added_vocab") else {})
        except StructuredRequestError as exc:
            raise _Refused(400, str(exc), exc.param) from None
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        if p.auto is not None and p.auto.trigger is None:
            tools = None  # (the template does not know tools: the system line lists them)
        messages = with_system(template_messages([m.for_template() for m in body.messages], p.auto), p.system)
        ids = list(tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])
        if p.reasoning is not None:  # did the template open the reasoning in the prompt? (the constraint follows it)
            p = plan(body, self.formats, tok.decode(ids[-16:]), added=p.added)
        return ids, p

    def _admit(self, body: Any, prompt: list[int]) -> None:
        """Refuse what this server will not decode (each a 4xx with the OpenAI error object).

        Raises:
            _Refused: another model (404); ``max_tokens`` over the limit or past the context (400); a proposer not
                allowed (400); too many requests in flight (429).
        """
        if body.model is not None and body.model != self.name:
            raise _Refused(404, f"model {body.model!r} is not served here; this server serves {self.name!r}", "model",
                           "model_not_found", "not_found_error")
        limit = body.limit
        if limit is not None and limit > self.max_tokens_limit:
            raise _Refused(400, f"max_tokens {limit} is over this server's limit of {self.max_tokens_limit}",
                           "max_tokens")
        context = int(self.sf.target.max_context)
        if limit is not None and prompt and len(prompt) < context < len(prompt) + limit:
            # (as vLLM and OpenAI answer: a completion that cannot fit is refused, not cut short silently)
            raise _Refused(400, f"this model's maximum context length is {context} tokens; the request asks for "
                                f"{len(prompt) + limit} ({len(prompt)} in the prompt, {limit} in the completion): "
                                "shorten the prompt or lower max_tokens", "max_tokens")
        spec = body.speculative
        if spec is not None and self.allowed is not None:
            for p in spec.proposers:
                pname = p if isinstance(p, str) else p.get("name")
                if pname not in self.allowed:
                    raise _Refused(400, f"proposer {pname!r} is not allowed here; allowed: "
                                        f"{', '.join(sorted(self.allowed))}", "speculative.proposers")
        with self._count:  # (checked and counted with no await between: requests of a burst are told apart)
            busy = max(self.in_flight, self.sf.pending)
            if busy >= self.max_pending:
                raise _Refused(429, f"the server has {busy} requests in flight (its limit): retry later",
                               code="rate_limit_exceeded", kind="rate_limit_error")
            self.in_flight += 1

    async def serve(self, body: Any, request: Request, prompt: Any, chat: bool, plan_: Plan | None = None) -> Any:
        """One request: refused (:meth:`_admit`), or submitted to the batch loop and answered whole or streamed.
        ``plan_``: a chat request's plan (:meth:`chat_prompt`); a completion's is its ``response_format`` alone."""
        if plan_ is None:
            try:
                constraint, calls = request_constraint(body)
            except StructuredRequestError as exc:
                raise _Refused(400, str(exc), exc.param) from None
            plan_ = Plan(constraint, calls)
        constraint, calls = plan_.constraint, plan_.calls
        if isinstance(prompt, str):
            prompt = await run_in_threadpool(self.sf.encode, prompt, False)  # (the raw prompt: no chat template)
        self._admit(body, prompt)
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def on_text(piece: str) -> None:  # (the loop thread)
            loop.call_soon_threadsafe(pieces.put_nowait, piece)

        kwargs: dict[str, Any] = dict(
            max_new_tokens=body.limit, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
            seed=body.seed, stop=body.stop or None, chat=False, cancel=cancel,  # (chat: ids already templated)
            on_text=on_text if body.stream and calls is None else None,  # (a tool call is sent whole)
            constraint=constraint, logprobs=body.top_logprobs_n)
        if body.speculative is not None:
            spec = body.speculative
            kwargs.update(proposers=spec.proposers, merge=spec.merge, router=spec.router)
        try:
            future = await run_in_threadpool(self.sf.submit, prompt, **kwargs)
        except SpecframeError as exc:
            self._finished_one()
            raise _Refused(400, str(exc).strip().splitlines()[0]) from None
        except TypeError as exc:
            self._finished_one()
            raise _Refused(400, str(exc)) from None
        except BaseException:
            self._finished_one()
            raise
        future.add_done_callback(self._finished_one)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        endpoint = request.url.path
        if not body.stream:
            return await self._whole(rid, chat, future, request, cancel, endpoint, plan_)
        include_usage = body.stream_options.include_usage if body.stream_options else True
        # on SIGTERM a stream in flight runs to its end (sse-starlette would cut it at once), for drain_s at most:
        # sse-starlette sets `stopping` at the signal, and a stream still going near the bound ends cleanly
        stopping = anyio.Event()
        return EventSourceResponse(self._events(rid, chat, future, pieces, cancel, include_usage, endpoint, plan_,
                                                stopping),
                                   ping=15, sep="\n", shutdown_event=stopping,
                                   shutdown_grace_period=self.drain_s)

    async def _whole(self, rid: str, chat: bool, future: Any, request: Request, cancel: threading.Event,
                     endpoint: str, p: Plan) -> Any:
        """The answer of a request that does not stream, or 499 when its client goes away first."""
        waiter = asyncio.ensure_future(asyncio.wrap_future(future))
        waiter.add_done_callback(_retrieve)
        watcher = asyncio.ensure_future(_until_disconnected(request))
        try:
            while not (waiter.done() or watcher.done()):  # (woken each half second: has the shutdown's bound come?)
                await asyncio.wait({waiter, watcher}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                if not waiter.done() and self._past_drain():
                    watcher.cancel()
                    for event in self._cut_at_shutdown(cancel, endpoint):
                        return JSONResponse(json.loads(event), status_code=503)
        except asyncio.CancelledError:  # uvicorn gave up on the request: its row is freed, not decoded on
            cancel.set()
            raise
        if not waiter.done():  # the client went away: its row is freed before the next step
            cancel.set()
            self.metrics.requests.labels(endpoint, "cancelled").inc()
            return Response(status_code=499)
        watcher.cancel()
        try:
            result = waiter.result()
        except ConstraintError as exc:  # the request's own schema, found while decoding to admit no way on
            raise _Refused(400, first_line(exc) or type(exc).__name__) from None
        self.metrics.finished(result)
        self.metrics.requests.labels(endpoint, "200").inc()
        return self._response(rid, chat, result, p)

    async def _events(self, rid: str, chat: bool, future: Any, pieces: asyncio.Queue, cancel: threading.Event,
                      include_usage: bool, endpoint: str, p: Plan,
                      stopping: anyio.Event | None = None) -> AsyncIterator[str]:
        """The SSE events of a streamed request: its text pieces as the loop thread sends them, the finish chunk,
        the usage chunk and ``[DONE]``; an error after the stream started goes in the stream. A stream still going
        ``drain_s - DRAIN_MARGIN_S`` seconds after ``stopping`` is set (the server shutting down) is cancelled and
        ends with an error object (``code: "server_shutting_down"``) and ``[DONE]``, never cut mid-event. Under
        ``auto`` or with a reasoning parser the pieces are read as they come (:class:`AutoStream`): reasoning,
        content and ``tool_calls`` deltas; a forced call (``required`` / named) is sent whole at the end."""
        reader = AutoStream(p) if chat and p.calls is None and (p.auto or p.reasoning) else None

        def deltas(piece: str) -> list[Any]:
            return reader.feed(piece) if reader is not None else [piece]

        done = asyncio.wrap_future(future)
        done.add_done_callback(_retrieve)  # a stream the client left still ends its future: nobody reads it
        watch = asyncio.ensure_future(stopping.wait()) if stopping is not None else None
        deadline: float | None = None
        finished = False
        try:
            if chat:
                yield json.dumps(self._chunk(rid, chat, {"role": "assistant", "content": ""}, None))
            while True:
                getter = asyncio.ensure_future(pieces.get())
                waits = {getter, done} if watch is None or watch.done() else {getter, done, watch}
                await asyncio.wait(waits, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()),
                                   return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    for d in deltas(getter.result()):
                        yield json.dumps(self._chunk(rid, chat, d, None))
                    continue
                getter.cancel()
                if not done.done():
                    if deadline is None and watch is not None and watch.done():  # the shutdown began: its bound
                        deadline = time.monotonic() + max(0.0, self.drain_s - DRAIN_MARGIN_S)
                        continue
                    if deadline is not None and time.monotonic() >= deadline:
                        for event in self._cut_at_shutdown(cancel, endpoint):
                            yield event
                        finished = True
                        return
                    continue
                while not pieces.empty():  # pieces the loop thread queued before the request finished
                    for d in deltas(pieces.get_nowait()):
                        yield json.dumps(self._chunk(rid, chat, d, None))
                break
            try:
                result = done.result()
            except ConstraintError as exc:  # the request's own schema, found while decoding to admit no way on: a
                # client error, and the end of the stream
                yield json.dumps(error_body(first_line(exc) or type(exc).__name__))
                yield "[DONE]"
                self.metrics.requests.labels(endpoint, "400").inc()
                finished = True
                return
            except Exception as exc:  # noqa: BLE001 - the stream has started: the error goes in it
                yield json.dumps(error_body(str(exc).strip().splitlines()[0] if str(exc) else type(exc).__name__,
                                            "server_error"))
                self.metrics.requests.labels(endpoint, "500").inc()
                finished = True
                return
            answer = self._answer(chat, result, p)
            for d in _last_deltas(answer, reader, p):
                yield json.dumps(self._chunk(rid, chat, d, None))
            yield json.dumps(self._chunk(rid, chat, "" if not chat else {}, answer["finish_reason"],
                                         answer.get("logprobs")))
            if include_usage:
                yield json.dumps({**self._chunk(rid, chat, None, None), "choices": [], "usage": _usage(result)})
            yield "[DONE]"
            self.metrics.finished(result)
            self.metrics.requests.labels(endpoint, "200").inc()
            finished = True
        finally:
            if watch is not None:
                watch.cancel()
            if not finished:  # the client went away mid-stream: free its row now
                cancel.set()
                self.metrics.requests.labels(endpoint, "cancelled").inc()

    def _cut_at_shutdown(self, cancel: threading.Event, endpoint: str) -> list[str]:
        """The answer of a request the shutdown's drain bound ends (the error object, then ``[DONE]`` for a stream):
        its request is cancelled (its row freed)."""
        cancel.set()
        self.metrics.requests.labels(endpoint, "503").inc()
        return [json.dumps(error_body(f"the server is shutting down and this request ran past its drain period "
                                      f"({self.drain_s:g} s): send it again", "server_error",
                                      code="server_shutting_down")), "[DONE]"]

    def _chunk(self, rid: str, chat: bool, piece: Any, finish: str | None, logprobs: Any = None) -> dict[str, Any]:
        if chat:
            delta = piece if isinstance(piece, dict) else {"content": piece}
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": logprobs, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
                "model": self.name, "choices": [choice]}

    def _answer(self, chat: bool, result: Any, p: Plan) -> dict[str, Any]:
        """``finish_reason``, ``logprobs`` and the answer: ``reasoning_content`` (a reasoning model's), then
        ``tool_calls`` (complete calls, finish ``tool_calls``) or ``content`` (text; also a call cut by max_tokens,
        finish ``length``, or a malformed one under ``auto``, finish ``stop``)."""
        tok = getattr(self.sf.target, "tokenizer", None)
        logprobs = chat_logprobs(result, tok) if chat else completion_logprobs(result, tok)
        reasoning, content, made = answer_parts(result.text, p)
        if p.calls is not None:
            made = (tool_calls(content, p.calls) or []) if result.finish_reason == "stop" else []
        out: dict[str, Any] = {"content": content, "finish_reason": result.finish_reason, "logprobs": logprobs}
        if reasoning is not None:
            out["reasoning_content"] = reasoning
        if made:
            out.update(tool_calls=made, content=None if p.calls is not None else (content or None),
                       finish_reason="tool_calls")
        return out

    def _response(self, rid: str, chat: bool, result: Any, p: Plan) -> dict[str, Any]:
        answer = self._answer(chat, result, p)
        if chat:
            message = {"role": "assistant", "content": answer["content"]}
            if answer.get("reasoning_content") is not None:
                message["reasoning_content"] = answer["reasoning_content"]
            if answer.get("tool_calls"):
                message["tool_calls"] = answer["tool_calls"]
            choice = {"index": 0, "message": message, "logprobs": answer["logprobs"],
                      "finish_reason": answer["finish_reason"]}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": answer["logprobs"],
                      "finish_reason": answer["finish_reason"]}
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.name, "choices": [choice], "usage": _usage(result)}


def _last_deltas(answer: dict[str, Any], reader: AutoStream | None, p: Plan) -> list[dict[str, Any]]:
    """A stream's deltas once its text is complete: what the reader held back (``auto`` / reasoning), or a forced
    call (``required`` / named) whole, with the reasoning before it."""
    if reader is not None:
        return reader.finish()
    if p.calls is None:
        return []
    out = [{"reasoning_content": answer["reasoning_content"]}] if answer.get("reasoning_content") else []
    if answer.get("tool_calls"):
        out.append({"tool_calls": [{"index": i, **c} for i, c in enumerate(answer["tool_calls"])]})
    elif answer.get("content"):  # a call cut short: its text, as the whole answer would have it
        out.append({"content": answer["content"]})
    return out


async def _until_disconnected(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)


def _retrieve(fut: asyncio.Future) -> None:
    """Mark a request's outcome as read (a cancelled request's CancelledError has no reader left)."""
    if not fut.cancelled():
        fut.exception()


def _usage(result: Any) -> dict[str, Any]:
    """OpenAI's usage object, plus ``speculation``: τ, α, forwards and each proposer's drafted / accepted nodes."""
    m = result.metrics
    return {"prompt_tokens": m.prompt_tokens, "completion_tokens": m.new_tokens,
            "total_tokens": m.prompt_tokens + m.new_tokens,
            "speculation": {"tau": round(m.tau, 4), "acceptance_rate": round(m.acceptance_rate, 4),
                            "target_forwards": m.target_forwards, "drafted_nodes": m.drafted_nodes,
                            "accepted_nodes": m.accepted_nodes,
                            "proposers": {label: {"drafted": pm.drafted_nodes, "accepted": pm.accepted_nodes}
                                          for label, pm in m.proposers.items()}}}

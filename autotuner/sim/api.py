"""The simulator's HTTP API: vLLM's OpenAI-compatible routes over one simulated engine.

`/health`, `/ping`, `/version`, `/v1/models`, `/metrics`, `/tokenize`, `/v1/completions`,
`/v1/chat/completions`, and the simulator's own `/sim/requests`. The routes are plain functions; what
they share (the engine, its config, when it started) is an `ApiState` on the Starlette app's state, as
vLLM's entrypoints keep theirs on `app.state`. The engine behind them lives in
`autotuner.sim.engine_loop`; the bodies they stream in `autotuner.sim.response_stream`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from autotuner.errors import AutotunerError
from autotuner.sim import tokens
from autotuner.sim.args import VLLM_VERSION, EngineConfig
from autotuner.sim.engine_loop import ENGINE_DEAD, SimEngine
from autotuner.sim.metrics_exporter import CONTENT_TYPE
from autotuner.sim.response_stream import ResponseShape, error_body, sse, whole


class ApiError(AutotunerError):
    """A request the API refuses, answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.kind, self.status, self.param), status_code=self.status)


@dataclass(frozen=True)
class ApiState:
    """What every route reads: the engine, the config it serves, and when the server started."""

    config: EngineConfig
    engine: SimEngine
    started: float

    def denied(self, request: Request) -> Response | None:
        """401 for a `/v1` request without the `--api-key` bearer token; None when it may pass."""
        key = self.config.api_key
        if key and request.url.path.startswith("/v1") and request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return None

    def model_of(self, body: dict[str, object]) -> str:
        names = self.config.served_model_names
        model = body.get("model") or names[0]
        if model not in names:
            raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}.",
                           "NotFoundError", "model")
        return str(model)

    def prompt_ids(self, body: dict[str, object], chat: bool) -> list[int]:
        vocab = self.config.model.vocab_size
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "messages must be a non-empty list", "BadRequestError", "messages")
            return tokens.encode(tokens.render_chat(messages), vocab)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return tokens.encode(prompt, vocab)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return [int(t) % vocab for t in prompt]
        raise ApiError(400, "prompt must be a string, one string in a list, or a list of token ids",
                       "BadRequestError", "prompt")


def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.sim
    return state


async def _read_body(request: Request) -> dict[str, object]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "Invalid JSON body", "BadRequestError") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object", "BadRequestError")
    return body


async def health(request: Request) -> Response:
    return Response(status_code=503 if _state(request).engine.dead else 200)


async def version(request: Request) -> Response:
    sim = _state(request).config.sim
    return JSONResponse({"version": VLLM_VERSION, "simulator": {
        "speedup": sim.speedup, "gpu": sim.gpu.name, "gpus": sim.num_gpus, "seed": sim.seed,
        "noise": sim.noise, "run": sim.run}})


async def models(request: Request) -> Response:
    state = _state(request)
    if (denied := state.denied(request)) is not None:
        return denied
    config = state.config
    data = [{"id": n, "object": "model", "created": int(state.started), "owned_by": "vllm",
             "root": config.model_arg, "parent": None, "max_model_len": config.max_model_len}
            for n in config.served_model_names]
    return JSONResponse({"object": "list", "data": data})


async def metrics(request: Request) -> Response:
    return Response(_state(request).engine.metrics.render(), media_type=CONTENT_TYPE)


async def tokenize(request: Request) -> Response:
    state = _state(request)
    try:
        body = await _read_body(request)
        state.model_of(body)
        ids = state.prompt_ids(body, chat="messages" in body)
    except ApiError as exc:
        return exc.response()
    return JSONResponse({"count": len(ids), "max_model_len": state.config.max_model_len, "tokens": ids})


async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def _generate(request: Request, chat: bool) -> Response:
    state = _state(request)
    engine = state.engine
    max_len = state.config.max_model_len
    arrival = engine.vclock()
    if (denied := state.denied(request)) is not None:
        return denied
    try:
        body = await _read_body(request)
        model = state.model_of(body)
        ids = state.prompt_ids(body, chat)
        if len(ids) >= max_len:
            raise ApiError(400, f"This model's maximum context length is {max_len} tokens. However, "
                           f"your prompt contains {len(ids)} input tokens. Please reduce the length of "
                           "the input prompt.", "BadRequestError")
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        if requested is None:
            requested = max_len - len(ids) if chat else 16
        if not isinstance(requested, int) or requested < 1:
            raise ApiError(400, "max_tokens must be a positive integer", "BadRequestError", "max_tokens")
        max_tokens = min(requested, max_len - len(ids))  # vLLM clamps silently
        if engine.dead:
            raise ApiError(500, ENGINE_DEAD, "InternalServerError")
        stream = engine.submit(ids, max_tokens, bool(body.get("ignore_eos", False)), arrival)
    except ApiError as exc:
        return exc.response()
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    shape = ResponseShape(chat, model, len(ids), stream.key, stream.sim.request_id)
    if body.get("stream"):
        return StreamingResponse(sse(engine, stream, shape, include_usage), media_type="text/event-stream")
    return await whole(engine, stream, shape)


async def sim_requests(request: Request) -> Response:
    """The simulator's own record of recent requests, in simulated seconds, keyed by the id the
    response carries: what the engine scheduled, for checking what a client measured."""
    state = _state(request)
    return JSONResponse({"speedup": state.config.sim.speedup, "requests": list(state.engine.finished_log)})


ROUTES = [
    Route("/health", health), Route("/ping", health), Route("/version", version),
    Route("/v1/models", models), Route("/metrics", metrics),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/sim/requests", sim_requests),
]


def build_app(config: EngineConfig, engine: SimEngine, started: float) -> Starlette:
    app = Starlette(routes=ROUTES)
    app.state.sim = ApiState(config, engine, started)
    return app

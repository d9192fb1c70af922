"""pluggy hook specifications.

Two kinds of hooks:

- **registration** (``specframe_register_proposers``, ``specframe_register_verifiers``,
  ``specframe_register_merge_policies``, ``specframe_register_routers``,
  ``specframe_register_constraint_engines``, ``specframe_register_tool_parsers``,
  ``specframe_register_reasoning_parsers``): called once when a
  :class:`specframe.registry.Registry` is built; the decode loop then calls the registered classes' methods
  directly, never a hook.
- **observation** (``specframe_observe_step``, ``specframe_observe_request``): events for metrics or logging
  plugins. When no installed plugin implements them, the decode loop makes no hook call and builds no event
  (checked once per request, see :mod:`specframe.decode.observe`).

A plugin is a module or object with functions marked ``@specframe.hookimpl``, found through the package
entry-point group ``specframe`` (built-in plugins use the same group). An installed plugin with a misspelt hook
name, a hook that raises or a class that breaks the contract is left out when the registry is built, listed with
its error by ``specframe plugins``; one registered directly (``build_registry(extra_plugins=...)``) raises
``PluginContractError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import pluggy

if TYPE_CHECKING:
    from .decode.observe import RequestEvent, StepEvent

PROJECT = "specframe"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def specframe_register_proposers(register: Callable[[type], None]) -> None:
    """Register the proposer classes this plugin provides.

    :param register: call ``register(cls)`` once per class. ``cls.name`` is the name used in config and on
        the command line, ``cls.Config`` its pydantic config model (a subclass of
        :class:`specframe.ProposerConfig`, ``extra="forbid"``); the capability flags ``needs_hidden_states``,
        ``produces_trees`` and ``provides_draft_probs`` are ``bool`` class attributes (see
        :class:`specframe.Proposer`).

    Dispatch: every implementation is called (not firstresult); return values are ignored.
    When called: once, when a :class:`specframe.registry.Registry` is built. A name registered by two plugins
    raises :class:`specframe.errors.DuplicateRegistrationError` naming both distributions when it is used; a
    class that breaks the contract leaves the plugin out with a :class:`specframe.errors.PluginContractError`
    message naming the plugin and the fix (raised at once for a plugin passed in ``extra_plugins``).
    """


@hookspec
def specframe_register_verifiers(register: Callable[[type], None]) -> None:
    """Register the verifier classes this plugin provides.

    :param register: call ``register(cls)`` once per class; ``cls.name`` selects it (``verifier:`` in config),
        ``cls.supports_trees`` is a ``bool``, ``cls().verify(...)`` follows :class:`specframe.Verifier`.

    Dispatch: every implementation is called; return values are ignored.
    When called: once, when a registry is built. A duplicate name raises ``DuplicateRegistrationError`` when used.
    """


@hookspec
def specframe_register_merge_policies(register: Callable[[type], None]) -> None:
    """Register merge policy classes: how several combined proposers' drafts share one verification tree.

    :param register: call ``register(cls)`` once per class. ``cls.name`` selects it (``merge: {name: NAME}`` in
        config), ``cls.Config`` is its pydantic config model (a subclass of
        :class:`specframe.contracts.combining.MergePolicyConfig`, which holds ``name`` and ``max_nodes``;
        ``extra="forbid"``); ``cls(config, target_info)`` follows :class:`specframe.contracts.combining.MergePolicy`:
        ``plan(drafts, max_nodes)`` returns ``(proposer index, quota)`` pairs in insertion order, and
        ``start``/``on_step`` receive the proposer labels and each step's
        :class:`specframe.contracts.combining.StepReport`. The merge itself, with its exactness rules, is core
        (:func:`specframe.decode.merged_tree.merge_drafts`): a policy cannot break exactness, only spend the budget well or
        badly.

    Dispatch: every implementation is called; return values are ignored.
    When called: once, when a registry is built. A duplicate name raises ``DuplicateRegistrationError`` when used;
    a class that breaks the contract leaves the plugin out (see :func:`specframe_register_proposers`).
    """


@hookspec
def specframe_register_routers(register: Callable[[type], None]) -> None:
    """Register router classes: which combined proposers run each step, and with what node budget.

    :param register: call ``register(cls)`` once per class. ``cls.name`` selects it (``router: NAME`` or
        ``router: {name: NAME, ...}`` in config; ``none`` is reserved for "no router"), ``cls.Config`` is its
        pydantic config model (a subclass of :class:`specframe.contracts.combining.RouterConfig`, ``extra="forbid"``);
        ``cls(config, target_info)`` follows :class:`specframe.contracts.combining.Router`: ``start(labels, seed, greedy)``,
        ``route(budget, max_nodes, available)`` -> node budget per proposer (0 = skip), ``revise(...)``,
        ``on_step(report)``, ``on_batch(rows, width)`` (subclass :class:`specframe.RouterBase` for no-op defaults).
        Routing cannot change the output's distribution; to keep sampled output reproducible under a seed, a
        router decides from the seed and feedback counts only (no global RNG, not the request's generator, no
        wall-clock timings unless ``greedy``).

    Dispatch: every implementation is called; return values are ignored.
    When called: once, when a registry is built. A duplicate name raises ``DuplicateRegistrationError`` when used;
    a class that breaks the contract leaves the plugin out (see :func:`specframe_register_proposers`).
    """


@hookspec
def specframe_register_constraint_engines(register: Callable[[type], None]) -> None:
    """Register the constraint engine classes this plugin provides (structured output: JSON schema, regex, grammar).

    :param register: call ``register(cls)`` once per class; ``cls.name`` selects it (``constraint_engine:`` in
        config), ``cls(tokenizer, vocab_size, eos_token_ids).compile(spec)`` returns one request's constraint
        (:class:`specframe.contracts.constraint.ConstraintEngine`, :class:`~specframe.contracts.constraint.Constraint`).

    Dispatch: every implementation is called; return values are ignored.
    When called: once, when a registry is built. A duplicate name raises ``DuplicateRegistrationError`` when used.
    """


@hookspec
def specframe_register_tool_parsers(register: Callable[[type], None]) -> None:
    """Register tool-call parser classes: a model family's tool-call text -> OpenAI ``tool_calls``.

    :param register: call ``register(cls)`` once per class. ``cls.name`` selects it (``--tool-call-parser NAME``;
        vLLM's parser name where vLLM has the format), ``cls`` subclasses
        :class:`specframe.contracts.tool_parsing.ToolParser` (importable from :mod:`specframe.services`): ``trigger``
        (the text opening a call, or None), ``end``, ``priority`` (detection order), ``detect(chat_template)``,
        ``parse(text) -> (content, calls)``, ``streaming()``, ``call_grammar(tools)``. Text in, text out: a parser
        never sees tokens, and never raises on model output (a malformed call stays in the content).

    Dispatch: every implementation is called; return values are ignored.
    When called: once, when a registry is built. A duplicate name raises ``DuplicateRegistrationError`` when used;
    a class that breaks the contract leaves the plugin out (see :func:`specframe_register_proposers`).
    """


@hookspec
def specframe_register_reasoning_parsers(register: Callable[[type], None]) -> None:
    """Register reasoning parser classes: a reasoning model's thinking (``<think>...</think>``, gpt-oss's analysis
    channel) returned apart from its answer (``reasoning_content``).

    :param register: call ``register(cls)`` once per class. ``cls.name`` selects it (``--reasoning-parser NAME``),
        ``cls`` subclasses :class:`specframe.contracts.reasoning.ReasoningParser` (importable from
        :mod:`specframe.services`): ``start``, ``end``, ``starts_inside``, ``priority``, ``detect(chat_template)``,
        ``split(text) -> (reasoning, content)``, ``streaming()``.

    Dispatch: every implementation is called; return values are ignored.
    When called: once, when a registry is built. A duplicate name raises ``DuplicateRegistrationError`` when used;
    a class that breaks the contract leaves the plugin out (see :func:`specframe_register_proposers`).
    """


@hookspec
def specframe_observe_step(event: "StepEvent") -> None:
    """Observe one verification step (drafted, accepted and committed counts, per proposer).

    :param event: a frozen :class:`specframe.decode.observe.StepEvent` — ``request_id``, ``step``, ``proposer``,
        ``drafted`` (nodes the target verified), ``accepted``, ``committed`` (token ids), ``faults``,
        ``finished``, ``attribution`` (one :class:`specframe.contracts.combining.ProposerStep` per proposer: drafted,
        accepted (credited), wasted nodes, draft time).

    Dispatch: every implementation is called as a plain function, newest registration last; return values are
    ignored. An implementation that raises is dropped for the rest of the request with one warning.
    When called: after each verification step, in the decode loop — keep it cheap (append to a list, bump a
    counter). Never called when no plugin implements an observer hook.
    """


@hookspec
def specframe_observe_request(event: "RequestEvent") -> None:
    """Observe one finished request.

    :param event: a frozen :class:`specframe.decode.observe.RequestEvent` — ``request_id``, ``proposers``,
        ``prompt_tokens``, ``token_ids`` (generated), ``finish_reason``, ``metrics`` (the ``--json`` metrics dict).

    Dispatch: every implementation is called as a plain function; return values are ignored; one that raises is
    dropped with one warning.
    When called: once per request generated through :func:`specframe.load`'s ``generate``, after the last step.
    """

"""specframe's error hierarchy.

Every error a user can cause derives from :class:`SpecframeError`; the CLI prints its message on one line and
exits with code 2. Messages say what to fix.
"""

from __future__ import annotations

__all__ = [  # the error classes (first_line is a helper of the package's own)
    "SpecframeError",
    "ConfigError",
    "UnknownModelError",
    "ModelNotInstalledError",
    "UnknownNameError",
    "UnknownProposerError",
    "UnknownVerifierError",
    "UnknownMergePolicyError",
    "UnknownRouterError",
    "UnknownConstraintEngineError",
    "UnknownToolParserError",
    "UnknownReasoningParserError",
    "PluginError",
    "PluginLoadError",
    "PluginContractError",
    "DuplicateRegistrationError",
    "CacheError",
    "PromptTooLongError",
    "PromptsFileError",
    "DeviceError",
    "DraftError",
    "ProposerTimeoutError",
    "TraceError",
    "ConstraintError",
]


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (empty when it has none): what a one-line error quotes of a cause."""
    return (str(exc).strip().splitlines() or [""])[0]


class SpecframeError(Exception):
    """Base class of every error specframe raises on purpose."""


class ConfigError(SpecframeError, ValueError):
    """A configuration value or flag is out of range or malformed."""


class UnknownModelError(SpecframeError, KeyError):
    """A model name is neither built in nor a path that exists."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ModelNotInstalledError(SpecframeError):
    """A built-in model's weight package is not installed; the message gives the pip command."""


class UnknownNameError(SpecframeError, KeyError):
    """No installed plugin provides a component of that kind and name; the message names the kind and lists the
    installed ones. Catch this to handle any kind; each kind has its own subclass below."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownProposerError(UnknownNameError):
    """No installed plugin provides a proposer of that name."""


class UnknownVerifierError(UnknownNameError):
    """No installed plugin provides a verifier of that name."""


class UnknownMergePolicyError(UnknownNameError):
    """No installed plugin provides a merge policy of that name."""


class UnknownRouterError(UnknownNameError):
    """No installed plugin provides a router of that name."""


class UnknownConstraintEngineError(UnknownNameError):
    """No installed plugin provides a constraint engine of that name."""


class UnknownToolParserError(UnknownNameError):
    """No installed plugin provides a tool-call parser of that name."""


class UnknownReasoningParserError(UnknownNameError):
    """No installed plugin provides a reasoning parser of that name."""


class PluginError(SpecframeError):
    """An installed plugin cannot be used; the message names the plugin, its distribution and the fix."""


class PluginLoadError(PluginError):
    """A plugin's entry point failed to import, or ``SPECFRAME_PLUGINS`` names a plugin that is not installed."""


class PluginContractError(PluginError):
    """A plugin implements an unknown hook or registers a class that breaks the proposer/verifier contract."""


class DuplicateRegistrationError(PluginError):
    """Two plugins registered the same proposer or verifier name (the message names both distributions)."""


class CacheError(ConfigError):
    """specframe's cache (``$SPECFRAME_CACHE``) cannot be written: not a folder, no space left, no permission; the
    message names the cache, the cause and the fix (the user's to fix, like a bad setting)."""


class PromptTooLongError(SpecframeError, ValueError):
    """The encoded prompt does not fit in the target's context window."""


class PromptsFileError(SpecframeError, ValueError):
    """A prompts file is missing, empty or malformed; the message names the file and line."""


class DeviceError(SpecframeError, RuntimeError):
    """The target's device failed a verification forward: out of device memory, or tensors on two devices. Never
    treated as a refused draft (which would silently turn speculation off): the request stops with this error."""


class DraftError(SpecframeError, ValueError):
    """A proposer returned a draft that breaks the contract (shape, dtype, ids, probabilities, order)."""


class ProposerTimeoutError(SpecframeError):
    """A proposer's ``propose`` call took longer than the isolation policy's time limit."""


class TraceError(SpecframeError, ValueError):
    """A recorded trace cannot be used: missing, truncated or altered files, another format version, or a trace made
    with another model or dtype than asked for; the message names the file and the fix."""


class ConstraintError(ConfigError):
    """A constraint (JSON schema, regex, grammar) is invalid, unsupported by the constraint engine, or cannot be used
    with this model; the message says what to fix."""

"""User-facing errors.

Every mistake a user can make (unknown model, empty prompt, malformed request, ...) raises an
`OilbirdError` whose message says what was wrong and what to do. The CLI prints the message and
exits with a non-zero code, without a traceback; library users catch `OilbirdError`.
"""

from __future__ import annotations


class OilbirdError(Exception):
    """Base class of errors caused by the user's input or environment, not by a bug."""


class ModelError(OilbirdError):
    """A model could not be found, fetched, verified or loaded."""


class DatasetError(OilbirdError):
    """A dataset name, file or record is invalid."""


class PromptError(OilbirdError):
    """A prompt is empty or does not fit the model's context."""


class ConfigError(OilbirdError):
    """A configuration value or command-line option is invalid."""

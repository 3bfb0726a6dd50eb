"""The two names the rewriter needs from onnxscript's rewriter that its public modules do not
export (onnxscript 0.5-0.7): the exception a rule's check raises to decline a match with its
reason (and ``fail``, which raises it), and the metadata key under which a rewrite tags the nodes
it wrote. Imported here only, so that an onnxscript release that moves them breaks one line."""

from typing import NoReturn

from onnxscript.rewriter._basics import MatchFailureError
from onnxscript.rewriter._rewrite_rule import RULE_NAME_TAG

__all__ = ["MatchFailureError", "RULE_NAME_TAG", "as_failure", "fail"]


def fail(reason: str) -> NoReturn:
    """Decline the match being checked, with ``reason`` (it reaches the report)."""
    raise MatchFailureError(reason)


def as_failure(error: Exception) -> MatchFailureError:
    """A check's exception as a decline; anything but a MatchFailureError is a bug, reported."""
    if isinstance(error, MatchFailureError):
        return error
    return MatchFailureError(f"internal error in the check ({type(error).__name__}: {error})")

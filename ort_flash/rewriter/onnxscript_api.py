"""What the rules take from onnxscript's rewriter beyond ``onnxscript.rewriter.pattern``, and how
a rule declines a match with its reason. Public onnxscript names only (checked against 0.7.2):

- ``RULE_NAME_TAG``: the metadata key under which a rewrite tags the nodes it wrote (the pipeline
  removes it from the output). ``onnxscript.rewriter`` exports it since 0.5.7, the first release
  that has it at all.
- ``MatchFailureError`` and ``fail``: a check declines by raising ``fail(reason)`` from anywhere
  in its helpers. onnxscript's own exception of that name lives in a private module
  (``onnxscript.rewriter._basics``) that no public module exports; its public way to decline is a
  failed ``pattern.MatchResult``. So the exception is ort_flash's own, and each rule's ``check``
  (``refinements.base.Refinement``, ``fusions.node_rule.NodeRule``,
  ``fusions.matmul_softmax_attention``) catches every exception, turns it into a reason with
  ``as_failure`` and returns ``pattern.MatchResult().fail(reason, node)``. Nothing raises it
  outside a check: a rule's ``rewrite`` follows the plan its check made.
"""

from typing import NoReturn

from onnxscript.rewriter import RULE_NAME_TAG

__all__ = ["MatchFailureError", "RULE_NAME_TAG", "as_failure", "fail"]


class MatchFailureError(Exception):
    """A rule's check declines the match; ``reason`` reaches the report."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


def fail(reason: str) -> NoReturn:
    """Decline the match being checked, with ``reason`` (it reaches the report)."""
    raise MatchFailureError(reason)


def as_failure(error: Exception) -> MatchFailureError:
    """A check's exception as a decline; anything but a MatchFailureError is a bug, reported."""
    if isinstance(error, MatchFailureError):
        return error
    return MatchFailureError(f"internal error in the check ({type(error).__name__}: {error})")

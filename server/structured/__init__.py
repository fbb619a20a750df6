"""Structured outputs and tool calls: a request's constraint (spec.py), compiled per model into a grammar matcher
whose token mask is applied to each step's logits (matcher.py), and OpenAI tool calling in Hermes' format
(tools.py, hermes.py). llguidance does the matching; nothing here imports torch."""
from .spec import Constraint, check_constraint, constraint_of
from .row import TokenConstraint

__all__ = ["Constraint", "TokenConstraint", "check_constraint", "constraint_of"]

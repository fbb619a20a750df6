"""A zero-shot classification request and its result (the computation: server/encoders/zero_shot.py).

Every door (the task API's ZeroShotClassify, HTTP /v1/zero-shot-classification) builds one ZeroShotRequest;
building it checks what needs no model: texts and candidate labels present and strings, the hypothesis template
one that formats a label as transformers' pipeline formats it.
"""
from __future__ import annotations

import string
from dataclasses import dataclass

from protos.results import ZeroShotClassification
from server.protocol.errors import ServingError

DEFAULT_TEMPLATE = "This example is {}."   # transformers' ZeroShotClassificationPipeline default
TEMPLATE_CHARS = 1000                      # a hypothesis template is a sentence, not a document


@dataclass(frozen=True)
class ZeroShotRequest:
    texts: list[str]
    candidate_labels: list[str]
    hypothesis_template: str = DEFAULT_TEMPLATE
    multi_label: bool = False
    truncate: bool = False
    texts_field: str = "texts"    # the request's name for its texts, in refusals ("inputs" on HTTP)

    @classmethod
    def build(cls, texts: object, candidate_labels: object, hypothesis_template: str | None = None,
              multi_label: bool = False, truncate: bool = False, texts_field: str = "texts") -> "ZeroShotRequest":
        """Checked request; candidate_labels may be one comma-separated string, split as the pipeline splits it.
        INVALID_ARGUMENT naming the field otherwise."""
        items = [texts] if isinstance(texts, str) else texts
        if not isinstance(items, list) or not items:
            raise ServingError.invalid(texts_field, "must hold at least one text")
        for i, text in enumerate(items):
            if not isinstance(text, str):
                raise ServingError.invalid(f"{texts_field}[{i}]", "must be a string")
        labels = candidate_labels
        if isinstance(labels, str):
            labels = [label.strip() for label in labels.split(",") if label.strip()]
        if not isinstance(labels, list) or not labels:
            raise ServingError.invalid("candidate_labels", "must hold at least one label")
        for i, label in enumerate(labels):
            if not isinstance(label, str) or not label.strip():
                raise ServingError.invalid(f"candidate_labels[{i}]", "must be a label that is not empty")
        template = DEFAULT_TEMPLATE if hypothesis_template in (None, "") else hypothesis_template
        check_template(template, labels[0])
        return cls(list(items), list(labels), template, bool(multi_label), bool(truncate), texts_field)

    def hypotheses(self) -> list[str]:
        return [self.hypothesis_template.format(label) for label in self.candidate_labels]


def check_template(template: object, first_label: str) -> None:
    """The template takes the label as the pipeline's str.format does, in one `{}` (or `{0}` fields); attribute or
    index lookups (`{0.__class__}`) and format specs are refused: a client's template must not reach objects. As
    the pipeline, a template that the first label leaves unchanged is refused."""
    field = "hypothesis_template"
    if not isinstance(template, str):
        raise ServingError.invalid(field, "must be a string")
    if len(template) > TEMPLATE_CHARS:
        raise ServingError.invalid(field, f"{len(template)} characters exceed {TEMPLATE_CHARS}")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ServingError.invalid(field, f"is not a format string ({exc})") from None
    fields = [(name, spec, conversion) for _, name, spec, conversion in parts if name is not None]
    names = {name for name, _, _ in fields}
    plain = all(not spec and not conversion for _, spec, conversion in fields)
    if not fields or not plain or not (names == {"0"} or (names == {""} and len(fields) == 1)):
        raise ServingError.invalid(field, "must hold exactly one {} where the label goes, e.g. "
                                          f"{DEFAULT_TEMPLATE!r}, got {template[:80]!r}")
    if template.format(first_label) == template:
        raise ServingError.invalid(field, f"{template[:80]!r} is not changed by the label")


@dataclass(frozen=True)
class ZeroShotResult:
    model: str
    version: int
    results: list[ZeroShotClassification]   # one per text, in order
    tokens: int                              # tokens the model ran (special tokens included)


__all__ = ["DEFAULT_TEMPLATE", "ZeroShotRequest", "ZeroShotResult", "check_template"]

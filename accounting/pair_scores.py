"""HAMi's GPU pair scores: how well two NVIDIA cards of a node are connected, which the
``topology-aware`` GPU policy chooses cards by (``accounting.vendor_fit.topology``).

Layer: accounting (pure). Two forms:

* the node annotation ``hami.io/node-nvidia-score`` HAMi's device plugin writes: a JSON array
  of ``{"uuid": <card>, "score": {<other card>: <int>, ...}}``, read as HAMi's
  ``DecodePairScores`` reads it (``decode_pair_scores``);
* one card's scores as its ``custom_info`` keeps them (key ``PAIR_SCORES_INFO``): a JSON object
  of the node's other cards to their non-zero scores, keys sorted, no spaces
  (``encode_card_scores``; ``card_scores`` reads it back), so the scores travel with the
  inventory over the wire and through the journal as the other device facts do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from accounting import numbers
from accounting.errors import InvalidInputError, Violations
from accounting.limits import INT64_MAX, INT64_MIN
from accounting.mig import go_fields
from accounting.quoting import json_kind
from accounting.received_json import decode_json

CardScores = Mapping[str, int]
"""One card's score with each other card of its node (a card not listed scores 0)."""


def decode_pair_scores(value: str, path: str) -> dict[str, dict[str, int]]:
    """The annotation's scores per card UUID, as Go's ``json.Unmarshal`` fills HAMi's
    ``DevicePairScores``: keys in any case, ``null`` (the whole value, an entry, a card, a
    score) read as Go reads it (nothing, an empty entry, no card, 0), a later duplicate key
    overwriting an earlier one; an entry naming a card an earlier entry named is ignored (HAMi
    takes the first). A score is a whole JSON number within int64, as Go's ``int``.

    Raises:
        InvalidInputError: at ``path`` (and the offending entry), whatever Go's decoder
            refuses: text that is not JSON, a value that is not an array of objects, a UUID
            that is not a string, scores that are not an object of whole numbers within int64.
            HAMi's ``GetNodeDevices`` fails on the same text, so its node offers no NVIDIA
            device.
    """
    document = decode_json(value, path)
    if document is None:
        return {}
    if not isinstance(document, list):
        raise InvalidInputError.single(
            path, f"must be a JSON array of pair scores, got {json_kind(document)}"
        )
    found = Violations()
    scores: dict[str, dict[str, int]] = {}
    for index, entry in enumerate(document):
        at = f"{path}[{index}]"
        if entry is None:
            continue
        if not isinstance(entry, dict):
            found.add(at, f"must be an object, got {json_kind(entry)}")
            continue
        fields = go_fields(entry)
        uuid = fields.get("uuid")
        if uuid is not None and not isinstance(uuid, str):
            found.add(f"{at}.uuid", f"must be a string, got {json_kind(uuid)}")
            continue
        card = _card_scores(fields.get("score"), f"{at}.score", found)
        if card is not None and uuid is not None:
            scores.setdefault(uuid, card)
    found.raise_if_any()
    return scores


def _card_scores(value: object, path: str, found: Violations) -> dict[str, int] | None:
    if value is None:
        return {}
    if not isinstance(value, dict):
        found.add(path, f"must be an object of card UUIDs to scores, got {json_kind(value)}")
        return None
    card: dict[str, int] = {}
    for other, score in value.items():
        if score is None:
            card[other] = 0
        elif (
            isinstance(score, int)
            and not isinstance(score, bool)
            and INT64_MIN <= score <= INT64_MAX
        ):
            card[other] = score
        else:
            found.add(
                f"{path}[{json.dumps(other)}]",
                f"must be a whole number within int64, got {_shown(score)}",
            )
    return card


def _shown(value: object) -> str:
    """A number as written (cut short), anything else by its kind."""
    if json_kind(value) != "a number":
        return json_kind(value)
    text = str(value)
    return text if len(text) <= 40 else f"{text[:40]}..."


def encode_card_scores(scores: CardScores) -> str:
    """One card's scores in the form its ``custom_info`` keeps them: zeros left out (a card not
    listed scores 0), keys sorted."""
    kept = {other: score for other, score in sorted(scores.items()) if score}
    return json.dumps(kept, separators=(",", ":"), ensure_ascii=False)


def card_scores(text: str | None) -> dict[str, int]:
    """One card's scores read back from its ``custom_info``: none when absent; a value that
    does not read as an object of whole numbers (a typed inventory may come from any client)
    gives no scores, and an entry that is no whole number scores 0."""
    if not text:
        return {}
    try:
        listed = numbers.json_loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(listed, dict):
        return {}
    return {
        other: score
        for other, score in listed.items()
        if isinstance(score, int) and not isinstance(score, bool)
    }

"""The plan of many items answered from a memo (``Planner``): ``checks.plan_item``'s answer,
asked once per kind of item rather than once per item."""

from toolkit.forensics.checks import NOT_CHECKED, SUPERSEDED, UNCHECKED_WORDS, plan_item
from toolkit.forensics.model import Worded


# The kinds whose details ``plan_item`` reads beyond the kind (quoted, or searched for
# SUPERSEDED); a done_without_artifact one's says NOT_CHECKED, or not, by its words alone
# when it is ``Worded`` (``_not_checked``), quoted through the marker.
WORDS_READ = frozenset({"missing_history", "stale_input"})


class Planner:
    """``plan_item`` for many items, answered from a memo: ``plan_item``'s answer depends
    on the item's state, its failure (when text), the kinds found on it and, of their
    details, on three facts only: the ``missing_history`` detail (quoted), whether the
    ``stale_input`` one names ``SUPERSEDED``, and the ``done_without_artifact`` one
    (whether it says ``NOT_CHECKED``, and quoted whole in a ``verify`` why). That last
    one is planned with a marker in its place, so a million done items whose artifacts
    were not checked cost one ``plan_item`` call, not a million, and share one answer.

    ``planner.plan(item, found)``, ``found`` a {kind: its first Anomaly} mapping or None
    (no findings), returns (action, why, marker): ``marker`` None, or the text in ``why``
    that stands for the detail of ``found["done_without_artifact"]`` (``model.Rows`` puts
    it back when the row is read)."""

    def __init__(self, lookup: bool = True):
        self.lookup, self.memo = lookup, {}

    def plan(self, item, found=None) -> tuple[str, str, str | None]:
        failure = item.failure
        if failure.__class__ is not str:
            failure = None
        if not found:
            memo_key = (item.state, failure)
            answer = self.memo.get(memo_key)
            if answer is None:
                answer = self.memo[memo_key] = (*plan_item(item, set(), self.lookup), None)
            return answer
        unchecked = found.get("done_without_artifact")
        history = found.get("missing_history")
        stale = found.get("stale_input")
        history = history if history is None else history.detail
        stale = stale if stale is None else stale.detail
        for text in (history, stale, unchecked and _words_of(unchecked)):
            if text is not None and text.__class__ is not str:
                return (*plan_item(item, {kind: anomaly.detail for kind, anomaly
                                          in found.items()}, self.lookup), None)
        # the kinds in the order found (a fixed order per set: a miss at worst, never wrong)
        not_checked = unchecked is not None and _not_checked(unchecked)
        memo_key = (item.state, failure, tuple(found), history,
                    stale is not None and SUPERSEDED in stale, not_checked)
        answer = self.memo.get(memo_key)
        if answer is None:
            standing = dict.fromkeys(found, "")  # each detail by the facts plan_item reads
            if history is not None:
                standing["missing_history"] = history
            if memo_key[4]:
                standing["stale_input"] = SUPERSEDED
            marker = None
            if unchecked is not None:
                marker = standing["done_without_artifact"] = _marker(not_checked)
            action, why = plan_item(item, standing, self.lookup)
            answer = self.memo[memo_key] = (action, why, marker if marker and marker in why
                                            else None)
        return answer


def _words_of(anomaly):
    """The detail's type without wording it: a ``Worded`` one is always text."""
    return "" if type(anomaly) is Worded else anomaly.detail


def _not_checked(anomaly) -> bool:
    if type(anomaly) is Worded:
        return anomaly.words in UNCHECKED_WORDS
    return NOT_CHECKED in anomaly.detail


_MARKERS = ("\0\0", f"\0{NOT_CHECKED}\0")


def _marker(not_checked: bool) -> str:
    """A stand-in ``done_without_artifact`` detail no plan's words contain (NULs) that
    says ``NOT_CHECKED`` or not, as the detail it stands for."""
    return _MARKERS[not_checked]

"""Whether a drill applies to a pipeline, and whether its fault really fired.

A verdict is evidence only if the fault it names happened. A pipeline that
never calls ``self.hook("after_submit", ...)`` cannot lose a reply there, so
its "valid" under ``lost-reply`` would prove nothing: that row is
``inconclusive`` with the fault named, and it is never counted as passed.
A drill whose scenario the pipeline cannot enter (page-by-page resume for a
pipeline that sends whole documents) is ``n/a`` with its reason.
"""

from toolkit.drills.service import SERVICE_FAULTS

# Faults of the environment that only matter to a pipeline that uses the seam:
# a pipeline that never looks a key up never meets an unavailable lookup, and
# that is a design choice the checker judges, not a drill that did not happen.
OPTIONAL_FAULTS = frozenset({"lookup_unavailable"})
RACE = "race"  # two workers met at the same item's intent
CANCEL = "operator_cancel"


def not_applicable(drill, cls) -> str | None:
    """Why ``drill`` cannot run with the strategy class ``cls``, or None when it can."""
    if drill.page_by_page_from is not None and not getattr(cls, "sends_pages", False):
        return (f"{cls.__qualname__} sends whole documents (sends_pages = False): "
                "no page-by-page resume to drill")
    return None


def required_faults(drill) -> tuple[str, ...]:
    """The faults that must fire for the drill's verdict to mean anything."""
    required = [name for name in drill.faults if name not in OPTIONAL_FAULTS]
    required += [name for name in drill.service_faults if name in SERVICE_FAULTS]
    if drill.workers > 1:
        required.append(RACE)
    if drill.cancel_after_first_run:
        required.append(CANCEL)
    return tuple(dict.fromkeys(required))


def missing_faults(drill, fired) -> tuple[str, ...]:
    """The required faults of ``drill`` that never fired, given ``fired`` (run, name, detail)."""
    happened = {name for _, name, *_ in fired}
    return tuple(name for name in required_faults(drill) if name not in happened)


def service_shots(provider) -> list[tuple]:
    """The service faults that fired, as ``fired`` entries (the service counts them itself)."""
    counts = provider.faults_fired()
    names = {"slow_submits": "slow_submit", "cut_fetches": "cut_fetch"}
    return [(0, names[field], f"{n} time(s)") for field, n in counts.items() if n and field in names]


def settled_between_runs(drill, fired, verdict) -> str | None:
    """Why the between-runs cancel drill is ``n/a``, or None.

    The operator cancels an item still in flight *between* runs. A pipeline
    that waits for every job within its run leaves nothing in flight then:
    the scenario cannot be entered (not a fault that failed to fire), so the
    row is ``n/a`` with this reason rather than a permanent ``inconclusive``.
    An anomaly found anyway still stands (the row is then not ``n/a``).
    """
    happened = {name for _, name, *_ in fired}
    if (drill.cancel_after_first_run and CANCEL not in happened
            and "nothing_in_flight" in happened and verdict.valid is not False):
        return ("every item was at rest when run 1 ended (the pipeline waits for its jobs "
                "within a run): nothing in flight for the operator to cancel")
    return None

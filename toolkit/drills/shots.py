"""Shots: what happened to a drill's run outside its ledger, placed among the ledger steps.

A fault that fires, a second worker meeting the first, the operator cancelling:
each becomes a ``Shot`` the moment it happens, carrying how many ledger steps
were recorded by then and the provider's job table at that instant, so a
stepper can show it as a frame of its own, in order.
"""

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Shot:
    """Something that happened to the run rather than in its ledger (a fault fired, a
    second worker met, the operator cancelled): ``after`` ledger steps had been
    recorded then, and the provider stood at ``jobs``/``submit_calls``/``executions``."""

    run: int
    name: str
    key: object
    after: int
    jobs: tuple
    submit_calls: int
    executions: int


class _Fired(list):
    """``fired``, where every ``append`` also records the moment as a ``Shot`` (in ``shots``)."""

    def __init__(self, steps, provider):
        super().__init__()
        self.steps, self.provider, self.shots = steps, provider, []

    def append(self, shot):
        super().append(shot)
        self.shots.append(_shot(self.steps, self.provider, *shot))


def _shot(steps, provider, run, name, key):
    stats = provider.stats()
    return Shot(run, name, key, len(steps), tuple(provider.jobs()), stats["submit_calls"],
                stats["executions"])


def _watched(injector, run, steps, provider, shots):
    """``injector`` as a hook that records a ``Shot`` the moment one of its faults fires
    (before the fault acts: a crash or a timeout raises out of this call)."""
    def hook(point, key, **context):
        before = len(injector.fired)
        try:
            injector(point, key, **context)
        finally:
            shots.extend(_shot(steps, provider, run, name, shot_key)
                         for name, shot_key in injector.fired[before:])
    return hook


def _watched_later(steps, provider, fired):
    return lambda injector: _watched(injector, 0, steps, provider, fired.shots)

"""What an episode may say of itself: its outcome frame checked and bounded before the zygote
sends it on (sandbox/zygote.py). An episode's frame is the policy's output: a forged id, status,
signal or log must not reach the run's records, and its text reaches consoles, so no control
character passes."""

from __future__ import annotations

import re

from areal.agent.failures import BASES_LIMIT, CLASSES, RAISED_LIMIT
from areal.protocol import EpisodeOutcome

AGENT_STATUSES = ("ok", "error")  # what an episode may report of itself; the others are the zygote's verdicts
ERROR_LIMIT = 64 << 10  # characters of an episode's own error text kept, from its head (the run's records keep less)
CAUSE_LIMIT = 200
IMPORTED_LIMIT = 20  # as many as sandbox/episode.py's run_time_imports reports
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}(\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,15}")  # a dotted module name
QUALIFIED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.<>]{0,199}")  # an exception class's (``<locals>`` in a function's)
CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def episode_says(reported: EpisodeOutcome, verdict: EpisodeOutcome) -> EpisodeOutcome:
    """The outcome of an episode that sent its own: what an episode may say of itself (ok or
    error, its rewards, its error text, its failure class and the names of the exceptions it
    raised, the packages it imported), each bounded and made printable; the rest is the zygote's
    ``verdict`` (id, exit code and signal, wall time; the log tail is attached by the zygote
    afterwards). An episode's frame is the policy's
    output: a forged id, status, signal or a log of its own must not reach the run's records."""
    status, error = reported.status, reported.error
    if status not in AGENT_STATUSES:
        error = f"the episode reported status {printable(status[:40])!r}, which only the sandbox decides; {error}"
        status = "error"
    if len(error) > ERROR_LIMIT:
        error = f"{error[:ERROR_LIMIT]}... ({len(error) - ERROR_LIMIT} more characters)"
    return EpisodeOutcome(
        verdict.episode_id,
        status,
        reward=reported.reward,
        rewards_by_id=reported.rewards_by_id,
        error=printable(error),
        exit_signal=verdict.exit_signal,
        exit_code=verdict.exit_code,
        wall_s=verdict.wall_s,
        failure_class=reported.failure_class if reported.failure_class in CLASSES else "",
        failure_cause=printable(reported.failure_cause[:CAUSE_LIMIT]),
        imported=[m for m in reported.imported[:IMPORTED_LIMIT] if MODULE_NAME.fullmatch(m)],
        raised=[[n for n in names[:BASES_LIMIT] if QUALIFIED_NAME.fullmatch(n)] for names in reported.raised[:RAISED_LIMIT]],
        # a branched episode's (sandbox/branch.py): each branch's word checked as its own, under an id the sandbox gives
        branches=[
            episode_says(b, EpisodeOutcome(f"{verdict.episode_id}/b{i}", "ok", wall_s=b.wall_s))
            for i, b in enumerate(reported.branches[:16])
        ],
        branch_point=printable(reported.branch_point[:CAUSE_LIMIT]),
        branch_refused=printable(reported.branch_refused[:ERROR_LIMIT]),
    )


def printable(text: str) -> str:
    """``text`` without control characters but newline and tab: what an episode wrote reaches
    the console and the run's records, where a terminal escape would act, not show."""
    return CONTROL_CHARS.sub("\ufffd", text)

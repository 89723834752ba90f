"""An episode's outcome as the zygote sends it (sandbox/zygote.py): the zygote's own verdict from
what it saw (``verdict``), completed in the reporter by what the episode sent back
(``read_back``), of which only what an episode may say of itself is taken (``episode_says``).
An episode's frame is the policy's output: a forged id, status, signal or log must not reach the
run's records, and its text reaches consoles, so no control character passes."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import msgspec

from areal.agent.failures import BASES_LIMIT, CLASSES, RAISED_LIMIT
from areal.process import log_tail
from areal.protocol import FRAME_HEADER, EpisodeOutcome
from sandbox import isolation, keys, world

RESULT_LIMIT = 16 << 20  # result bytes kept per episode; an agent cannot make the zygote buffer without bound

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


def verdict(slot: Any, status: int, memory_limit_bytes: int) -> EpisodeOutcome:
    """The zygote's verdict on a reaped episode (a zygote ``_Slot``) from what it saw: the
    deadline, the signal or exit code, a result frame or not (``slot.has_result`` set if one came)."""
    eid, wall = slot.spawn.episode_id, time.monotonic() - slot.started
    if slot.timed_out:
        return EpisodeOutcome(
            eid, "timeout", wall_s=wall, error=f"deadline of {slot.spawn.deadline_s}s passed; the episode's processes were killed"
        )
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGKILL and isolation.oom_killed(slot.res):
            return EpisodeOutcome(
                eid, "oom", exit_signal=sig, wall_s=wall, error=f"killed by the memory limit ({memory_limit_bytes} bytes)"
            )
        return EpisodeOutcome(eid, "crashed", exit_signal=sig, wall_s=wall, error=f"agent died by signal {signal.Signals(sig).name}")
    code = os.waitstatus_to_exitcode(status)
    if slot.result.end > 4:
        slot.has_result = True
        return EpisodeOutcome(eid, "crashed", exit_code=code, wall_s=wall, error="the agent's result frame was not read")
    return EpisodeOutcome(eid, "crashed", exit_code=code, wall_s=wall, error=f"agent exited with code {code} without reporting a result")


def read_back(slot: Any, decoder: msgspec.msgpack.Decoder, log_tail_bytes: int) -> EpisodeOutcome:
    """In the reporter: a slot's verdict, or the agent's own outcome if it reported one that
    decodes (``episode_says``), with its world's grades; a failed one gets the log tail (session
    keys masked), an ok one loses its log."""
    outcome = slot.outcome
    assert outcome is not None
    if slot.has_result:
        frames = slot.result.frames()
        try:
            if not frames:
                buf, start = slot.result.buf, slot.result.start
                declared = FRAME_HEADER.unpack_from(buf, start)[0] if slot.result.end - start >= 4 else 0
                if declared + 4 > RESULT_LIMIT:
                    raise msgspec.DecodeError(
                        f"the agent's result is {declared} bytes, over the limit of {RESULT_LIMIT} bytes a result may have"
                    )
                raise msgspec.DecodeError(f"{slot.result.end} bytes, not a whole frame")
            reported = decoder.decode(frames[0])
        except msgspec.DecodeError as e:  # the agent process wrote garbage into its pipe
            outcome = msgspec.structs.replace(outcome, error=f"bad result frame: {e}")
        else:
            outcome = episode_says(reported, outcome)
    if slot.world is not None and slot.grade is not None:
        b = slot.branching
        if b.kept or b.tampered:  # a branch point: each branch's grade (graded or not); none of the trunk's
            grades = [b.grades.get(i, slot.grade) for i in range(len(b.kept))]  # the zygote's own, when it shut down first
            outcome = world.apply_branch_grades(outcome, grades, slot.world, b.seen, b.tampered)
        else:
            outcome = world.apply_grade(outcome, slot.grade, slot.world, [*(b.trunk_seen or []), *slot.seen])
    if outcome.status == "ok":
        os.unlink(slot.log_path)  # keep logs of failed episodes only
        return outcome
    # Apart from the reason, so that a long log never pushes the reason out of the record.
    tail = printable(keys.SESSION_KEY.sub("<session key>", log_tail(slot.log_path, log_tail_bytes)))
    return msgspec.structs.replace(outcome, log_tail=f"--- {slot.log_path} ---\n{tail}" if tail else "")

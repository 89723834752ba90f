"""Multi-turn prompt building against history length: CPU per turn, incremental vs full re-render.

The gateway builds each turn's prompt by appending the new messages' tokens to the parent's
recorded prompt + sampled tokens (``areal.gateway.render.PromptBuilder``); the baseline renders
and tokenises the whole history every turn, as AReaL does, but with the gateway's own renderer
and encoder (``PromptBuilder.full``: its cached pieces and words make the 200-turn re-render
~3.5x cheaper than through the tokenizer's own encode, so the ratio understates the gain over
AReaL's ``apply_chat_template`` path). ``benchmarks/gateway.py`` reports one point (a 200-turn
episode, its issue's target); this module reuses the same measurement
(``benchmarks.gateway.prompt_building_rows``, CPU time via ``time.process_time``, least of
``REPEATS`` interleaved runs) for episodes of several lengths, and reports the mean CPU per turn of
each: the re-render grows linearly with the history (so its episode is quadratic); the incremental
cost grows only through the C-speed history encode, the copy of the parent's ids and the GC walks
over those lists (see ``areal/gateway/render.py``). ``benchmarks/report.py`` draws the curve
(``prompt_building_per_turn.png``).

Covered: the template render + tokenisation cost of building prompts, one session, one process.
Not covered: engine time, the network, several sessions at once (``benchmarks/gateway.py``).

    python -m benchmarks.run prompt_building [--quick]
"""

from __future__ import annotations

import sys

from benchmarks.gateway import prompt_building_rows

QUICK_TURNS = (25, 50, 100, 200)
FULL_TURNS = (10, 25, 50, 100, 200, 400)
REPEATS = 3  # CPU time on this shared machine varies run to run; the least is the code's own cost


def main(quick: bool) -> list[dict]:
    rows = []
    for turns in QUICK_TURNS if quick else FULL_TURNS:
        (r,) = prompt_building_rows(turns, repeats=REPEATS)  # one row: total ms CPU for the episode, both ways
        rows.append(
            {
                "benchmark": "prompt_building",
                "metric": f"prompt building per turn, {turns}-turn episode",
                "value": r["value"] / turns,
                "unit": "ms CPU/turn",
                "baseline": r["baseline"],
                "baseline_value": r["baseline_value"] / turns,
                "note": "mean CPU per turn over an episode of that many turns (history grows by one user message and one reply per turn)",
            }
        )
    return rows


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print(row)

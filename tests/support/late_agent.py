"""An agent for tests/e2e/test_staleness_bound.py that makes one group finish late, on purpose and
without timing: the first episode to start (it claims a marker file in ``$LATE_AGENT_RUN_DIR``)
makes its model call, then holds its reply until the run's trainer has logged step
``WAIT_FOR_STEP``. Its group's tokens are version 0, and it is published after the groups of two
later versions: under a bound of 1 the step that would train it starts too late for them."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

WAIT_FOR_STEP = 2
MARKER = "late-episode"  # holds the id of the episode that waited


def _logged_step(run_dir: Path) -> int:
    path = run_dir / "trainer_metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return max((json.loads(line)["step"] for line in lines if line.strip()), default=0)


async def run(data: dict, **kw: Any) -> float:
    run_dir = Path(os.environ["LATE_AGENT_RUN_DIR"])
    try:
        fd = os.open(run_dir / MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        late = True
    except FileExistsError:
        late = False
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0)
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=8)
    if late:
        os.write(fd, data["question"].encode())
        os.close(fd)
        give_up = time.monotonic() + 120  # the test then fails on what it reads, not on a hang
        while _logged_step(run_dir) < WAIT_FOR_STEP and time.monotonic() < give_up:
            await asyncio.sleep(0.2)
    return float(len(reply.choices[0].message.content or "") % 2)

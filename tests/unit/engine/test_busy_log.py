"""The embedded engine's busy log (areal/engine/busy.py, ``engine.busy_log``): back-to-back ticks
of one kind merge into one span, a gap or another kind closes it, a line cut by a kill is
skipped on reading; and a real engine that generates and loads weights writes a ``generate``
and a ``load`` span that lie inside the wall-clock time the test saw them happen."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tiny_models import tiny_qwen2

from areal.engine.batch import Engine, GenerationRequest, WeightUpdate
from areal.engine.busy import MERGE_GAP_S, BusySpans, read_spans
from areal.engine.sampling import SamplingParams


def test_spans_merge_when_they_touch_and_close_on_a_gap_or_another_kind(tmp_path: Path) -> None:
    path = tmp_path / "busy.jsonl"
    busy = BusySpans(str(path))
    busy.add("generate", 10.0, 10.1)
    busy.add("generate", 10.1 + MERGE_GAP_S / 2, 10.3)  # touches: one span
    busy.add("generate", 11.0, 11.2)  # a gap: a second span
    busy.add("load", 11.2, 11.5)  # another kind: a third
    assert read_spans(path) == [("generate", 10.0, 10.3), ("generate", 11.0, 11.2)]  # the open one is not written yet
    busy.close()
    assert read_spans(path) == [("generate", 10.0, 10.3), ("generate", 11.0, 11.2), ("load", 11.2, 11.5)]
    with open(path, "a") as f:
        f.write(json.dumps({"kind": "generate", "start": 12.0, "end": 12.5})[:20])  # cut by a kill
    assert len(read_spans(path)) == 3


def test_an_engine_logs_its_generation_and_its_weight_load(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    tiny_qwen2().save_pretrained(model_dir)
    log = tmp_path / "engine_busy-0.jsonl"
    engine = Engine(str(model_dir), max_batch=2, weight_version="0", busy_log=str(log))
    try:
        t0 = time.time()
        row = GenerationRequest(rid="r", input_ids=[5, 6, 7], params=SamplingParams(max_new_tokens=6, ignore_eos=True), return_logprob=True)
        assert len(engine.submit(row).result(timeout=60).output_ids) == 6
        t1 = time.time()
        engine.submit(WeightUpdate(str(model_dir), "1")).result(timeout=60)
        t2 = time.time()
    finally:
        engine.shutdown()
        engine._worker.join(timeout=30)
    spans = read_spans(log)
    generate = [(s, e) for k, s, e in spans if k == "generate"]
    load = [(s, e) for k, s, e in spans if k == "load"]
    assert generate and all(t0 <= s < e <= t1 for s, e in generate), (t0, t1, spans)
    assert len(load) == 1 and t1 <= load[0][0] < load[0][1] <= t2, (t1, t2, spans)

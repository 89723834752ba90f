"""SGLang's own HTTP server on CPU, with a stand-in for its scheduler. Run by the private venv's
python (``env.py`` builds it), never imported by the project: it imports SGLang, not areal.

    VENV/bin/python tests/support/sglang_app/serve.py --model-path DIR --port PORT [--token-delay-s S]

What runs is SGLang's real launch path, ``sglang.srt.entrypoints.http_server.launch_server``:
its FastAPI app and uvicorn, its TokenizerManager in this process, its DetokenizerManager in a
child process, its warm-up request, and the scheduler slot it offers for injection
(``run_scheduler_process_func``), which gets ``run_stand_in_scheduler`` below instead of the GPU
scheduler:

    HTTP ─► FastAPI app ─► TokenizerManager ──ZeroMQ (sglang's io_struct types)──► stand-in scheduler
           (sglang)        (sglang: GenerateReqInput                                 (this file: a fixed
                            normalisation, SamplingParams                             generation rule)
                            normalize + verify, length checks,                             │
                            pause/abort, meta_info, logprob                                │
                            lists, streaming chunks)  ◄── DetokenizerManager (sglang) ◄────┘
                                                          BatchStrOutput        BatchTokenIDOutput

So every request is validated, and every answer shaped, by SGLang's own code; only the model is
stood in. The stand-in's rule (``script_token``, ``script_logprob``, ``script_input_logprob``) is
fixed and known, so tests can check ids and logprobs exactly: output token i of a prompt p is
``20 + (sum(p) + 7 i) % 900`` with logprob ``-(1 + i % 8) / 8`` (exact in binary, so exact
through JSON), one token per step, a step every ``--token-delay-s``.

What the stand-in scheduler does as SGLang's does: finish on an EOS or ``stop_token_ids`` token
(``FINISH_MATCHED_TOKEN``, the token kept in ``output_ids``) unless ``ignore_eos``, on
``max_new_tokens`` (``FINISH_LENGTH``); ``AbortReq`` by rid prefix or all (running requests end
``FINISH_ABORT`` with the tokens they have, retracted ones are reported back through an
``AbortReq``, so the TokenizerManager answers "Abort in waiting queue"); ``logprob_start_len``
beyond the prompt aborts with 400; ``/pause_generation`` ``in_place`` / ``retract`` stop the
steps until ``/continue_generation`` (retract counts a retraction); ``/update_weights_from_disk``
succeeds for a folder with a ``config.json``, fails (as SGLang's does) when ``flush_cache`` is
asked while requests are still running, and records the weight-version change of requests in
flight (``weight_versions`` spans); a non-streamed request's tokens go to the TokenizerManager
every ``SGLANG_FORCE_STREAM_INTERVAL`` steps; the collective weight path joins the trainer's group
with SGLang's own ``init_custom_process_group`` (gloo on CPU), refuses
``/update_weights_from_distributed`` outside ``/begin_weight_update`` ... ``/end_weight_update``
(SGLang 0.5.23's session), receives the broadcasts in list order into ``torch.empty(shape,
dtype)`` and serves them back through ``/get_weights_by_name``; ``/get_server_info`` and
``/flush_cache`` answer.

A request's constrained-decoding fields (``json_schema``, ``regex``, ``ebnf``, ``structural_tag``), as
SGLang's front end passed them on, are written to stderr (the server's log) as one JSON line
``{"stand-in constraint": rid, ...}``; the stand-in decodes unconstrained.

Not covered (the stand-in scheduler does not do them): stop strings and regexes, grammars,
sessions, LoRA, multimodal inputs, hidden states, ``flattened_bucket`` broadcasts,
``/update_weights_from_tensor`` and other control requests not named above (their HTTP call would
wait for an answer that never comes), input top-logprobs and ``token_ids_logprob`` values
(answered with fixed numbers).

torchvision: ``sglang.srt.configs`` imports it at module level (InternVL image transforms), and
PyPI's torchvision is a CUDA build whose ops cannot load beside the CPU torch. An import hook
hands SGLang an empty module for it; nothing on the text path calls it. transformers is asked
first whether torchvision is there (it is not, and it caches the answer), so it never sees the
empty module.
"""

from __future__ import annotations

import argparse
import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
import types
from http import HTTPStatus
from typing import Any


class _Absent:
    """Any attribute of the empty torchvision: usable at import time, raises when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Absent:
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: torchvision is not installed in the SGLang check's venv")


class _AbsentModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self.__name__}.{attr}")


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _AbsentModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _install_torchvision_stand_in() -> None:
    from transformers.utils import import_utils

    if import_utils.is_torchvision_available():  # a real, loadable torchvision: use it
        return
    sys.meta_path.insert(0, _TorchvisionStandIn())


# At import, not in main(): SGLang's scheduler and detokenizer processes are spawned, and they
# import this module again, as ``__mp_main__``, before any of SGLang. Imported under its own name
# (the tests read the generation rule), it changes nothing.
if __name__ in ("__main__", "__mp_main__"):
    _install_torchvision_stand_in()


# ------------------------------------------------------------------------------------------
# The generation rule.
# ------------------------------------------------------------------------------------------


def script_token(prompt: list[int], i: int) -> int:
    """Output token i for a prompt: deterministic, inside any vocabulary of 920+ tokens."""
    return 20 + (sum(prompt) + 7 * i) % 900


def script_logprob(i: int) -> float:
    return -(1 + i % 8) / 8


def script_input_logprob(j: int) -> float:
    """The logprob of prompt position j (j >= 1; position 0 has none)."""
    return -(1 + j % 4) / 4


# ------------------------------------------------------------------------------------------
# The stand-in scheduler (runs in the process SGLang spawns for its scheduler).
# ------------------------------------------------------------------------------------------


# SGLang's refusal of a weight update that would flush the cache under running requests (the
# weights are loaded all the same; so is the version).
_FLUSH_REFUSED = (
    "Weights were updated, but the cache was not flushed because requests are still running or queued. "
    "Retract or finish them, then call /flush_cache."
)


CONSTRAINTS = ("json_schema", "regex", "ebnf", "structural_tag")  # SamplingParams' constrained-decoding fields


class _Request:
    """One request the stand-in is generating, with SGLang's Req bookkeeping that the output
    path reads (send offsets, incremental-detokenisation offsets, version events)."""

    def __init__(self, recv: Any) -> None:
        self.recv = recv
        self.rid: str = recv.rid
        self.prompt = list(recv.input_ids)
        self.params = recv.sampling_params
        self.output: list[int] = []
        self.logprobs: list[float] = []
        self.finished_reason: Any = None
        self.to_finish: Any = None
        self.retracted = False
        self.retractions = 0
        self.events: list[Any] = []  # WeightVersionEvent, as Req.weight_version_events
        self.sent_tokens = 0
        self.sent_decode_ids = 0
        self.input_logprobs_sent = False
        self.start = len(self.prompt) if recv.logprob_start_len == -1 else recv.logprob_start_len
        self.surr = max(len(self.prompt) - 5, 0)  # INIT_INCREMENTAL_DETOKENIZATION_OFFSET


class StandInScheduler:
    def __init__(self, server_args: Any, port_args: Any, token_delay_s: float) -> None:
        import zmq
        from sglang.srt.environ import envs
        from sglang.srt.utils.network import get_zmq_socket

        self.zmq = zmq
        context = zmq.Context(2)
        self.recv = get_zmq_socket(context, zmq.PULL, port_args.scheduler_input_ipc_name, False)
        self.to_tokenizer = get_zmq_socket(context, zmq.PUSH, port_args.tokenizer_ipc_name, False)
        self.to_detokenizer = get_zmq_socket(context, zmq.PUSH, port_args.detokenizer_ipc_name, False)
        self.token_delay_s = token_delay_s
        # SGLang sends a non-streamed request's tokens every SGLANG_FORCE_STREAM_INTERVAL (50) steps
        # too: they are what the TokenizerManager has if the request is aborted in the waiting queue.
        self.force_stream_interval = envs.SGLANG_FORCE_STREAM_INTERVAL.get()
        self.version = server_args.weight_version
        self.paused = False
        self.requests: dict[str, _Request] = {}
        self.groups: dict[str, Any] = {}  # weight-update process groups by name
        self.session_open = False  # between /begin_weight_update and /end_weight_update
        self.weights: dict[str, Any] = {}  # received over a group, by name (torch tensors)
        self.eos = set()
        for name in ("config.json", "generation_config.json"):
            path = os.path.join(server_args.model_path, name)
            if os.path.exists(path):
                eos = json.load(open(path)).get("eos_token_id")
                self.eos |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        with open(os.path.join(server_args.model_path, "config.json")) as f:
            self.context_len = int(server_args.context_length or json.load(f).get("max_position_embeddings", 4096))

    def init_info(self) -> dict:
        return {"status": "ready", "max_total_num_tokens": 1 << 20, "max_req_input_len": self.context_len - 1, "startup_time": None}

    def run(self) -> None:
        from sglang.srt.managers.io_struct import sock_recv

        while True:
            running = any(not r.retracted and r.finished_reason is None for r in self.requests.values())
            timeout_ms = int(self.token_delay_s * 1000) if running and not self.paused else 1000
            if self.recv.poll(timeout_ms):
                while True:
                    try:
                        self.handle(sock_recv(self.recv, self.zmq.NOBLOCK))
                    except self.zmq.Again:
                        break
            if not self.paused:
                self.step()

    def handle(self, msg: Any) -> None:
        import torch
        from sglang.srt.managers import io_struct as io

        match msg:
            case io.TokenizedGenerateReqInput():
                self.add(msg)
            case io.BatchTokenizedGenerateReqInput():
                for one in msg.batch:
                    self.add(one)
            case io.AbortReq():
                self.abort(msg)
            case io.PauseGenerationReqInput():
                self.paused = True
                if msg.mode == "retract":
                    for req in self.requests.values():
                        if req.finished_reason is None and not req.retracted:
                            req.retracted, req.retractions = True, req.retractions + 1
            case io.ContinueGenerationReqInput():
                self.paused = False
                for req in self.requests.values():
                    req.retracted = False
            case io.UpdateWeightFromDiskReqInput():
                self.send(self.to_tokenizer, self.update_weights(msg))
            case io.InitWeightsUpdateGroupReqInput():
                self.send(self.to_tokenizer, self.init_group(msg))
            case io.DestroyWeightsUpdateGroupReqInput():
                self.send(self.to_tokenizer, self.destroy_group(msg))
            case io.BeginWeightUpdateReqInput() | io.EndWeightUpdateReqInput():
                self.send(self.to_tokenizer, self.weight_update_session(msg))
            case io.UpdateWeightsFromDistributedReqInput():
                self.send(self.to_tokenizer, self.receive_weights(msg))
            case io.GetWeightsByNameReqInput():
                weight = self.weights.get(msg.name)
                parameter = None if weight is None else weight.to(torch.float32).numpy().tolist()[: msg.truncate_size]
                self.send(self.to_tokenizer, io.GetWeightsByNameReqOutput(parameter=parameter, rid=msg.rid))
            case io.GetInternalStateReq():
                running = sum(1 for r in self.requests.values() if not r.retracted)
                state = {"num_running_reqs": running, "num_waiting_reqs": len(self.requests) - running, "weight_version": self.version}
                self.send(self.to_tokenizer, io.GetInternalStateReqOutput(internal_state=state, rid=msg.rid))
            case io.FreezeGCReq():
                pass  # the end of SGLang's warm-up: a GC tuning hint, nothing to answer
            case io.FlushCacheReqInput():
                self.send(self.to_tokenizer, io.FlushCacheReqOutput(success=not self.requests, rid=msg.rid))
            case _:
                print(f"stand-in scheduler: {type(msg).__name__} is not handled", file=sys.stderr, flush=True)

    def send(self, socket: Any, obj: Any) -> None:
        from sglang.srt.managers.io_struct import sock_send

        sock_send(socket, obj)

    def add(self, recv: Any) -> None:
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        req = _Request(recv)
        constraint = {k: getattr(req.params, k, None) for k in CONSTRAINTS}
        if any(constraint.values()):  # what SGLang's front end passed on (the stand-in decodes unconstrained)
            print(json.dumps({"stand-in constraint": req.rid, **constraint}), file=sys.stderr, flush=True)
        if req.start > len(req.prompt):  # SGLang's scheduler check, with its message
            msg = f"req.logprob_start_len={req.start} is higher than the number of input tokens len(req.origin_input_ids)={len(req.prompt)}. Please use a smaller logprob_start_len."
            req.prompt, req.start = [0], 1
            req.to_finish = FINISH_ABORT(msg, HTTPStatus.BAD_REQUEST, "BadRequestError")
        self.requests[req.rid] = req

    def abort(self, msg: Any) -> None:
        from sglang.srt.managers.io_struct import AbortReq
        from sglang.srt.managers.schedule_batch import FINISH_ABORT
        from sglang.srt.utils.weight_versions import compute_weight_version_spans

        for req in list(self.requests.values()):
            if req.finished_reason is not None or not (msg.abort_all or req.rid.startswith(msg.rid)):
                continue
            if req.retracted:  # in the waiting queue: reported outside the output stream
                del self.requests[req.rid]
                spans = compute_weight_version_spans(req.events, self.version, len(req.output))
                self.send(self.to_tokenizer, AbortReq(rid=req.rid, finished_reason=msg.finished_reason, weight_versions=spans))
            elif msg.abort_message:
                req.to_finish = FINISH_ABORT(msg.abort_message, HTTPStatus.SERVICE_UNAVAILABLE)
            else:
                req.to_finish = FINISH_ABORT()

    def update_weights(self, msg: Any) -> Any:
        from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqOutput

        if not os.path.isfile(os.path.join(msg.model_path, "config.json")):
            return UpdateWeightFromDiskReqOutput(
                success=False, message=f"Failed to update weights: no model at {msg.model_path}.", num_paused_requests=0, rid=msg.rid
            )
        self.set_version(msg.weight_version)
        if msg.flush_cache and any(r.finished_reason is None for r in self.requests.values()):
            return UpdateWeightFromDiskReqOutput(success=False, message=_FLUSH_REFUSED, num_paused_requests=0, rid=msg.rid)
        return UpdateWeightFromDiskReqOutput(success=True, message="Succeeded to update model weights.", num_paused_requests=0, rid=msg.rid)

    def init_group(self, msg: Any) -> Any:
        """Join the trainer's weight-update group as SGLang's model runner does (its own
        ``init_custom_process_group``, rank ``rank_offset + tp_rank``); blocks until all joined."""
        from sglang.srt.managers.io_struct import InitWeightsUpdateGroupReqOutput
        from sglang.srt.utils.common import init_custom_process_group

        try:
            self.groups[msg.group_name] = init_custom_process_group(
                backend=msg.backend,
                init_method=f"tcp://{msg.master_address}:{msg.master_port}",
                world_size=msg.world_size,
                rank=msg.rank_offset,
                group_name=msg.group_name,
            )
        except Exception as e:  # noqa: BLE001 -- SGLang answers a failed join, it does not crash
            return InitWeightsUpdateGroupReqOutput(success=False, message=f"Failed to initialize custom process group: {e}.")
        return InitWeightsUpdateGroupReqOutput(success=True, message="Succeeded to initialize custom process group.")

    def destroy_group(self, msg: Any) -> Any:
        import torch
        from sglang.srt.managers.io_struct import DestroyWeightsUpdateGroupReqOutput

        if msg.group_name not in self.groups:
            return DestroyWeightsUpdateGroupReqOutput(success=False, message="The group to be destroyed does not exist.")
        torch.distributed.destroy_process_group(self.groups.pop(msg.group_name))
        return DestroyWeightsUpdateGroupReqOutput(success=True, message="Succeeded to destroy custom process group.")

    def weight_update_session(self, msg: Any) -> Any:
        """SGLang 0.5.23's weight-update session: /update_weights_from_distributed (and _tensor)
        are refused outside /begin_weight_update ... /end_weight_update (its messages)."""
        from sglang.srt.managers import io_struct as io

        if isinstance(msg, io.BeginWeightUpdateReqInput):
            if self.session_open:
                return io.BeginWeightUpdateReqOutput(
                    success=False, message="a weight-update session is already open; call end_weight_update() first"
                )
            self.session_open = True
            return io.BeginWeightUpdateReqOutput(success=True, message="Success")
        if not self.session_open:
            return io.EndWeightUpdateReqOutput(success=False, message="no weight-update session is open; call begin_weight_update() first")
        self.session_open = False
        return io.EndWeightUpdateReqOutput(success=True, message="Success")

    def receive_weights(self, msg: Any) -> Any:
        """SGLang's receive: ``torch.empty(shape, dtype)`` per name, one broadcast from rank 0 each,
        in list order; the weights are kept for /get_weights_by_name (there is no model to load)."""
        import torch
        from sglang.srt.managers.io_struct import UpdateWeightsFromDistributedReqOutput

        if not self.session_open:
            message = "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"
            return UpdateWeightsFromDistributedReqOutput(success=False, message=message)
        if msg.group_name not in self.groups:
            message = f"Failed to receive weights: Group {msg.group_name} not in {list(self.groups)}. Please call `init_weights_update_group` first."
            return UpdateWeightsFromDistributedReqOutput(success=False, message=message)
        received, handles = {}, []
        for name, dtype, shape in zip(msg.names, msg.dtypes, msg.shapes):
            received[name] = torch.empty(shape, dtype=getattr(torch, dtype))
            handles.append(torch.distributed.broadcast(received[name], src=0, group=self.groups[msg.group_name], async_op=True))
        for handle in handles:
            handle.wait()
        self.weights.update(received)
        self.set_version(msg.weight_version)
        in_flight = [r for r in self.requests.values() if r.finished_reason is None]
        if msg.flush_cache and in_flight:
            return UpdateWeightsFromDistributedReqOutput(success=False, message=_FLUSH_REFUSED)
        return UpdateWeightsFromDistributedReqOutput(success=True, message="Succeeded to update parameter online.")

    def set_version(self, version: str | None) -> None:
        """A new weight version: requests in flight note where it starts (their version spans)."""
        from sglang.srt.utils.weight_versions import WeightVersionEvent

        if version is None or version == self.version:
            return
        for req in self.requests.values():
            if req.finished_reason is None and req.output:
                req.events.append(WeightVersionEvent(old_version=self.version, num_output_tokens=len(req.output)))
        self.version = version

    def step(self) -> None:
        """One decode step: a token for every running request; then one BatchTokenIDOutput with
        what is to be sent (every step for a stream, the end for the rest)."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, FINISH_MATCHED_TOKEN

        out: list[_Request] = []
        for req in self.requests.values():
            if req.finished_reason is not None or req.retracted:
                continue
            max_new = req.params.max_new_tokens
            if req.to_finish is not None:
                req.finished_reason, req.to_finish = req.to_finish, None
            elif max_new == 0:  # SGLang samples one token and cuts the output at finished_len = 0
                req.finished_reason = FINISH_LENGTH(length=0)
            else:
                tok = script_token(req.prompt, len(req.output))
                req.logprobs.append(script_logprob(len(req.output)))
                req.output.append(tok)
                stops = (req.params.stop_token_ids or set()) | self.eos
                if not req.params.ignore_eos and tok in stops:
                    req.finished_reason = FINISH_MATCHED_TOKEN(matched=tok)
                elif max_new is not None and len(req.output) >= max_new:
                    req.finished_reason = FINISH_LENGTH(length=max_new)
            if req.finished_reason is not None or req.recv.stream or len(req.output) % self.force_stream_interval == 0:
                out.append(req)
        if out:
            self.send(self.to_detokenizer, self.batch_output(out))
        for req in out:
            if req.finished_reason is not None:
                del self.requests[req.rid]

    def batch_output(self, reqs: list[_Request]) -> Any:
        """SGLang's BatchTokenIDOutput for these requests, filled as its OutputStreamer does."""
        from sglang.srt.managers.io_struct import BatchTokenIDOutput
        from sglang.srt.utils.weight_versions import compute_weight_version_spans

        f: dict[str, list] = {
            k: []
            for k in (
                "rids finished_reasons decoded_texts decode_ids read_offsets output_ids skip_special_tokens "
                "spaces_between_special_tokens no_stop_trim prompt_tokens reasoning_tokens completion_tokens cached_tokens "
                "input_token_logprobs_val input_token_logprobs_idx output_token_logprobs_val output_token_logprobs_idx "
                "input_top_logprobs_val input_top_logprobs_idx output_top_logprobs_val output_top_logprobs_idx "
                "input_token_ids_logprobs_val input_token_ids_logprobs_idx output_token_ids_logprobs_val "
                "output_token_ids_logprobs_idx retraction_counts weight_versions http_worker_ipcs"
            ).split()
        }
        for req in reqs:
            sp, recv, n = req.params, req.recv, len(req.output)
            f["rids"].append(req.rid)
            f["http_worker_ipcs"].append(recv.http_worker_ipc)
            f["finished_reasons"].append(req.finished_reason.to_json() if req.finished_reason else None)
            f["output_ids"].append(req.output[req.sent_tokens :])
            decode_ids = req.prompt[req.surr :] + req.output
            f["decoded_texts"].append("")
            f["decode_ids"].append(decode_ids[req.sent_decode_ids :])
            f["read_offsets"].append(len(req.prompt) - req.surr)
            f["skip_special_tokens"].append(sp.skip_special_tokens)
            f["spaces_between_special_tokens"].append(sp.spaces_between_special_tokens)
            f["no_stop_trim"].append(sp.no_stop_trim)
            f["prompt_tokens"].append(len(req.prompt))
            f["reasoning_tokens"].append(0)
            f["completion_tokens"].append(n)
            f["cached_tokens"].append(0)
            f["retraction_counts"].append(req.retractions)
            done = req.finished_reason is not None
            f["weight_versions"].append(compute_weight_version_spans(req.events, self.version, n) if done else None)
            k = recv.top_logprobs_num
            new = range(req.sent_tokens, n)
            ids = recv.token_ids_logprob
            if recv.return_logprob and not req.input_logprobs_sent:
                positions = range(req.start, len(req.prompt))
                vals = [None if j == req.start else script_input_logprob(j) for j in positions]
                f["input_token_logprobs_val"].append(vals)
                f["input_token_logprobs_idx"].append(req.prompt[req.start :])
                f["input_top_logprobs_val"].append([None if j == req.start else [-1.0] * k for j in positions] if k else [])
                f["input_top_logprobs_idx"].append([None if j == req.start else [0] * k for j in positions] if k else [])
                f["input_token_ids_logprobs_val"].append([None if j == req.start else [-1.0] * len(ids) for j in positions] if ids else [])
                f["input_token_ids_logprobs_idx"].append([None if j == req.start else list(ids) for j in positions] if ids else [])
                req.input_logprobs_sent = True
            else:
                for key in ("input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs"):
                    f[key + "_val"].append([])
                    f[key + "_idx"].append([])
            f["output_token_logprobs_val"].append(req.logprobs[req.sent_tokens :] if recv.return_logprob else [])
            f["output_token_logprobs_idx"].append(req.output[req.sent_tokens :] if recv.return_logprob else [])
            f["output_top_logprobs_val"].append([[req.logprobs[i] - d for d in range(k)] for i in new] if recv.return_logprob else [])
            f["output_top_logprobs_idx"].append([[req.output[i] + d for d in range(k)] for i in new] if recv.return_logprob else [])
            f["output_token_ids_logprobs_val"].append([[-1.0] * len(ids) for _ in new] if recv.return_logprob and ids else [])
            f["output_token_ids_logprobs_idx"].append([list(ids) for _ in new] if recv.return_logprob and ids else [])
            req.sent_tokens, req.sent_decode_ids = n, len(decode_ids)
        return BatchTokenIDOutput(
            **{key: value for key, value in f.items() if key != "weight_versions"},
            weight_versions=f["weight_versions"] if any(f["weight_versions"]) else None,
            output_token_entropy_val=None,
            output_token_sampling_mask=None,
            output_hidden_states=None,
            routed_experts=None,
            indexer_topk=None,
            placeholder_tokens_idx=None,
            placeholder_tokens_val=None,
        )


def run_stand_in_scheduler(
    token_delay_s: float,
    server_args: Any,
    port_args: Any,
    gpu_id: int,
    tp_rank: int,
    pp_rank: int,
    dp_rank: Any,
    pipe_writer: Any,
    *rest: Any,
) -> None:
    """SGLang's ``run_scheduler_process`` contract: the ready handshake on ``pipe_writer``, then
    serve the ZeroMQ sockets until killed."""
    scheduler = StandInScheduler(server_args, port_args, token_delay_s)
    pipe_writer.send(scheduler.init_info())
    scheduler.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="import SGLang's server and exit")
    parser.add_argument("--model-path")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--token-delay-s", type=float, default=0.01, help="time between decode steps")
    parser.add_argument("--weight-version", default="default")
    args = parser.parse_args()
    if args.check:
        import sglang
        import sglang.srt.entrypoints.http_server  # noqa: F401

        print(f"sglang {sglang.__version__}: sglang.srt.entrypoints.http_server imports")
        return
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import ServerArgs

    started = time.monotonic()
    server_args = ServerArgs(
        model_path=args.model_path, device="cpu", host=args.host, port=args.port, weight_version=args.weight_version, log_level="warning"
    )
    print(f"stand-in: ServerArgs built after {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    launch_server(server_args, run_scheduler_process_func=functools.partial(run_stand_in_scheduler, args.token_delay_s))


if __name__ == "__main__":
    main()

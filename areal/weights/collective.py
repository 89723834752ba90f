"""Weights from the trainer to inference engines over a collective: SGLang's NCCL path, gloo on CPU.

Both ends of the boundary live here: ``join_weight_group`` is what the trainer (rank 0) and every
engine (rank ``rank_offset + tp_rank``) call to form the group, and ``CollectiveWeightPush`` is the
trainer's side of SGLang's three endpoints (their shapes: tests/integration/sglang/test_sglang_protocol.py).

    trainer, rank 0                                      engine i, rank 1 + sum(world sizes before i)
    init()   POST /init_weights_update_group ──────────► join_weight_group(...)  (blocks until all join)
             join_weight_group(rank 0) ◄═══ rendezvous tcp://master_address:master_port ═══►
    push()   POST /pause_generation {"mode": "abort"}   (running generations come back partial)
             POST /begin_weight_update {}                (SGLang >= 0.5.23: a session; 404 before)
             POST /update_weights_from_distributed ────► torch.empty(shape, dtype) per name
                  {names, dtypes, shapes, weight_version}
             broadcast(t_k, src=0), k in state_dict order ═► received in list order, loaded between
                                                             decode steps, weight_version set
             POST /end_weight_update {}                  (always, on the engines opened)
             POST /continue_generation                   (always, even after a failure)
    close()  POST /destroy_weights_update_group; the trainer leaves its own group

Invariants:
- The group is independent of any torchrun default group: a TCPStore from the ``tcp://`` rendezvous,
  wrapped in ``PrefixStore(group_name)``, then torch's ``_new_process_group_helper`` with no
  parent ranks, the construction SGLang's ``init_custom_process_group`` uses, so the store keys
  match a real SGLang server's on the NCCL path. Group rank == rank in the broadcast.
- The k-th broadcast fills the k-th name: tensors go in ``state_dict()`` order and a tensor that
  aliases an earlier one (tied embeddings) is sent once, under its first name.
- Every update POST runs concurrently with the broadcasts (the engine answers only after it has
  received them all). A push is confirmed only when every engine answered ``success``; anything
  else raises ``WeightUpdateError`` naming the engine and the version.
- The trainer never waits forever on broadcasts no engine receives: an engine that refuses the
  update answers at once, and that answer fails the push before the broadcasts are awaited.

Not covered: ``load_format="flattened_bucket"`` (one broadcast per tensor instead), engines with
tensor parallelism > 1 on the embedded engine (SGLang servers with tp > 1 work via
``engine_world_sizes``), re-forming a group after an engine died (close and init a new one).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import socket
import threading
import urllib.parse
from typing import Any

import torch
import torch.distributed as dist

from areal.engine.client import EngineError, EngineUnavailable, request_json
from areal.weights import WeightUpdateError

BACKENDS = ("gloo", "nccl")


def join_weight_group(
    backend: str, master_address: str, master_port: int, rank: int, world_size: int, group_name: str, timeout_s: float
) -> dist.ProcessGroup:
    """Form (or join) the weight-update group as ``rank`` of ``world_size``; blocks until all joined.

    Rank 0 hosts the TCPStore; the others connect to it (retrying until ``timeout_s``).
    """
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    # No parent ranks ([]): the group stands alone, whether or not this process has a default group.
    group, _ = _new_process_group_helper(
        world_size, rank, [], Backend(backend), store, group_name=group_name, backend_options=None, timeout=timeout
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}  # so dist.broadcast(src=0, group=...) works
    return group


def leave_weight_group(group: dist.ProcessGroup) -> None:
    dist.destroy_process_group(group)


def local_address_towards(url: str) -> str:
    """This host's address on the route to ``url``'s host (what an engine there can connect back to)."""
    host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # UDP connect sends nothing; it only picks the route
        return s.getsockname()[0]


def _post(url: str, path: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """POST JSON (``request_json``); an error answer is returned like a success (SGLang answers 400
    + success=false), with ``success`` false, the HTTP status as ``status_code`` and the server's
    message. No answer raises ``EngineUnavailable``."""
    try:
        return request_json(url, path, body, timeout_s)
    except EngineUnavailable:
        raise
    except EngineError as exc:
        return {"success": False, "status_code": exc.status, "message": exc.message}


def named_tensors_to_send(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``state_dict()`` entries in order, each storage once (tied weights go under their first name)."""
    seen: set[tuple[int, int]] = set()
    out = []
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        out.append((name, t))
    return out


def dtype_name(dtype: torch.dtype) -> str:
    """SGLang's wire name of a dtype ("bfloat16"); the engine reads it back with ``getattr(torch, name)``."""
    return str(dtype).removeprefix("torch.")


class CollectiveWeightPush:
    """The trainer's side: rank 0 of a weight-update group spanning every engine's ranks."""

    def __init__(
        self,
        engine_urls: list[str],
        master_address: str,
        master_port: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
        engine_world_sizes: list[int] | None = None,
        timeout_s: float = 300.0,
        send_dtype: torch.dtype | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "nccl" and not torch.cuda.is_available():
            raise ValueError("backend 'nccl' needs CUDA on the trainer; use 'gloo' on CPU")
        if not engine_urls:
            raise ValueError("engine_urls must name at least one engine")
        sizes = [1] * len(engine_urls) if engine_world_sizes is None else list(engine_world_sizes)
        if len(sizes) != len(engine_urls) or not all(isinstance(s, int) and s >= 1 for s in sizes):
            raise ValueError(f"engine_world_sizes must be one int >= 1 per engine, got {engine_world_sizes!r}")
        if not 0 < master_port < 65536:
            raise ValueError(f"master_port must be in 1..65535, got {master_port!r}")
        self.engine_urls = list(engine_urls)
        self.master_address, self.master_port = master_address, master_port
        self.group_name, self.backend, self.timeout_s = group_name, backend, timeout_s
        self.send_dtype = send_dtype  # e.g. torch.bfloat16 to halve the bytes to bf16 engines; None: as trained
        # Rank 0 is the trainer; engine i holds ranks offset_i .. offset_i + size_i - 1.
        self.rank_offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        self.world_size = 1 + sum(sizes)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.group: dist.ProcessGroup | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(engine_urls), thread_name_prefix="weight-sync")

    def _each_engine(self, path: str, body_for: Any) -> list[concurrent.futures.Future]:
        return [self._pool.submit(_post, url, path, body_for(i), self.timeout_s) for i, url in enumerate(self.engine_urls)]

    def _confirm(self, futures: list[concurrent.futures.Future], what: str, also: concurrent.futures.Future | None = None) -> None:
        """Raise on the first engine (in completion order) that did not answer success, or as soon
        as ``also`` (our own side of a collective step) fails."""
        by_future: dict[concurrent.futures.Future, str] = dict(zip(futures, self.engine_urls))
        pending = set(by_future) | ({also} if also is not None else set())
        while by_future.keys() & pending:
            done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                if fut is also:
                    fut.result()  # raises our own failure
                    continue
                url = by_future[fut]
                try:
                    reply = fut.result()
                except EngineUnavailable as exc:  # refused, reset, timeout: name the engine
                    raise WeightUpdateError(f"{url}: {what} failed: {exc}") from exc
                if not reply.get("success"):
                    raise WeightUpdateError(f"{url}: {what} not confirmed: {reply}")

    def init(self) -> None:
        """Ask every engine to join and join as rank 0, concurrently (each side blocks until all joined)."""
        if self.group is not None:
            raise RuntimeError(f"weight group {self.group_name!r} is already initialised")
        futures = self._each_engine(
            "/init_weights_update_group",
            lambda i: {
                "master_address": self.master_address,
                "master_port": self.master_port,
                "rank_offset": self.rank_offsets[i],
                "world_size": self.world_size,
                "group_name": self.group_name,
                "backend": self.backend,
            },
        )
        # Our rendezvous runs beside the POSTs in a daemon thread: an engine that refuses (say, nccl
        # without CUDA) answers at once, and that answer is raised without waiting for the timeout.
        joined: concurrent.futures.Future = concurrent.futures.Future()

        def join() -> None:
            try:
                joined.set_result(
                    join_weight_group(
                        self.backend, self.master_address, self.master_port, 0, self.world_size, self.group_name, self.timeout_s
                    )
                )
            except BaseException as exc:  # noqa: BLE001 -- thread boundary: handed to the caller
                joined.set_exception(exc)

        threading.Thread(target=join, name="weight-group-join", daemon=True).start()
        self._confirm(futures, f"joining weight group {self.group_name!r}", also=joined)
        self.group = joined.result()

    def push(self, model: torch.nn.Module, version: int | str, pause: bool = True) -> None:
        """Broadcast ``model``'s weights as ``version`` to every engine; raise WeightUpdateError unless all confirm."""
        if self.group is None:
            raise RuntimeError("push() before init()")
        tensors = [(n, t.detach().to(self.device, self.send_dtype or t.dtype).contiguous()) for n, t in named_tensors_to_send(model)]
        body = {
            "names": [n for n, _ in tensors],
            "dtypes": [dtype_name(t.dtype) for _, t in tensors],
            "shapes": [list(t.shape) for _, t in tensors],
            "group_name": self.group_name,
            "weight_version": str(version),
            "flush_cache": True,
        }
        sessions: list[str] = []  # engines with a weight-update session open, to be closed
        try:
            if pause:
                self._confirm_control("/pause_generation", {"mode": "abort"})
            sessions = self._begin_sessions()
            futures = self._each_engine("/update_weights_from_distributed", lambda i: body)
            works = [dist.broadcast(t, src=0, group=self.group, async_op=True) for _, t in tensors]
            # The engines answer after receiving everything (or at once, refusing): their replies
            # come first, so a refusal never leaves us waiting on broadcasts nobody receives.
            self._confirm(futures, f"update to v{version} over {self.group_name!r}")
            for w in works:
                w.wait()
        finally:
            try:
                self._end_sessions(sessions)
            finally:
                if pause:
                    self._confirm_control("/continue_generation", {})

    def _begin_sessions(self) -> list[str]:
        """Open a weight-update session on every engine (SGLang >= 0.5.23 refuses
        /update_weights_from_distributed outside /begin_weight_update ... /end_weight_update);
        an engine that answers 404 predates sessions and needs none. Returns the engines opened."""
        opened = []
        for fut, url in zip(self._each_engine("/begin_weight_update", lambda i: {}), self.engine_urls):
            try:
                reply = fut.result()
            except EngineUnavailable as exc:
                self._end_sessions(opened)
                raise WeightUpdateError(f"{url}: /begin_weight_update failed: {exc}") from exc
            if reply.get("status_code") == 404:
                continue
            if not reply.get("success"):
                self._end_sessions(opened)
                raise WeightUpdateError(f"{url}: /begin_weight_update not confirmed: {reply}")
            opened.append(url)
        return opened

    def _end_sessions(self, urls: list[str]) -> None:
        futures = [self._pool.submit(_post, url, "/end_weight_update", {}, self.timeout_s) for url in urls]
        for fut, url in zip(futures, urls):
            try:
                reply = fut.result()
            except EngineUnavailable as exc:
                raise WeightUpdateError(f"{url}: /end_weight_update failed: {exc}") from exc
            if not reply.get("success"):
                raise WeightUpdateError(f"{url}: /end_weight_update not confirmed: {reply}")

    def _confirm_control(self, path: str, body: dict[str, Any]) -> None:
        for fut, url in zip(self._each_engine(path, lambda i: body), self.engine_urls):
            try:
                reply = fut.result()
            except EngineUnavailable as exc:
                raise WeightUpdateError(f"{url}: {path} failed: {exc}") from exc
            if reply.get("status") != "ok":
                raise WeightUpdateError(f"{url}: {path} not confirmed: {reply}")

    def close(self) -> None:
        """Ask the engines to leave the group, then leave it; idempotent."""
        if self.group is None:
            self._pool.shutdown()
            return
        try:
            self._confirm(
                self._each_engine("/destroy_weights_update_group", lambda i: {"group_name": self.group_name}),
                f"leaving weight group {self.group_name!r}",
            )
        finally:
            leave_weight_group(self.group)
            self.group = None
            self._pool.shutdown()

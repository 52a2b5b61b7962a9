"""Ranks on torch.distributed for tensor parallelism: started by torchrun, or spawned here on one machine.

    from profiler.distributed import run_ranks
    result = run_ranks(2, "cpu", main, follower, args)   # main(rank, *args) on rank 0, follower on the rest

* Under ``torchrun`` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment) this
  process is one rank of the job; rank 0 runs ``main``, the others ``follower``.
* Otherwise this process is rank 0 and ranks 1..N-1 are started with torch.multiprocessing (spawn) on
  127.0.0.1 (rank 0's TCPStore at a port the OS picks; a rank that dies while starting stops the run at
  once); they end when the run ends (terminated after ``STOP_S`` if not).
* Backend: NCCL on CUDA devices (rank r on cuda:LOCAL_RANK), gloo on the CPU. A second, gloo group
  (``Rank.control``) carries the small host-side messages: decisions broadcast from rank 0, agreed
  repetition counts, every rank's measurements gathered to rank 0. NCCL is the GPU path; it cannot
  run on a CPU-only machine.
* A rank that dies closes its sockets, so the others' next collective fails at once; a rank that hangs
  is given up after ``timeout_s`` (``ROOFLINE_TP_TIMEOUT_S``, default ``TIMEOUT_S``). Rank 0 then
  raises ``RankLost`` naming the rank and how it ended (exit code or signal) where it can see it.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
from dataclasses import dataclass

from roofline.errors import RooflineError

from .timing import cpu_threads

TIMEOUT_S = 300.0   # a collective or control message waits this long for a rank that is alive but silent
STOP_S = 5.0        # spawned ranks get this long to finish after rank 0 is done, then they are terminated
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class RankLost(RooflineError):
    """A rank died or stopped answering: the run cannot go on (one line, for the user)."""


def timeout_s() -> float:
    try:
        return float(os.environ.get("ROOFLINE_TP_TIMEOUT_S", TIMEOUT_S))
    except ValueError:
        return TIMEOUT_S


def torchrun_env() -> dict | None:
    """{rank, world, local_rank} when this process was started by torchrun, else None."""
    if not all(k in os.environ for k in TORCHRUN_VARS):
        return None
    return {"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]),
            "local_rank": int(os.environ["LOCAL_RANK"])}


def backend_for(device: str) -> str:
    return "nccl" if str(device).startswith("cuda") else "gloo"


def check_tp(tp, device: str, device_count: int | None = None) -> int:
    """``tp`` checked against this machine (one line each): at least 1; on a GPU, no more ranks than GPUs
    (``device_count`` overrides torch's count, for tests); under torchrun, the job's world size."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise RooflineError(f"--tp must be a whole number of tensor-parallel ranks, at least 1, but {tp!r} was given.")
    env = torchrun_env()
    if env is not None and env["world"] != tp:
        raise RooflineError(f"--tp {tp} but torchrun started {env['world']} processes (--nproc-per-node): give the "
                            "same number to both.")
    if str(device).startswith("cuda"):
        if device_count is None:
            import torch

            device_count = torch.cuda.device_count()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", tp)) if env is not None else tp
        if local > device_count:
            raise RooflineError(f"--tp {tp} needs {local} GPUs on this machine (one per rank), but torch sees "
                                f"{device_count}: give --tp {max(1, device_count)} or fewer, or set "
                                "CUDA_VISIBLE_DEVICES.")
    if str(device).startswith("cuda") and ":" in str(device) and tp > 1:
        raise RooflineError(f"--device {device} names one GPU, but --tp {tp} puts rank r on cuda:r: give --device "
                            "cuda.")
    return tp


def check_cpu_ranks(tp: int, device: str) -> int:
    """``tp`` CPU ranks checked against this machine's logical CPUs (one line), as ``--threads`` is: ranks
    beyond the CPUs only wait on each other (64 gloo ranks on 2 CPUs ran 300 s without a word); ``profile`` and ``ceilings --collective``
    alike."""
    n = os.cpu_count() or 1
    most = max(2, n)        # a collective needs two ranks: two share one CPU, slowly
    if not str(device).startswith("cuda") and torchrun_env() is None and tp > most:
        raise RooflineError(f"--tp {tp} starts {tp} CPU ranks, but this machine has {n} logical CPU(s) (more ranks "
                            f"than CPUs only wait on each other, for minutes): give --tp {most} or fewer.")
    return tp


@dataclass
class Rank:
    """This process's place in the run: rank of world, its torch device, the two process groups."""

    rank: int
    world: int
    local_rank: int
    device: str          # "cpu" or "cuda:i"
    backend: str         # of the default group: "nccl" | "gloo"
    launcher: str        # "torchrun" | "spawn"
    control: object = None   # a gloo group for host-side messages

    @property
    def tp(self):
        """The model's view of the group (``kernels.tp.TPGroup`` over the default group)."""
        from kernels.tp import TPGroup   # kernels imports torch: deferred, the CLI starts without it

        return TPGroup(self.rank, self.world)

    def bcast(self, obj=None):
        """Rank 0's ``obj`` on every rank."""
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, obj) -> list | None:
        """Every rank's ``obj``, in rank order, on rank 0 (None elsewhere)."""
        import torch.distributed as dist

        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.control)
        return out

    def agree_max(self, x: float) -> float:
        """The largest ``x`` over the ranks, on every rank (an estimate every rank then times with)."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(x)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return float(t.item())

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.control)

    def synchronize(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)


@dataclass
class OneRank:
    """The trivial group: this process alone, rank 0 of 1 (``profiler.sweep.run_sweep``'s default). The same
    messages as ``Rank``, each a no-op: one pipeline and one sweep serve one rank and N."""

    device: str
    rank: int = 0
    world: int = 1

    def bcast(self, obj=None):
        return obj

    def gather(self, obj) -> list:
        return [obj]

    def agree_max(self, x: float) -> float:
        return x

    def barrier(self) -> None:
        pass


def init_rank(rank: int, world: int, local_rank: int, device: str, launcher: str,
              init_method: str = "env://", store=None) -> Rank:
    """Join the default group (NCCL or gloo) and a gloo control group; bind this rank's GPU.
    ``store``: a TCPStore already connected (spawned ranks), else ``init_method`` finds one."""
    import torch.distributed as dist

    import torch

    backend = backend_for(device)
    dev, kw = "cpu", {}
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        dev = f"cuda:{local_rank}"
        kw["device_id"] = torch.device(dev)      # binds the NCCL communicator to this rank's GPU
    t = datetime.timedelta(seconds=timeout_s())
    if store is not None:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=t, **kw)
    else:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, timeout=t, **kw)
    control = dist.new_group(backend="gloo", timeout=t)
    return Rank(rank, world, local_rank, dev, backend, launcher, control)


def close_rank() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a group whose peer died cannot always be torn down cleanly
            pass


def _child(rank: int, world: int, port: int, device: str, follower, args, threads: int | None) -> None:
    """A spawned rank: join the group, run ``follower``, leave quietly. A lost peer is rank 0's to report.
    Ctrl-C is rank 0's to handle (it closes the file and says how to resume): this rank ignores SIGINT
    and ends when rank 0 leaves the group."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s()))
        store.set(f"roofline/ready/{rank}", "1")      # rank 0 waits for these, watching for ranks that died
        ctx = init_rank(rank, world, rank, device, "spawn", store=store)
        follower(ctx, *args)
        close_rank()
    except KeyboardInterrupt:
        os._exit(130)
    except RooflineError as e:
        print(f"rank {rank}: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    except Exception as e:  # noqa: BLE001 - one line, never a traceback per rank
        if not is_peer_error(e):
            print(f"rank {rank}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
                  file=sys.stderr, flush=True)
        os._exit(1)


def is_peer_error(e: BaseException) -> bool:
    """A collective failed because another rank died or stopped answering (gloo, NCCL, the store)."""
    msg = str(e).lower()
    return isinstance(e, RuntimeError) and any(k in msg for k in (
        "connection closed", "connection reset", "broken pipe", "timed out", "timeout", "socket", "nccl",
        "connection refused", "peer"))


def how_ended(code: int | None) -> str:
    if code is None:
        return "still running but not answering"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def run_ranks(world: int, device: str, main, follower, args=(), *, threads: int | None = None):
    """``main(rank, *args)`` on rank 0, ``follower(rank, *args)`` on ranks 1..N-1; returns ``main``'s result
    (None on a follower under torchrun). A lost rank becomes ``RankLost`` on rank 0."""
    env = torchrun_env()
    if env is not None:
        ctx = init_rank(env["rank"], env["world"], env["local_rank"], device, "torchrun")
        try:
            if ctx.rank == 0:
                return _guarded(ctx, main, args, [], threads)
            if threads and ctx.backend == "gloo":
                import torch

                torch.set_num_threads(threads)
            follower(ctx, *args)
            return None
        finally:
            close_rank()
    import torch.multiprocessing as mp

    store, port = _master_store()
    spawn = mp.get_context("spawn")
    procs = [spawn.Process(target=_child, args=(r, world, port, device, follower, args, threads), daemon=True)
             for r in range(1, world)]
    for p in procs:
        p.start()
    try:
        try:
            _wait_ready(store, procs)
            ctx = init_rank(0, world, 0, device, "spawn", store=store)
        except RankLost:
            raise
        except Exception as e:  # noqa: BLE001
            raise RankLost(_lost_message(procs, e, "while starting")) from None
        return _guarded(ctx, main, args, procs, threads)
    finally:
        close_rank()
        _stop(procs)


def _master_store():
    """Rank 0's TCPStore on 127.0.0.1 at a port the OS picks (no race for a free one), not waiting for the
    workers (``_wait_ready`` does): (store, port)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, timeout=datetime.timedelta(seconds=timeout_s()),
                          wait_for_workers=False)
    return store, store.port


def _wait_ready(store, procs) -> None:
    """Wait for every spawned rank to check in, and stop at once when one dies first (an import error,
    an out-of-memory start): without this, rank 0 would wait the whole timeout for a rank that is gone."""
    keys = [f"roofline/ready/{r}" for r in range(1, len(procs) + 1)]
    deadline = time.monotonic() + timeout_s()
    while not store.check(keys):
        dead = [(i + 1, p.exitcode) for i, p in enumerate(procs) if p.exitcode is not None]
        if dead:
            world = len(procs) + 1
            raise RankLost("; ".join(f"rank {r} of {world} {how_ended(c)}" for r, c in dead)
                           + " while starting (its own error is above), so the run stopped")
        if time.monotonic() > deadline:
            raise RankLost(f"the spawned ranks did not start within {timeout_s():g} s "
                           "(ROOFLINE_TP_TIMEOUT_S), so the run stopped")
        time.sleep(0.05)


def _guarded(ctx: Rank, main, args, procs, threads: int | None = None):
    try:
        with cpu_threads(threads if ctx.backend == "gloo" else None):
            return main(ctx, *args)
    except RankLost:
        raise
    except Exception as e:  # noqa: BLE001
        if not is_peer_error(e):
            raise
        raise RankLost(_lost_message(procs, e)) from None


def _lost_message(procs, e, when: str = "") -> str:
    """'rank 1 of 2 stopped (killed by signal SIGKILL)' from the spawned processes' exit codes, else the error."""
    deadline = time.monotonic() + 2.0          # a dying process needs a moment to be reaped
    while time.monotonic() < deadline and not any(p.exitcode not in (None, 0) for p in procs):
        time.sleep(0.05)
    dead = [(i + 1, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
    first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
    world = len(procs) + 1
    if dead:
        who = "; ".join(f"rank {r} of {world} {how_ended(c)}" for r, c in dead)
        return f"{who}{' ' + when if when else ''}, so the run stopped"
    return f"a peer rank stopped answering{' ' + when if when else ''} ({first}), so the run stopped"


def _stop(procs) -> None:
    deadline = time.monotonic() + STOP_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(2.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)

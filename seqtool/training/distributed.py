"""Several processes training one model (torchrun): ranks, the process group, DDP, who gets which batch.

Owns:

- reading torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK; MASTER_ADDR/MASTER_PORT for the
  rendezvous) into a rank and a world size; nothing here assumes a single node;
- the device of each process (cuda:LOCAL_RANK on GPUs);
- init_process_group (gloo on CPU, nccl on CUDA) with a bounded timeout (--dist-timeout), so a
  rank that fails or hangs makes the others fail with an error instead of waiting forever
  (torchrun then stops the whole job, non-zero);
- the few host-side collectives the training loop needs: summing token counts, taking rank 0's
  decision to stop, gathering every rank's RNG state for last.pt, checking that ranks agree;
- which batches each rank trains on in each update (`update_batches`);
- DistributedDataParallel wrapping, and cleanup.

On one process (no torchrun) every function is a no-op and no process group is created.

Fault injection (a test hook, not a feature): SEQTOOL_FAULT=rank<R>-hang makes rank R sleep
forever, SEQTOOL_FAULT=rank<R>-exit makes it exit at once with status 17, both just before its
second update. tests/test_distributed.py uses it to check that the job then ends with an error
within --dist-timeout.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Mapping, Optional

import torch
from torch import nn

from .. import log
from ..errors import ConfigError

FAULT_ENV = "SEQTOOL_FAULT"


class DistributedError(ConfigError):
    """Another process of the job failed, hung or cannot be reached (one line, non-zero exit)."""


@dataclass(frozen=True)
class Env:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0


def environment(environ: Mapping[str, str] = os.environ) -> Env:
    """torchrun's variables -> Env; a plain process (no WORLD_SIZE) is rank 0 of 1."""
    if "WORLD_SIZE" not in environ:
        return Env()
    values = {}
    for name, default in (("RANK", None), ("WORLD_SIZE", None), ("LOCAL_RANK", "0")):
        text = environ.get(name, default)
        if text is None:
            raise ConfigError(f"WORLD_SIZE is set but {name} is not: start several processes with torchrun, "
                              "or unset WORLD_SIZE to train in one process")
        try:
            values[name] = int(text)
        except ValueError:
            raise ConfigError(f"environment variable {name}={text!r} is not a number (set by torchrun)") from None
    env = Env(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])
    if env.world_size < 1 or not 0 <= env.rank < env.world_size or env.local_rank < 0:
        raise ConfigError(f"inconsistent torchrun environment: RANK={env.rank}, WORLD_SIZE={env.world_size}, LOCAL_RANK={env.local_rank}")
    if env.world_size > 1:
        missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(n)]
        if missing:
            raise ConfigError(f"WORLD_SIZE={env.world_size} but {' and '.join(missing)} not set: start the processes with torchrun")
    return env


def device_for(env: Env, device: torch.device) -> torch.device:
    """Under torchrun each process drives one GPU, cuda:LOCAL_RANK (on every node)."""
    if env.world_size == 1 or device.type != "cuda":
        return device
    if device.index is not None:
        raise ConfigError(f"--device {device}: under torchrun every process uses cuda:LOCAL_RANK; pass --device cuda (or auto)")
    count = torch.cuda.device_count()
    if env.local_rank >= count:
        raise ConfigError(f"LOCAL_RANK {env.local_rank}, but this machine has {count} GPU(s); start at most {count} processes per node")
    device = torch.device("cuda", env.local_rank)
    torch.cuda.set_device(device)
    return device


class Group:
    """This process's place in the job. With one process every method returns at once."""

    def __init__(self, env: Env, device: torch.device, timeout: float = 600.0):
        self.rank, self.world_size = env.rank, env.world_size
        self.device, self.timeout = device, timeout
        self.is_main = env.rank == 0
        self._host_group: Any = None  # gloo group for Python objects and counts (the default one on CPU)
        self._patient_group: Any = None  # gloo group whose barrier has no practical timeout

    # ---- set-up ------------------------------------------------------------------------
    def start(self) -> "Group":
        if self.world_size == 1:
            return self
        import torch.distributed as dist

        backend = "nccl" if self.device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=self.timeout)
        kwargs: dict[str, Any] = {"device_id": self.device} if backend == "nccl" else {}
        try:
            dist.init_process_group(backend, timeout=timeout, **kwargs)
            if backend == "nccl":  # host-side values travel over gloo: no GPU sync for a count
                self._host_group = dist.new_group(backend="gloo", timeout=timeout)
            self._patient_group = dist.new_group(backend="gloo", timeout=timedelta(days=7))  # barrier(patient=True)
        except (RuntimeError, ValueError) as error:
            raise DistributedError(
                f"rank {self.rank}: could not join the other {self.world_size - 1} process(es) within --dist-timeout "
                f"{self.timeout:g}s ({_first_line(error)}); check that every rank started and reaches MASTER_ADDR:MASTER_PORT"
            ) from None
        log.info(f"distributed: {self.world_size} processes ({backend}), --dist-timeout {self.timeout:g}s")
        return self

    def wrap(self, module: nn.Module) -> Optional[nn.Module]:
        """DistributedDataParallel around module, or None on one process."""
        if self.world_size == 1:
            return None
        import inspect

        from torch.nn.parallel import DistributedDataParallel as DDP

        # The model's only buffer (sinusoidal positions) is the same everywhere: never re-broadcast it.
        params = inspect.signature(DDP.__init__).parameters
        buffers = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
        with self.guard("setting up DistributedDataParallel"):
            return DDP(module, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                       gradient_as_bucket_view=True, **buffers)

    # ---- collectives ---------------------------------------------------------------------
    def guard(self, what: str):
        return _Guard(self, what)

    def lost(self, error: BaseException, what: str = "training") -> DistributedError:
        return DistributedError(
            f"rank {self.rank}: {what} failed: another process exited, hung for more than --dist-timeout {self.timeout:g}s, "
            f"or cannot be reached ({_first_line(error)})"
        )

    def sum_int(self, value: int) -> int:
        """The sum of value over all ranks (e.g. target tokens of one update)."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        with self.guard("summing token counts"):
            dist.all_reduce(t, group=self._host_group)
        return int(t.item())

    def from_main(self, value: Any) -> Any:
        """Rank 0's value on every rank (decisions that depend on a clock must be the same everywhere)."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        box = [value]
        with self.guard("agreeing with rank 0"):
            dist.broadcast_object_list(box, src=0, group=self._host_group)
        return box[0]

    def gather(self, value: Any) -> Optional[list]:
        """Every rank's value, in rank order, on rank 0 (None elsewhere)."""
        if self.world_size == 1:
            return [value]
        import torch.distributed as dist

        out: Optional[list] = [None] * self.world_size if self.is_main else None
        with self.guard("gathering state on rank 0"):
            dist.gather_object(value, out, dst=0, group=self._host_group)
        return out

    def sum_floats(self, values: list[float]) -> list[float]:
        """The element-wise sums over all ranks (float64), the same on every rank."""
        if self.world_size == 1:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        with self.guard("adding up validation figures"):
            dist.all_reduce(t, group=self._host_group)
        return t.tolist()

    def all_gather(self, value: Any) -> list:
        """Every rank's value, in rank order, on every rank."""
        if self.world_size == 1:
            return [value]
        import torch.distributed as dist

        out: list = [None] * self.world_size
        with self.guard("gathering validation results"):
            dist.all_gather_object(out, value, group=self._host_group)
        return out

    def check_same(self, value: Any, what: str) -> None:
        """Stop when ranks see different things (e.g. a SAVE_DIR that is not shared by all nodes)."""
        if self.world_size == 1:
            return
        import torch.distributed as dist

        values: list = [None] * self.world_size
        with self.guard(f"comparing {what}"):
            dist.all_gather_object(values, value, group=self._host_group)
        if any(v != values[0] for v in values):
            seen = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            raise DistributedError(f"the processes disagree on {what} ({seen})")

    def barrier(self, what: str = "waiting for the other processes", patient: bool = False) -> None:
        """Wait for every rank. patient=True: without --dist-timeout (rank 0 preparing data can take
        longer than any collective should; a rank that fails exits, and torchrun stops the rest)."""
        if self.world_size == 1:
            return
        import torch.distributed as dist

        with self.guard(what):
            dist.barrier(group=self._patient_group if patient else self._host_group)


class _Guard:
    """A failed or timed-out collective -> DistributedError naming this rank and the timeout."""

    def __init__(self, group: Group, what: str):
        self.group, self.what = group, what

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is not None and isinstance(error, RuntimeError) and not isinstance(error, DistributedError):
            raise self.group.lost(error, self.what) from None
        return False


def start(env: Env, device: torch.device, timeout: float) -> Group:
    return Group(env, device, timeout).start()


def close() -> None:
    """Leave the process group, if this process joined one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_comm_error(error: BaseException) -> bool:
    """Does a RuntimeError (e.g. from DDP's all-reduce inside backward) come from the communication?"""
    import torch.distributed as dist

    base = getattr(dist, "DistError", None)
    if base is not None and isinstance(error, base):
        return True
    text = str(error)
    return any(s in text for s in ("Gloo", "gloo", "NCCL", "Connection closed", "Connection reset", "Timed out", "timed out"))


# ---- data: which rank trains on which batch -------------------------------------------------
def update_batches(shard: list, update_freq: int) -> list[list]:
    """This rank's share of an epoch (data.shard_batches: global batches r, r+W, r+2W, ...)
    grouped into updates of update_freq micro-batches: update k, micro-batch j of rank r is the
    epoch's global batch k*W*F + j*W + r. The tail that cannot fill an update on every rank is
    dropped (every rank's share has the same length, so every rank makes the same number of
    updates); those pairs come back in the next epoch's shuffle."""
    n = len(shard) // update_freq
    return [shard[k * update_freq:(k + 1) * update_freq] for k in range(n)]


def resume_position(updates_done: int, saved_world: int, world: int) -> int:
    """Updates already made in the current epoch, converted to a new number of processes (the
    same --update-freq, which resume requires): the same count of global batches consumed,
    rounded up (a few batches of that epoch are skipped)."""
    if saved_world == world:
        return updates_done
    return math.ceil(updates_done * saved_world / world)


# ---- RNG state: each rank has its own dropout stream ---------------------------------------
def rng_state(device: torch.device) -> dict[str, Any]:
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def rank_seed(seed: int, rank: int) -> int:
    """Dropout seed of a rank; rank 0 keeps the run's seed (so one process is unchanged)."""
    return seed + 1000003 * rank


# ---- fault injection (tests) ------------------------------------------------------------------
def slow_preparation_point(group: Group) -> None:
    """Test hook: SEQTOOL_FAULT=rank0-slow-prepare-<S> makes rank 0's data preparation S seconds longer
    (longer than --dist-timeout: the others must still wait for it)."""
    match = re.fullmatch(r"rank0-slow-prepare-(\d+)", os.environ.get(FAULT_ENV, ""))
    if match and group.is_main:
        time.sleep(int(match.group(1)))


def fault_point(group: Group, updates: int) -> None:
    """Test hook: SEQTOOL_FAULT=rank<R>-hang|exit fires on rank R before its second update."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec or updates != 1 or spec.startswith("rank0-slow-prepare"):
        return
    match = re.fullmatch(r"rank(\d+)-(hang|exit)", spec)
    if not match:
        raise ConfigError(f"{FAULT_ENV}={spec!r}: expected rank<R>-hang or rank<R>-exit (a test hook)")
    if int(match.group(1)) != group.rank:
        return
    log.error(f"rank {group.rank}: {FAULT_ENV}={spec}: injected fault")
    if match.group(2) == "exit":
        os._exit(17)
    while True:  # hang (torchrun's SIGTERM still ends it)
        time.sleep(1.0)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200]}" if text else type(error).__name__

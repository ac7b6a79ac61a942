"""LoRAManager: which adapters sit in the device slots, and which wait on the host.

* ``add(lora_request)`` (at add_request time): reads and checks the adapter
  (``adapter.py``) into the host cache, so a bad adapter fails the request
  before any work starts. The host cache keeps at most ``max_cpu_loras``
  adapters (least recently used dropped; re-read from disk when needed again).
* ``admit(request, running)`` (the scheduler's admission check, before a
  waiting request is admitted): makes sure its adapter has a device slot. A
  free slot is filled; else the least recently used adapter that no running
  request holds is evicted; if every slot is held, returns False and the
  request waits in the queue until a running request of another adapter ends.
* ``slot_of(lora_int_id)``: the slot of a running request's adapter (-1: the
  base model) for the step's per-token slot array; marks it recently used.

Host only: the device write is the ``write(slot, values)`` callback.
"""

from __future__ import annotations

import collections
from typing import Callable

from pagedjax.lora.adapter import load_adapter
from pagedjax.lora.request import LoRARequest


class LoRAManager:
    def __init__(self, targets: list, max_loras: int, max_rank: int, max_cpu_loras: int,
                 write: Callable[[int, dict], None]):
        self.targets = targets
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.max_cpu_loras = max(max_cpu_loras, max_loras)
        self._write = write
        self.known: dict[int, LoRARequest] = {}  # lora_int_id -> its request (path)
        self._removed: dict[int, LoRARequest] = {}  # removed, maybe still queued or running
        self._host: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self._slots: collections.OrderedDict[int, int] = collections.OrderedDict()  # id -> slot, LRU first
        self.num_loads = 0  # device slot writes
        self.num_evictions = 0

    # ------------------------------------------------------------------ registry
    def add(self, req: LoRARequest) -> None:
        """Register and read ``req`` (ValueError: bad adapter, id reused for another path)."""
        if not isinstance(req, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {type(req).__name__}")
        old = self.known.get(req.lora_int_id) or self._removed.get(req.lora_int_id)
        if old is not None and (old.lora_path != req.lora_path):
            raise ValueError(f"lora_int_id {req.lora_int_id} is already adapter "
                             f"{old.lora_name!r} at {old.lora_path!r}; give {req.lora_name!r} "
                             "its own id")
        self._host_tables(req)  # read + validate now, not inside a step
        self._removed.pop(req.lora_int_id, None)
        self.known[req.lora_int_id] = req

    def validate(self, req: LoRARequest) -> None:
        """Read and check ``req``'s adapter; touches no state (any thread)."""
        if not isinstance(req, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {type(req).__name__}")
        load_adapter(req.lora_path, self.targets, self.max_rank)

    def remove(self, lora_int_id: int) -> bool:
        """Forget an adapter's host copy. Requests already queued with it still run
        (it is re-read if needed); its slot ages out like any other. Its id stays
        bound to its path (a new adapter needs a new id). True if it was known."""
        self._host.pop(lora_int_id, None)
        req = self.known.pop(lora_int_id, None)
        if req is not None:
            self._removed[lora_int_id] = req
        return req is not None

    def _host_tables(self, req: LoRARequest) -> dict:
        tables = self._host.get(req.lora_int_id)
        if tables is None:
            tables = load_adapter(req.lora_path, self.targets, self.max_rank)
            self._host[req.lora_int_id] = tables
            while len(self._host) > self.max_cpu_loras:
                self._host.popitem(last=False)
        self._host.move_to_end(req.lora_int_id)
        return tables

    # ------------------------------------------------------------------ slots
    def admit(self, request, running) -> bool:
        """The scheduler's admission check for a waiting ``request`` (see above)."""
        lid = getattr(request, "lora_int_id", 0)
        if not lid:
            return True
        if lid in self._slots:
            self._slots.move_to_end(lid)
            return True
        used = set(self._slots.values())
        free = next((s for s in range(self.max_loras) if s not in used), None)
        if free is None:
            held = {getattr(r, "lora_int_id", 0) for r in running}
            victim = next((i for i in self._slots if i not in held), None)
            if victim is None:
                return False  # every slot is held: wait
            free = self._slots.pop(victim)
            self.num_evictions += 1
        req = self.known.get(lid) or self._removed[lid]
        self._write(free, self._host_tables(req))
        self._slots[lid] = free
        self.num_loads += 1
        return True

    def warmup(self) -> None:
        """Compile the slot write once (zeros into slot 0, which holds no adapter yet)."""
        import numpy as np

        if self._slots:
            return
        self._write(0, {t.path: (np.zeros((t.in_features, len(t.parts) * self.max_rank),
                                          np.float32),
                                 np.zeros((len(t.parts) * self.max_rank, *t.out_shape),
                                          np.float32)) for t in self.targets})

    def slot_of(self, lora_int_id: int) -> int:
        """Device slot of an adapter in a running request (-1: base model)."""
        if not lora_int_id:
            return -1
        self._slots.move_to_end(lora_int_id)
        return self._slots[lora_int_id]

    def resident(self) -> dict[int, int]:
        """lora_int_id -> slot of the adapters on the device, least recently used first."""
        return dict(self._slots)

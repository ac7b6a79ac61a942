"""Stored responses for ``previous_response_id`` and ``GET``/``DELETE /v1/responses/{id}``.

In memory, bounded: at most ``max_items`` responses, the least recently used
dropped first. Each entry keeps the response object and the conversation that
led to it (the messages given to the chat template, with this response's output
as the last assistant message), so a follow-up continues it.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Optional

DEFAULT_MAX_ITEMS = 1000


@dataclass
class StoredResponse:
    response: dict
    messages: list[dict]


class ResponseStore:
    def __init__(self, max_items: int = DEFAULT_MAX_ITEMS, enabled: bool = True):
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        self.max_items = max_items
        self.enabled = enabled
        self._items: "collections.OrderedDict[str, StoredResponse]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, entry: StoredResponse) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._items[entry.response["id"]] = entry
            self._items.move_to_end(entry.response["id"])
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> Optional[StoredResponse]:
        with self._lock:
            entry = self._items.get(response_id)
            if entry is not None:
                self._items.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._items)

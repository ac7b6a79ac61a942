"""LoRARequest: which adapter a request runs with (vLLM's name and fields)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LoRARequest:
    """An adapter: a unique name, a unique positive integer id, and its PEFT folder.

    ``lora_int_id`` identifies the adapter in the engine (slots, prefix cache);
    reusing an id for another path is an error. ``base_model_name`` is what the
    server lists as the adapter's ``parent`` (default: the served model).
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest: lora_name must be a non-empty string, "
                             f"got {self.lora_name!r}")
        if (not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool)
                or self.lora_int_id < 1):
            raise ValueError(f"LoRARequest {self.lora_name!r}: lora_int_id must be an integer "
                             f">= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"LoRARequest {self.lora_name!r}: lora_path must be the adapter "
                             f"folder, got {self.lora_path!r}")

    # vLLM's aliases
    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

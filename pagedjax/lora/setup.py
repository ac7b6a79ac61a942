"""Wiring LoRA into an engine: the model's slot tables, the manager and its device writes."""

from __future__ import annotations

from typing import Callable

from pagedjax.models.lora import LoRASpec
from pagedjax.lora.device import SlotWriter, init_tables
from pagedjax.lora.manager import LoRAManager


def enable_lora(model, params: dict, args, mesh=None):
    """-> (model with slot tables, params with zero tables). ValueError when the
    architecture has no LoRA support."""
    model = model.with_lora(LoRASpec(args.max_loras, args.max_lora_rank))
    return model, init_tables(model, params, mesh)


def make_manager(model, args, get_runner: Callable) -> LoRAManager:
    """The manager; its writes replace ``get_runner().params`` (the tables in place)."""
    writer = SlotWriter()

    def write(slot: int, values: dict) -> None:
        runner = get_runner()
        runner.params = writer.write(runner.params, slot, values)

    return LoRAManager(model.lora_targets, args.max_loras, args.max_lora_rank,
                       args.max_cpu_loras or args.max_loras, write)

"""Multi-LoRA serving: PEFT adapters on one base model, mixed in every batch.

    from pagedjax import LLM, LoRARequest
    llm = LLM(model, enable_lora=True, max_loras=4, max_lora_rank=16)
    llm.generate(prompts, params, lora_request=LoRARequest("sql", 1, "/path/to/adapter"))

* ``request.py``  LoRARequest (vLLM's names)
* ``adapter.py``  a PEFT folder (adapter_config.json + adapter_model.safetensors) -> host
                  slot values per target projection, validated, without torch
* ``manager.py``  LoRAManager: the device slots (LRU, never evicting an adapter a
                  running request holds), the host cache, the scheduler's admission check
* ``device.py``   writes one slot of the device tables in place (one compiled program)

The model side (slot tables on the projections, the grouped delta) is
``models/lora.py``. See ``docs/lora.md``.
"""

from pagedjax.lora.request import LoRARequest

__all__ = ["LoRARequest"]

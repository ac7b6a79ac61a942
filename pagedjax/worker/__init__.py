"""The device side of a step: padded inputs, page tables, packing, the jitted step (runner) and warm-up."""

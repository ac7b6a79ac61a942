"""The engine: LLMEngine (text in, outputs out), EngineCore (schedule -> run -> update), AsyncLLM."""

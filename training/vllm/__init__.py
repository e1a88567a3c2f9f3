"""Planner generation on vLLM during training: TRL's engine, or a server taking LoRA adapters."""

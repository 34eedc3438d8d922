"""The OpenAI-compatible HTTP gateway: no torch, no vLLM; Redis in front of the workers."""

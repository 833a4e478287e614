"""What speculative decoding the engine runs: :class:`SpeculativeConfig` (vLLM's names), defined
beside :class:`~engine.EngineConfig` in ``engine/config.py``, which the model-free layers import too."""

from engine.config import DEFAULT_PROMPT_LOOKUP_MAX, DEFAULT_PROMPT_LOOKUP_MIN, SPECULATIVE_METHODS, SpeculativeConfig

__all__ = ["DEFAULT_PROMPT_LOOKUP_MAX", "DEFAULT_PROMPT_LOOKUP_MIN", "SPECULATIVE_METHODS", "SpeculativeConfig"]

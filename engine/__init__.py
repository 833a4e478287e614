"""PagedAttention Lab's serving engine: a small vLLM, one scheduler iteration at a time."""

from engine.attention import paged_attention_reference, paged_prefill_reference, write_kv_cache

__all__ = ["paged_attention_reference", "paged_prefill_reference", "write_kv_cache"]

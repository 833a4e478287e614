"""Measurement tools: the throughput bench against transformers (and vLLM), the CPU kernel bench, the bandwidth roofline and the precision check."""

"""The serving core: sequences, the scheduler, KV block management, prefix caching, memory accounting and beam search. Torch-free (vLLM v1: ``vllm/v1/core``)."""

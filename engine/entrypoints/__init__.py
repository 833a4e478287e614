"""Ways into the engine from outside Python: an OpenAI-compatible HTTP server (``openai/``) over
:class:`~engine.entrypoints.async_llm.AsyncLLM`, the engine stepped in the background of an event loop
(vLLM's ``vllm/entrypoints`` and ``AsyncLLM``)."""

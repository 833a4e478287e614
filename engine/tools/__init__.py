"""Command-line tools beside the engine: ``bench_serve`` loads an OpenAI-compatible server and measures it."""

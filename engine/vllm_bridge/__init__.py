"""Real vLLM beside the lab: its own environment, a process that drives it, and step-by-step comparison and replay against the engine."""

"""The model-free serving simulator: the engine's own scheduler and KV allocators on lengths alone, timed by a step-time cost model. Torch-free."""

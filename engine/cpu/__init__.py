"""The engine's C++ CPU kernels (``csrc/``, built on first use) and the placement of the KV pools in huge pages."""

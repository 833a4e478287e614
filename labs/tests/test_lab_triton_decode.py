"""Lab triton_decode: the engine's Triton decode kernel (Triton's interpreter on a CPU) equals dense attention."""

import paged_kernels  # first: on a CPU it switches Triton to its interpreter before Triton loads
import pytest
import torch

from engine.model_executor.model_runner import triton_backend  # noqa: E402 - plugs the chosen kernel in

from test_lab_paged_attention import dense, paged_case  # noqa: E402


@pytest.mark.parametrize("lens, block_size", [([5, 13, 1, 8], 4), ([20, 3], 16)])
def test_the_kernel_equals_dense_attention(lens, block_size):
    decode = triton_backend().decode
    q, k_cache, v_cache, tables, context_lens, contexts = paged_case(lens, block_size=block_size, head_dim=16)
    out = decode(q, k_cache, v_cache, tables, context_lens, 0.25)
    assert torch.isfinite(out).all(), "NaN or inf in the output: masked tokens must weigh exp2(-inf) = 0"
    for s, (keys, values) in enumerate(contexts):
        expected = dense(q[s], keys, values, 0.25)
        assert torch.allclose(out[s], expected, atol=1e-4), \
            f"sequence {s} (context {lens[s]}, block size {block_size}): differs from dense attention"

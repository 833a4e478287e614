"""What each attention layer needs from the KV cache, and how layers are grouped over one pool
(vLLM v1's ``vllm/v1/kv_cache_interface.py`` and the grouping of ``vllm/v1/core/kv_cache_utils.py``).

A model may mix attention types: Gemma 3 interleaves five sliding-window layers (each token attends to
the last ``sliding_window`` tokens) with one full-attention layer. Each layer has a *KV cache spec*;
layers with equal specs form a type, and each type is cut into *KV cache groups* of ``group_size``
layers. Every group has its own block table per request, over one shared pool of equal-sized pages:
layer ``j`` of every group stores its K and V in the same tensor (``KVCacheTensor.shared_by``), so a
page (block) holds the same bytes whatever group it serves, and any free block serves any group.

Gemma 3 270M (15 sliding + 3 full layers): group_size = 3, so 5 sliding-window groups and 1
full-attention group of 3 layers each, and 3 KV tensors. A model of one attention type is one group of
all its layers: the pool and block table the lab always had.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FULL_ATTENTION = "full_attention"
SLIDING_WINDOW = "sliding_window"


@dataclass(frozen=True)
class FullAttentionSpec:
    """A layer whose queries attend to every earlier token (vLLM's ``FullAttentionSpec``).

    Attributes:
        block_size: token slots per block.
        num_kv_heads, head_size: K and V heads and their dimension.
        dtype_size: bytes per element of the cache (4 for fp32).
    """

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype_size: int = 4

    attention_type = FULL_ATTENTION
    sliding_window: int | None = None

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer: K and V, ``2 * block_size * num_kv_heads * head_size * dtype_size``."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype_size

    def max_memory_usage_bytes(self, max_model_len: int) -> int:
        """Bytes one request of ``max_model_len`` tokens can hold in one layer: every block of it."""
        return -(-max_model_len // self.block_size) * self.page_size_bytes


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    """A layer whose query at position ``p`` attends to positions ``p - sliding_window + 1 .. p``
    (vLLM's ``SlidingWindowSpec``). A block all of whose tokens lie before every future query's
    window is no longer needed and is freed (``SlidingWindowManager.remove_skipped_blocks``).

    Attributes:
        sliding_window: tokens each query sees, itself included (Gemma 3: 512).
    """

    sliding_window: int = 0
    attention_type = SLIDING_WINDOW

    def __post_init__(self) -> None:
        if self.sliding_window < 1:
            raise ValueError(f"a sliding window covers at least 1 token, got {self.sliding_window}")

    def max_memory_usage_bytes(self, max_model_len: int) -> int:
        """At most the window's blocks, one more for a window not aligned to blocks, and the block
        being written: ``ceil((sliding_window - 1) / block_size) + 1`` blocks (vLLM's rule)."""
        num_tokens = min(self.sliding_window - 1 + self.block_size, max_model_len)
        return (-(-num_tokens // self.block_size) + 1) * self.page_size_bytes


KVCacheSpec = FullAttentionSpec  # SlidingWindowSpec is one too


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers that share one block table per request (vLLM's ``KVCacheGroupSpec``).

    Attributes:
        layer_names: the model's layer indices in the group, in model order.
        kv_cache_spec: their common spec.
    """

    layer_names: tuple[int, ...]
    kv_cache_spec: KVCacheSpec


@dataclass(frozen=True)
class KVCacheTensor:
    """One K/V tensor of the pool and the layers that share it (vLLM's ``KVCacheTensor``).

    Attributes:
        size: bytes (``num_blocks * page_size_bytes``).
        shared_by: one layer of each group: layer ``j`` of every group.
    """

    size: int
    shared_by: tuple[int, ...]


@dataclass(frozen=True)
class KVCacheConfig:
    """The pool and its groups (vLLM's ``KVCacheConfig``).

    Attributes:
        num_blocks: pages in the pool; each serves any group.
        kv_cache_tensors: one per layer position in a group (``group_size`` of them).
        kv_cache_groups: the groups, types in order of first appearance in the model.
    """

    num_blocks: int
    kv_cache_tensors: tuple[KVCacheTensor, ...]
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    layer_to_group: dict[int, int] = field(default_factory=dict, compare=False)

    @property
    def group_size(self) -> int:
        return len(self.kv_cache_tensors)

    def tensor_index(self, layer: int) -> int:
        """Which KV tensor ``layer`` stores its K and V in: its place in its group."""
        return self.kv_cache_groups[self.layer_to_group[layer]].layer_names.index(layer)

    @property
    def is_hybrid(self) -> bool:
        return len({g.kv_cache_spec for g in self.kv_cache_groups}) > 1


def layer_specs(num_layers: int, block_size: int, num_kv_heads: int, head_size: int, dtype_size: int = 4,
                sliding_window: int | None = None, layer_types: list[str] | None = None) -> dict[int, KVCacheSpec]:
    """Each layer's spec from a model's shape: ``layer_types[i]`` is ``"full_attention"`` or
    ``"sliding_window"`` (transformers' ``config.layer_types`` spells the latter
    ``"sliding_attention"``; both are accepted). None: every layer full attention.

    Raises:
        ValueError: a sliding layer without a window, a list of the wrong length or an unknown type.
    """
    types = layer_types or [FULL_ATTENTION] * num_layers
    if len(types) != num_layers:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {num_layers}")
    specs: dict[int, KVCacheSpec] = {}
    for i, kind in enumerate(types):
        if kind == FULL_ATTENTION:
            specs[i] = FullAttentionSpec(block_size, num_kv_heads, head_size, dtype_size)
        elif kind in (SLIDING_WINDOW, "sliding_attention"):
            if not sliding_window:
                raise ValueError(f"layer {i} is sliding-window attention but the model gives no sliding_window")
            specs[i] = SlidingWindowSpec(block_size, num_kv_heads, head_size, dtype_size, sliding_window=sliding_window)
        else:
            raise ValueError(f"layer {i}: unknown attention type {kind!r} (full_attention or sliding_window)")
    return specs


def gemma3_layer_types(num_layers: int = 18, pattern: int = 6) -> list[str]:
    """Gemma 3's interleaving: every ``pattern``-th layer full attention, the others sliding window
    (5 local : 1 global; Gemma Team 2025, §2)."""
    return [FULL_ATTENTION if (i + 1) % pattern == 0 else SLIDING_WINDOW for i in range(num_layers)]


def get_kv_cache_groups(kv_cache_spec: dict[int, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """Group layers as vLLM does (``_get_kv_cache_groups_uniform_page_size``): layers of one spec form
    a type; ``group_size`` is the fewest layers of any type (the most, when the most is under 1.5
    times the fewest, to avoid many small groups); each type is cut, in model order, into groups of
    ``group_size`` layers (the last one padded in vLLM; here it is only shorter).

    Raises:
        ValueError: no layers, or specs whose pages differ in size.
    """
    if not kv_cache_spec:
        raise ValueError("a model with no attention layers has no KV cache")
    if len({s.page_size_bytes for s in kv_cache_spec.values()}) > 1:
        raise ValueError("every layer's page must hold the same bytes (same block_size, heads, head size and dtype)")
    same_type: dict[KVCacheSpec, list[int]] = {}
    for layer, spec in kv_cache_spec.items():
        same_type.setdefault(spec, []).append(layer)
    sizes = [len(layers) for layers in same_type.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    return [KVCacheGroupSpec(tuple(layers[i : i + group_size]), spec)
            for spec, layers in same_type.items() for i in range(0, len(layers), group_size)]


def get_kv_cache_config(kv_cache_spec: dict[int, KVCacheSpec], num_blocks: int) -> KVCacheConfig:
    """The pool of ``num_blocks`` pages and its groups: ``group_size`` tensors of
    ``num_blocks * page_size_bytes`` bytes, tensor ``j`` shared by layer ``j`` of every group (vLLM's
    ``get_kv_cache_config_from_groups``)."""
    groups = get_kv_cache_groups(kv_cache_spec)
    group_size = max(len(g.layer_names) for g in groups)
    page = next(iter(kv_cache_spec.values())).page_size_bytes
    tensors = tuple(KVCacheTensor(num_blocks * page, tuple(g.layer_names[j] for g in groups if j < len(g.layer_names)))
                    for j in range(group_size))
    layer_to_group = {layer: gi for gi, g in enumerate(groups) for layer in g.layer_names}
    return KVCacheConfig(num_blocks, tensors, tuple(groups), layer_to_group)


def kv_bytes_per_request(kv_cache_spec: dict[int, KVCacheSpec], num_tokens: int) -> int:
    """Bytes of KV one request of ``num_tokens`` tokens holds at its end, in whole blocks: a
    full-attention layer every block of its tokens, a sliding-window layer only the blocks that
    still hold a token inside the window of the next query (``SlidingWindowManager``'s rule)."""
    total = 0
    for spec in kv_cache_spec.values():
        blocks = -(-num_tokens // spec.block_size)
        if spec.attention_type == SLIDING_WINDOW:
            blocks -= max(0, num_tokens - spec.sliding_window + 1) // spec.block_size
        total += blocks * spec.page_size_bytes
    return total

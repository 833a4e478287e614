# 26 prompt tokens = 1 full block + 10 tokens. With 26 + 7 = 33 tokens each sample's table has
# ceil(33 / 16) = 3 blocks, so 4 samples without sharing would hold 4 * 3 = 12 blocks.
# Only the full prompt block is still shared (refcount 4): 3 of its 4 copies are saved. The partly
# filled block was copied by 3 samples at their first write, and the third block is each sample's own.
blocks_saved = (4 - 1) * (26 // 16)
memory_saved = blocks_saved / (4 * -(-(26 + 7) // 16))

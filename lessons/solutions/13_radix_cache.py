# Section 2 evicted, least recently used leaf first and each leaf's last block first: A's two blocks, B's two,
# then the system prompt's third block (its node became a leaf). The CPU tier of 4 took all 5 and dropped the
# least recently used, A's second block. A's second turn (26 prompt tokens, at most (26 - 1) // 4 = 6 blocks)
# finds the system prompt's first 2 blocks on the GPU, then the 3rd and A's first block in the tier; A's second
# block is in neither, and a hit is a run of leading blocks: it stops there.
predicted_cached_tokens = 4 * 4
predicted_loaded_tokens = 2 * 4

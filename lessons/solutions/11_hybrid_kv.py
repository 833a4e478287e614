# After the step that computes token 1,299 (num_computed_tokens = 1,300): the full-attention group holds
# ceil(1300 / 16) = 82 blocks. Each sliding-window group freed, at the start of that step, the blocks
# wholly before the window of the query at position 1,299: tokens 0 .. 1299 - 512 = 787, so 788 // 16 =
# 49 blocks; it holds 82 - 49 = 33. Five sliding groups and one full group: 82 + 5 * 33 = 247.
blocks_in_use = 82 + 5 * (82 - (1300 - 1 - 512 + 1) // 16)

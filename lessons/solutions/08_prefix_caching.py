# Request 2's table is [0, 1, 2, 7, 8, 9, 4, 3]; its first 16 tokens sit in blocks 0, 1, 2, 7, all full and
# cached, and (18 - 1) // 4 = 4 blocks may hit: all four do.
predicted_hits = [0, 1, 2, 7]
# After Time 7 the queue is 6 5 3 4 9 8 7 2 1 0 (6 5 left over, then request 2's blocks in reverse).
# Touching the hits leaves 6 5 3 4 9 8; the one new block comes from the head: block 6, request 1's last
# block, which was full (14 prompt tokens + 2 decoded = 16) and so cached: it is evicted.
predicted_evicted = 6

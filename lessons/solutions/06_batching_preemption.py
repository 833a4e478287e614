# Static: batches [3, 9, 5, 12] and [2, 7], each runs as long as its longest request.
static_steps = max(3, 9, 5, 12) + max(2, 7)
# Continuous, 4 places: 3, 9, 5, 12 start at step 0; the 3-token request ends at step 2, so the 2-token
# one runs in steps 3-4; the 5-token one ends at step 4, so the 7-token one runs in steps 5-11; the
# 12-token one also ends at step 11. Steps 0..11:
continuous_steps = 12

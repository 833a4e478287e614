# A prompt of 30 tokens fills 7 blocks of 4 and 2 slots of an 8th: the prefill instance lends all 8 blocks it holds.
# A block moves whole, every layer's K and V of its 4 slots: 8 x 4 x 46,080 bytes (2 x 30 layers x 3 KV heads x
# 64 x 4 bytes a token). Over 25 GB/s: bytes / 25e9 seconds.
predicted_lent_blocks = 8
predicted_bytes = 8 * 4 * (2 * 30 * 3 * 64 * 4)
predicted_link_ms = predicted_bytes / 25e9 * 1e3

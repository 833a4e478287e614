# K and V, for each of 40 layers and 40 KV heads, 128 numbers of 2 bytes.
opt13b_bytes_per_token = 2 * 40 * 40 * 128 * 2
opt13b_tokens = 12 * 2**30 // opt13b_bytes_per_token

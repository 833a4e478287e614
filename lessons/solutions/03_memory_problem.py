# At step 5 the three admitted requests have cached prompt + 5 tokens each; the fourth waits.
admitted = [(40, 10), (100, 60), (16, 200)]
token_states = sum(p + 5 for p, o in admitted)  # 45 + 105 + 21
reserved = sum((p + o) - (p + 5) for p, o in admitted)  # still to come: 5 + 55 + 195
internal_fragmentation = sum(256 - (p + o) for p, o in admitted)  # never used: 206 + 96 + 40
external_fragmentation = 800 - 3 * 256  # a 32-slot gap, too small for the waiting request's 256
# The paper's pool: 15,700 slots.
orca_max_batch = 15_700 // 2048  # 7 reservations of max_model_len slots
paged_batch = (15_700 // 16) // -(-500 // 16)  # 981 blocks, 32 blocks (512 slots) per 500-token request: 30
# The rate Orca (Max) saturates at: its 7 requests each make one token per decode step, and a request
# stays for as many steps as it has output tokens (Little's law: rate = batch / time in the batch).
mean_output = sum(r.output_len for r in sharegpt) / len(sharegpt)  # 338 tokens
orca_max_saturation_rate = decode_tokens_per_s(orca_max_batch) / mean_output  # 214 tokens/s / 338 = 0.63 req/s

# At step 5 the three admitted requests have cached prompt + 5 tokens each; the fourth waits.
admitted = [(40, 10), (100, 60), (16, 200)]
token_states = sum(p + 5 for p, o in admitted)  # 45 + 105 + 21
reserved = sum((p + o) - (p + 5) for p, o in admitted)  # still to come: 5 + 55 + 195
internal_fragmentation = sum(256 - (p + o) for p, o in admitted)  # never used: 206 + 96 + 40
external_fragmentation = 800 - 3 * 256  # a 32-slot gap, too small for the waiting request's 256
# The paper's pool: 15,700 slots.
orca_max_batch = 15_700 // 2048  # 7 reservations of max_model_len slots
paged_batch = (15_700 // 16) // -(-500 // 16)  # 981 blocks, 32 blocks (512 slots) per 500-token request: 30

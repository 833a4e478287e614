# Each judged draft is accepted with chance alpha: a verification gives 1 + alpha + ... + alpha**k tokens.
tokens_per_step = (1 - alpha ** (k + 1)) / (1 - alpha)
# A plain step makes 1 token in plain_step_ms; a verifying step makes tokens_per_step in verify_step_ms.
speedup_batch1 = tokens_per_step * plain_step_ms / verify_step_ms

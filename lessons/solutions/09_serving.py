# Little's law: max_num_seqs requests in the server, each for output_tokens steps of step_s seconds.
ttft_explodes_at = max_num_seqs / (output_tokens * step_s)

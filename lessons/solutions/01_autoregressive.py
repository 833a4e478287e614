# Every weight is used twice (multiply, add) per request, and read from memory once per step.
step_flops = 2 * (n_linear + n_lm_head) * 8
step_bytes = (n_linear + n_lm_head) * eng.runner.dtype.itemsize

# Logical block position // block_size, mapped through the block table; offset position % block_size.
slot = table[position // block_size] * block_size + position % block_size

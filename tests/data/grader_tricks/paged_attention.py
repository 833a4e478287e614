LAB = "paged_attention"

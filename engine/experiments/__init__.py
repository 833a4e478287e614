"""The PagedAttention paper's experiments (Kwon et al., SOSP 2023), reproduced on the simulator: the paper's figures and the numbers it reports."""

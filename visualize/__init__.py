"""Figures of PagedAttention Lab: engine reports and simulator results in, matplotlib / Altair figures out.

Used by the Streamlit app (app.py) and the lesson notebooks. Every matplotlib figure can be saved
for slides with ``fig.savefig("name.png", dpi=150)``; every Altair chart has a matplotlib twin.
"""

from visualize.colors import CATEGORY_COLORS, FREE_COLOR, request_color
from visualize.i18n import CATALOGUE, LANGUAGES, t
from visualize.kernel import program_grid, program_grid_figure
from visualize.memory import memory_chart, memory_figure, memory_frame, series_figure, simulation_memory_frame
from visualize.pool import (
    block_table_rows,
    block_tables_figure,
    event_log_rows,
    pool_blocks,
    pool_map_chart,
    pool_map_figure,
    pool_map_spec,
    touched_blocks,
)

__all__ = [
    "CATALOGUE", "CATEGORY_COLORS", "FREE_COLOR", "LANGUAGES", "t", "request_color",
    "block_table_rows", "block_tables_figure", "event_log_rows", "pool_blocks", "pool_map_chart", "pool_map_figure", "pool_map_spec",
    "touched_blocks", "memory_chart", "memory_figure", "memory_frame", "series_figure", "simulation_memory_frame",
    "program_grid", "program_grid_figure",
]

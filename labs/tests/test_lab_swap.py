"""Lab swap: room in the CPU pool for a group's distinct blocks; moving block tables between pools."""

from engine.core.block_manager import PagedBlockManager
from engine.core.sequence import SequenceGroup

from labkit import request


def forked_group(kv):
    group = request(0, 6)
    kv.allocate(group)
    parent = group.seqs[0]
    parent.num_computed_tokens = 6
    child = parent.fork(1, 1)
    kv.fork(parent, child)
    child.append_token(3)
    kv.append_slot(child)  # copy-on-write of the second block
    child.num_computed_tokens = 7
    group.seqs.append(child)
    return group


def test_can_swap_out_counts_shared_blocks_once():
    kv = PagedBlockManager(8, 4, watermark=0.0, num_cpu_blocks=3)
    group = forked_group(kv)
    assert kv.can_swap_out(group), "3 distinct blocks (one shared by both sequences) fit 3 CPU blocks"
    small = PagedBlockManager(8, 4, watermark=0.0, num_cpu_blocks=2)
    assert not small.can_swap_out(forked_group(small)), "3 distinct blocks do not fit 2"
    assert not PagedBlockManager(8, 4, watermark=0.0).can_swap_out(request(1, 4)), "no CPU pool, no swap"


def test_swap_out_and_in_keep_the_sharing():
    kv = PagedBlockManager(8, 4, watermark=0.0, num_cpu_blocks=4)
    group = forked_group(kv)
    a, b = group.seqs
    shared = a.block_table[0]
    gpu_tables = [list(a.block_table), list(b.block_table)]
    copies = kv.swap_out(group)
    assert len(copies) == 3 and len({g for g, _ in copies}) == 3, "one copy per distinct block, the shared one once"
    mapping = dict(copies)
    assert [mapping[x] for x in gpu_tables[0]] == a.block_table and [mapping[x] for x in gpu_tables[1]] == b.block_table, \
        "each table now holds the CPU block each GPU block was copied to"
    assert kv.cpu_allocator.ref_counts[mapping[shared]] == 2, "the shared block is shared again on the CPU (refcount 2)"
    assert kv.num_free_blocks == 8, "every GPU block went back to the pool"
    back = kv.swap_in(group)
    assert len(back) == 3 and kv.cpu_allocator.num_free == 4, "swap in copies 3 blocks back and frees the CPU pool"
    assert a.block_table[0] == b.block_table[0] and kv.allocator.ref_counts[a.block_table[0]] == 2

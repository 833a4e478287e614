"""Lab chunked_prefill: the chunk boundary and num_computed_tokens."""

from labkit import request, scheduler


def test_the_chunk_is_what_the_budget_leaves():
    sched = scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=16, enable_chunked_prefill=True)
    g = request(0, 40)
    assert sched._prefill_chunk(g, 40, 16) == 16, "a prompt of 40 under a budget of 16: a chunk of 16"
    assert sched._prefill_chunk(g, 5, 16) == 5, "a short prompt: all of it"
    assert sched._prefill_chunk(g, 5, 0) == 0, "no budget left: 0 (admission stops)"
    off = scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=16)
    assert off._prefill_chunk(g, 40, 16) is None, "chunking off: None, the whole prompt"


def test_a_long_prompt_spans_steps_and_samples_once():
    sched = scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=16, enable_chunked_prefill=True)
    g = request(0, 40)
    sched.add(g)
    seq = g.seqs[0]
    done = []
    for expected in (16, 32, 40):
        out = sched.schedule()
        ready = sched.update_from_output(out)
        assert seq.num_computed_tokens == expected, f"after this step {expected} prompt tokens are computed, not {seq.num_computed_tokens}"
        done.append(bool(ready))
    assert done == [False, False, True], "only the step that computes the last prompt token samples"
    assert seq.is_prefill is False, "is_prefill is cleared once every token is computed"


def test_decodes_advance_by_one():
    sched = scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=16)
    g = request(0, 5)
    sched.add(g)
    for seq in sched.update_from_output(sched.schedule()):
        seq.append_token(1)
    out = sched.schedule()
    assert out.decode_seqs == [g.seqs[0]]
    assert sched.update_from_output(out) == [g.seqs[0]] and g.seqs[0].num_computed_tokens == 6

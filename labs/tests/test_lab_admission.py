"""Lab admission: vLLM v1's rule, the token budget and the memory, head-of-line first come first served."""

from labkit import request, scheduler


def admitted(sched):
    out = sched.schedule()
    return [s.request_id for s in out.prefill_seqs]


def test_the_token_budget_stops_admission_in_order():
    sched = scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=16)
    for i, n in enumerate((10, 10, 4)):
        sched.add(request(i, n))
    assert admitted(sched) == [0], "10 + 10 > 16: the second waits, and the third waits behind it (first come, first served)"


def test_prompts_that_fit_the_budget_join_together():
    sched = scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=16)
    for i, n in enumerate((6, 6, 4)):
        sched.add(request(i, n))
    assert admitted(sched) == [0, 1, 2], "6 + 6 + 4 = 16 tokens fit the budget of 16"


def test_decodes_take_their_share_of_the_budget_first():
    sched = scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=16)
    sched.add(request(0, 8))
    sched.add(request(1, 8))
    assert admitted(sched) == [0, 1]
    for seq in sched.update_from_output(_prefilled(sched)):
        seq.append_token(7)
    sched.add(request(2, 15))
    out = sched.schedule()
    assert [s.request_id for s in out.decode_seqs] == [0, 1]
    assert not out.prefill_seqs, "two decodes leave 14 tokens: a prompt of 15 does not fit"


def _prefilled(sched):
    """The output of the step that just prefilled every running request."""
    from engine.core.scheduler_output import SchedulerOutput

    return SchedulerOutput(prefill_seqs=[g.seqs[0] for g in sched.running])


def test_memory_stops_admission():
    sched = scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    sched.add(request(0, 12))
    sched.add(request(1, 8))
    assert admitted(sched) == [0], "12 tokens take 3 of 4 blocks: 8 more tokens (2 blocks) do not fit"


def test_max_num_seqs_caps_the_batch():
    sched = scheduler(num_blocks=32, block_size=4, max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(3):
        sched.add(request(i, 2))
    assert admitted(sched) == [0, 1]


def test_a_chunk_always_fits_its_budget():
    sched = scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=16, enable_chunked_prefill=True)
    sched.add(request(0, 40))
    out = sched.schedule()
    assert [s.request_id for s in out.prefill_seqs] == [0], "with chunked prefill a long prompt is admitted with a chunk"
    assert out.num_scheduled_tokens[0] == 16

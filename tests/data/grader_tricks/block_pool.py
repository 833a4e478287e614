LAB = "block_pool"
_Q, _A = FreeBlockQueue, BlockAllocator  # the engine's own classes, in the namespace this file runs in


class FreeBlockQueue:
    popleft, append, remove = _Q.popleft, _Q.append, _Q.remove


class BlockAllocator:
    allocate, incref, touch, free = _A.allocate, _A.incref, _A.touch, _A.free

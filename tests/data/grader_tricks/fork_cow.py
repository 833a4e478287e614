LAB = "fork_cow"
import engine.core.block_manager as _m

_fork, _cow = _m.PagedBlockManager.fork, _m.PagedBlockManager._copy_on_write


class PagedBlockManager:
    def fork(self, *args, **kwargs):
        return _fork(self, *args, **kwargs)

    def _copy_on_write(self, *args, **kwargs):
        return _cow(self, *args, **kwargs)

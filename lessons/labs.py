"""The graded labs: one source each, the engine's own module.

A lab is a part of the engine that a student writes (``engine/core/lab_impl.py`` explains the markers and
the seam). This module knows the labs in teaching order (:data:`LABS`: title, instructions in English and
Chinese, the lesson it follows, the expected time) and writes what is cut from the engine:

- ``labs/starters/<lab>.py``: the lab's parts with their signatures and docstrings, each solution region
  replaced by a TODO and ``raise NotImplementedError`` (:func:`cut`);
- a find-the-bug lab's starter: the model answer of the lab it copies, with one bug seeded by its patch
  ``labs/bugs/<lab>.diff`` (a unified diff against that model answer, :func:`apply_patch`);
- a student handout (:func:`write_handout`): the repository with the chosen labs' solution regions cut
  out of the engine (every lab's by default; a week's with ``--labs`` or ``--through-lesson``, added to
  an existing handout with ``--add``), the model answers of the lessons (``lessons/solutions/``), the bug
  patches and the project's own tests left out;
- a Gradescope autograder zip (:func:`write_autograder`).

Usage (from the repository root)::

    python -m lessons labs build          # write labs/starters/ from the engine's modules
    python -m lessons labs check          # exit 1 if a committed starter is out of date
    python -m lessons labs handout DIR    # the students' tree, every lab
    python -m lessons labs handout DIR --through-lesson 4            # the labs of lessons up to 4
    python -m lessons labs handout DIR --labs fork_cow --add         # next week's, into a handout
    python -m lessons labs autograder ZIP [--tests DIR]
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.core.lab_impl import TODO, Part, lab_modules, lab_parts

ROOT = Path(__file__).resolve().parents[1]
LABS_DIR = ROOT / "labs"
STARTERS = LABS_DIR / "starters"
TESTS = LABS_DIR / "tests"
BUGS = LABS_DIR / "bugs"


@dataclass(frozen=True)
class Lab:
    """One graded lab.

    Attributes:
        name: its id (``labs/starters/<name>.py``, ``labs/tests/test_lab_<name>.py``).
        title: (English, Chinese).
        lesson: the lesson (``lessons/src/NN_*``) it follows, by number.
        minutes: expected time for a student.
        goal: what the student writes, (English, Chinese), one paragraph each.
        base: a find-the-bug lab: the lab whose parts it holds a seeded copy of.
        core: in the core term plan (False: optional).
    """

    name: str
    title: tuple[str, str]
    lesson: int
    minutes: int
    goal: tuple[str, str]
    base: str | None = None
    core: bool = True

    @property
    def part_lab(self) -> str:
        """The lab whose engine parts this one's file replaces."""
        return self.base or self.name


LABS: list[Lab] = [
    Lab("block_pool", ("The block pool: allocate, free, free-list order, refcounts", "块池：分配、释放、空闲列表顺序与引用计数"), 4, 40,
        ("The pool's free queue (head out, tail in, removal from the middle) and the allocator's reference counts: "
         "allocate takes the head with refcount 1, free drops one reference and returns the block to the tail at 0, "
         "incref shares a referenced block, touch takes a cached block back, free or not.",
         "块池的空闲队列（从队头取出、放回队尾、从中间移除）与分配器的引用计数：allocate 取队头并置引用计数为 1，free 减一个引用、"
         "归零时把块放回队尾，incref 共享一个已被引用的块，touch 重新引用一个被缓存的块（不论是否空闲）。")),
    Lab("slot_mapping", ("Block tables and slot mapping", "块表与槽位映射"), 4, 30,
        ("How many blocks hold n tokens, growing a block table for a prefill chunk, and the physical slot of each "
         "position: slot = block_table[pos // block_size] * block_size + pos % block_size, for prefill and decode.",
         "n 个 token 需要几个块、为一个预填充分块扩展块表，以及每个位置的物理槽位：slot = block_table[pos // block_size] * block_size + "
         "pos % block_size，预填充与解码都用它。")),
    Lab("append_slot", ("Appending a token: when a new block is needed", "追加 token：何时需要新块"), 4, 30,
        ("Decode's append_slot: a new block only when the new token's position is past the last block, never ahead "
         "of time, so a request wastes less than one block (internal fragmentation); a position inside the table "
         "goes to copy-on-write.",
         "解码时的 append_slot：只有新 token 的位置超出最后一个块时才取新块，从不提前预留，因此每个请求浪费的槽位少于一个块（内部碎片）；"
         "位置在块表之内时交给写时复制。")),
    Lab("fork_cow", ("Fork and copy-on-write", "派生与写时复制"), 7, 45,
        ("fork shares every block of the parent (refcount + 1, a FORK event); a sequence about to write into a "
         "shared block gets its own copy first (COPY_ON_WRITE event, the (src, dst) pair the engine copies).",
         "fork 让子序列共享父序列的所有块（引用计数加一，发出 FORK 事件）；序列要写入共享块之前先得到自己的副本（COPY_ON_WRITE 事件，"
         "返回引擎要复制的 (src, dst)）。")),
    Lab("prefix_cache", ("Prefix caching: the block hash chain, hits, eviction", "前缀缓存：块哈希链、命中与驱逐"), 8, 60,
        ("The hash chain of a prompt's full blocks (each hash covers its parent's), the longest run of cached leading "
         "blocks (token ids and parent checked), caching a written block, and dropping a cached block's hash when "
         "the least recently freed block at the head of the free queue is handed out again (LRU eviction).",
         "提示词满块的哈希链（每个哈希都包含父块的哈希）、已缓存的最长前导块序列（同时核对 token id 与父哈希）、缓存一个写好的块，"
         "以及空闲队列队头那个最早释放的块被重新分配时删除它的哈希（LRU 驱逐）。")),
    Lab("admission", ("Scheduler admission (vLLM v1)", "vLLM v1 调度器的准入规则"), 6, 30,
        ("Whether the request at the head of the waiting queue joins this step: its prompt must fit the token budget "
         "left of max_num_batched_tokens (a chunk always does) and its blocks the free pool less the watermark.",
         "等待队列队头的请求能否加入本步：它的提示词必须放得进 max_num_batched_tokens 剩下的 token 预算（分块总能放下），"
         "它的块必须放得进扣除水位线后的空闲块。")),
    Lab("preemption", ("Preemption: the victim, recompute or swap", "抢占：选择牺牲者，重计算或交换"), 6, 45,
        ("Who is preempted when a running request cannot get its next slot (the newest not yet served this step), "
         "and how: swap its blocks out to the CPU pool when allowed and possible, else free them and put it back at "
         "the front of the waiting queue to be recomputed.",
         "运行中的请求拿不到下一个槽位时抢占谁（本步尚未轮到的最新请求），以及如何抢占：允许且放得下时把它的块换出到 CPU 池，"
         "否则释放它的块，把它放回等待队列最前面等待重计算。")),
    Lab("swap", ("Swapping: the block mapping out and in", "交换：换出与换入的块映射"), 6, 40,
        ("Whether the CPU pool has room for a group's distinct blocks, and moving a group's block tables between the "
         "pools: one new block per distinct block (shared ones once, shared again), the (src, dst) copies, the "
         "source blocks freed.",
         "CPU 池能否放下一个序列组的不同块，以及在两个池之间搬移它的块表：每个不同的块取一个新块（共享块只复制一次、到另一侧再共享），"
         "返回 (src, dst) 复制对，释放源块。")),
    Lab("chunked_prefill", ("Chunked prefill: the chunk boundary and num_computed_tokens", "分块预填充：分块边界与 num_computed_tokens"), 6, 30,
        ("How many prompt tokens a waiting request computes this step under the token budget, and after the step "
         "advancing each sequence's num_computed_tokens by what it computed; only a sequence with every token "
         "computed samples.",
         "在 token 预算下一个等待中的请求本步计算多少个提示词 token，以及一步之后按实际计算量推进每个序列的 num_computed_tokens；"
         "只有全部 token 都已计算的序列才采样。")),
    Lab("paged_attention", ("Paged attention in torch", "用 torch 写分页注意力"), 4, 60,
        ("Decode attention through block tables: translate tables into per-position slots, gather K and V with zeros "
         "past each context, then a masked softmax with grouped-query heads. It must equal dense attention.",
         "通过块表计算解码注意力：把块表转成每个位置的槽位，读出 K 和 V（上下文之外置零），再做带掩码的 softmax，支持分组查询注意力。"
         "结果必须等于稠密注意力。")),
    Lab("triton_decode", ("A Triton paged-attention decode kernel", "Triton 分页注意力解码内核"), 5, 90,
        ("Inside the engine's Triton kernel: gather one block id per token of a tile through the block table, and "
         "the online-softmax update (running max, rescaled sum and accumulator). Runs in Triton's interpreter on a CPU.",
         "在引擎的 Triton 内核里：按块表为一个段中的每个 token 取出块号，以及在线 softmax 的更新（当前最大值、重新缩放的和与累加器）。"
         "在 CPU 上由 Triton 解释器运行。"), core=False),
    Lab("kv_quant", ("An fp8 KV cache: quantize and dequantize with scales", "fp8 KV 缓存：带缩放因子的量化与反量化"), 12, 30,
        ("What an fp8 pool stores and what attention reads back: fp8(x / scale) rounded to the nearest value and "
         "saturated at the format's largest one (448 for e4m3, 57344 for e5m2), fp8 * scale on the way out, and "
         "vLLM's calculate_kv_scales (max|K| / 200, max|V| / 100). Every attention path of the engine reads the pool "
         "your functions write.",
         "fp8 池里存的是什么、注意力读回来的是什么：fp8(x / scale)，舍入到最近的值，超出格式最大值（e4m3 为 448，e5m2 为 57344）"
         "时饱和到最大值；读出时乘回缩放因子；以及 vLLM 的 calculate_kv_scales（max|K| / 200，max|V| / 100）。"
         "引擎的每条注意力路径都读取你的函数写入的池。"), core=False),
    Lab("radix_match", ("The radix tree: match and split", "基数树：匹配与分裂"), 13, 45,
        ("SGLang's radix tree of cached blocks (RadixAttention): walk from the root along a prompt's full blocks, "
         "child by the token ids of its first block, to the longest cached run, and split a node the prompt leaves "
         "part-way so that every match ends on a node boundary.",
         "SGLang 的缓存块基数树（RadixAttention）：从根出发沿提示词的满块向下走（按子节点第一个块的 token id 找子节点），"
         "找到最长的已缓存前缀；提示词在某个节点中途分岔时把该节点分裂，使每次匹配都结束在节点边界上。"), core=False),
    Lab("radix_insert", ("The radix tree: insert and LRU eviction of leaves", "基数树：插入与按 LRU 驱逐叶节点"), 13, 60,
        ("Insert a sequence's newly full blocks under the path it holds (lock counts moved to the new last node, a "
         "block the tree already holds reported so its copy is freed), pick the least recently used unlocked leaf "
         "from a heap with stale entries, and evict its last block.",
         "把一个序列新填满的块插入到它持有的路径之下（锁计数移到新的末节点；树中已有的块要报告出来，以便释放这份副本），"
         "从含有过期条目的堆中选出最久未用的未锁定叶节点，并驱逐它的最后一个块。"), core=False),
    Lab("lpm", ("Cache-aware scheduling: longest prefix match", "缓存感知调度：最长前缀匹配"), 13, 30,
        ("SGLang's LPM order for the waiting queue: preempted requests first, then those waiting too long (the "
         "starvation guard, oldest first), then the rest by their prompt tokens already cached, longest first.",
         "SGLang 的 LPM 等待队列顺序：先是被抢占的请求，再是等得太久的请求（防饥饿，最早到达的在前），"
         "其余的按已缓存的提示词 token 数从多到少排序。"), core=False),
    Lab("kv_connector", ("The KV connector's scheduler side: prefill hands over to decode", "KV 连接器的调度器侧：预填充交接给解码"), 14, 45,
        ("vLLM v1's KV connector between a prefill and a decode instance, its scheduler side: how many prompt tokens "
         "the prefill instance supplies (all but the last, less the local prefix hit, loaded asynchronously), the load "
         "recorded once the decode blocks are allocated (which remote blocks land in which local ones, from which "
         "block on), and on the prefill side a finished request's blocks kept under a lease and the "
         "kv_transfer_params that name them. serve-disagg runs your part in both of its engines.",
         "vLLM v1 在预填充实例与解码实例之间的 KV 连接器，它的调度器侧：预填充实例提供多少个提示词 token（除最后一个之外的全部，"
         "减去本地前缀缓存的命中，异步载入）；解码实例分配好块之后记下这次载入（哪些远端块落到哪些本地块，从第几个块开始）；"
         "以及在预填充一侧，把已完成请求的块在租约下保留，并给出指明这些块的 kv_transfer_params。你的代码在 serve-disagg 的两个引擎里运行。"),
        core=False),
    Lab("spec_verify", ("Speculative decoding: greedy verification", "投机解码：贪心验证"), 10, 20,
        ("Keep the longest prefix of the draft tokens that the target model's argmax agrees with, then the target's "
         "own token at the first disagreement (or the bonus token after all k).",
         "保留草稿 token 中与目标模型 argmax 一致的最长前缀，再接上第一个不一致位置目标模型自己的 token（全部 k 个草稿都被接受时，再加上额外 token）。")),
    Lab("lookahead", ("Speculative decoding: lookahead slots and rollback", "投机解码：前瞻槽位与回滚"), 10, 45,
        ("Tentative slots for k draft tokens from free blocks only (fewer when the pool runs short), and after "
         "verification giving back the rejected drafts' slots, freeing every block left with no verified token.",
         "只用空闲块为 k 个草稿 token 分配暂定槽位（块池不够时少分配），验证之后归还被拒草稿的槽位，并释放不再含有已验证的 token 的块。"), core=False),
    Lab("open_scheduler", ("Open lab: a scheduling policy of your own", "开放实验：自己设计的调度策略"), 9, 90,
        ("Design the order in which waiting requests are offered admission (order_waiting, the scheduler's policy hook, "
         "as vLLM's --scheduler-cls). The simulator runs it on a fixed trace: beat FCFS's TTFT p90 by 10% while keeping "
         "95% of its throughput; grade prints your place against FCFS and the model answer.",
         "设计等待中的请求获得准入机会的顺序（order_waiting，调度器的策略接口，类似 vLLM 的 --scheduler-cls）。模拟器在固定的请求轨迹上运行它："
         "TTFT p90 要比先来先服务低 10%，同时保持其 95% 的吞吐量；grade 会打印你的策略相对先来先服务与参考答案的名次。"), core=False),
    Lab("sliding_window", ("A sliding window: freeing blocks out of the window", "滑动窗口：释放窗口外的块"), 11, 30,
        ("A sliding-window group's remove_skipped_blocks (vLLM v1's): once every token of a block lies before the next "
         "query's window, the block goes back to the pool and its table entry becomes the null block, so the group "
         "holds at most ceil((window - 1) / block_size) + 1 blocks however long the request grows.",
         "滑动窗口组的 remove_skipped_blocks（vLLM v1 的同名函数）：一个块的所有 token 都落在下一个查询的窗口之前时，把块还给块池，"
         "块表里的这一项换成空块（null block），于是无论请求多长，该组最多只占 ceil((window - 1) / block_size) + 1 个块。"), core=False),
    Lab("bug_refcount", ("Find the bug: the block pool", "找错误：块池"), 4, 30,
        ("A copy of the block pool with one bug seeded. Run the tests, read the failing hint, find and fix the line.",
         "块池的一个副本，其中埋了一个错误。运行测试、读失败时给出的线索，找到并修正那一行。"), base="block_pool"),
    Lab("bug_slot", ("Find the bug: slot mapping", "找错误：槽位映射"), 4, 20,
        ("A copy of the block-table and slot-mapping part with one bug seeded.",
         "块表与槽位映射部分的一个副本，其中埋了一个错误。"), base="slot_mapping"),
    Lab("bug_cow", ("Find the bug: fork and copy-on-write", "找错误：派生与写时复制"), 7, 30,
        ("A copy of fork and copy-on-write with one bug seeded.",
         "派生与写时复制部分的一个副本，其中埋了一个错误。"), base="fork_cow", core=False),
]
BY_NAME = {lab.name: lab for lab in LABS}


class LabError(ValueError):
    """A lab that cannot be cut or patched; the message names the lab and the file."""


def get(name: str) -> Lab:
    if name not in BY_NAME:
        raise LabError(f"no lab {name!r}; the labs: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def module_of(lab: Lab) -> Path:
    modules = lab_modules(ROOT)
    if lab.part_lab not in modules:
        raise LabError(f"lab {lab.part_lab}: no `# BEGIN SOLUTION {lab.part_lab}` region in engine/ or paged_kernels/")
    return modules[lab.part_lab]


def _imports(tree: ast.Module, lines: list[str]) -> list[str]:
    out = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (isinstance(node, ast.ImportFrom) and node.module == "engine.core.lab_impl"):
            out.append("".join(lines[node.lineno - 1 : node.end_lineno]))
    return out


def _function_text(part: Part, lines: list[str], lab: str, keep_solution: bool) -> str:
    node = part.node
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    end = max([node.end_lineno] + [r.end for r in part.regions])
    out, skip_to = [], 0
    regions = {r.begin: r for r in part.regions}
    for number in range(start, end + 1):
        if number <= skip_to:
            continue
        region = regions.get(number)
        if region is None:
            out.append(lines[number - 1])
        elif keep_solution:
            out += lines[region.begin : region.end - 1]
            skip_to = region.end
        else:
            out.append(f"{region.indent}{TODO.format(lab=lab)}\n")
            out.append(f'{region.indent}raise NotImplementedError("lab {lab}: {part.qualname}")\n')
            skip_to = region.end
    text = "".join(out)
    return text if text.endswith("\n") else text + "\n"


def cut(lab: Lab, keep_solution: bool = False, seed_bug: bool = True) -> str:
    """The text of a lab's file: a header, the engine module's imports, ``LAB = "<part lab>"`` and
    the lab's parts, each class's with its docstring and ``__init__`` (context, not swapped).
    ``keep_solution``: the model answer (the regions kept, their markers dropped). A find-the-bug
    lab's file is its model answer with its patch applied (``seed_bug=False``: without)."""
    keep_solution = keep_solution or lab.base is not None
    path = module_of(lab)
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    parts = lab_parts(source, str(path))[lab.part_lab]
    rel = path.relative_to(ROOT)
    doc = ast.get_docstring(tree) or ""
    header = [
        f'"""Lab {lab.name}: {lab.title[0]} / {lab.title[1]}.',
        "",
        *_wrap(lab.goal[0]),
        "",
        *_wrap(lab.goal[1]),
        "",
        f"Your part plugs into the engine in place of its own, in {rel} (the engine module's names are in",
        "scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on",
        "each other:",
        "",
        f"    python -m lessons grade {lab.name} --impl labs/mine",
        "",
        f"Cut by `python -m lessons labs build` from {rel}; work on a copy.",
        "",
        f"The module {rel}, for context:",
        "",
        *doc.splitlines(),
        '"""',
        "",
        "",
    ]
    body = ["".join(_imports(tree, lines)), "\n", f'LAB = "{lab.part_lab}"  # the lab whose parts this file holds\n']
    by_class: dict[str, list[Part]] = {}
    for part in parts:
        cls, _, _ = part.qualname.rpartition(".")
        by_class.setdefault(cls, []).append(part)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "" in by_class:
            for part in by_class[""]:
                if part.node.lineno == node.lineno:
                    body += ["\n\n", _function_text(part, lines, lab.name, keep_solution)]
        elif isinstance(node, ast.ClassDef) and node.name in by_class:
            body += ["\n\n", f"class {node.name}:\n"]
            cls_doc = ast.get_docstring(node, clean=False)
            if cls_doc is not None:
                first = node.body[0]
                body.append("".join(lines[first.lineno - 1 : first.end_lineno]))
            given = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name.startswith("__") and f.name.endswith("__")
                     and all(p.node.lineno != f.lineno for p in by_class[node.name])]
            if given:  # __init__ and the other special methods: use len(queue), `in`, iteration, not private attributes
                body.append("\n    # Given (the engine's own, not swapped): the attributes and special methods the parts below use.\n")
                body.append("\n".join("".join(lines[f.lineno - 1 : f.end_lineno]) for f in given))
            for part in by_class[node.name]:
                body += ["\n", _function_text(part, lines, lab.name, keep_solution)]
    text = "\n".join(header) + "".join(body)
    if lab.base is not None and seed_bug:
        text = apply_patch(text, (BUGS / f"{lab.name}.diff").read_text(encoding="utf-8"), f"labs/bugs/{lab.name}.diff")
    return text


def _wrap(text: str, width: int = 100) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) if text.isascii() else [text]  # Chinese: one line (no spaces to break at)


HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_patch(text: str, diff: str, name: str) -> str:
    """Apply a unified diff (``diff -u``) to ``text``. Every context and removed line must match
    exactly, where the hunk says or, as ``patch`` allows, at an offset (the lines above it changed).

    Raises:
        LabError: a hunk whose lines are nowhere after the previous hunk (the model answer changed:
            refresh the patch).
    """
    lines = text.splitlines(keepends=True)
    out, at = [], 0
    diff_lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(diff_lines):
        match = HUNK.match(diff_lines[i])
        i += 1
        if not match:
            continue
        hunk = []
        while i < len(diff_lines) and not diff_lines[i].startswith("@@"):
            hunk.append((diff_lines[i][:1], diff_lines[i][1:]))
            i += 1
        old = [content for tag, content in hunk if tag in (" ", "-")]
        start = int(match[1]) - 1 if int(match[2] or 1) else int(match[1])
        candidates = sorted(range(at, len(lines) - len(old) + 1), key=lambda k: abs(k - start))
        found = next((k for k in candidates if lines[k:k + len(old)] == old), None)
        if found is None:
            raise LabError(f"{name}: the hunk at line {match[1]} no longer applies to the model answer "
                           f"(its lines are not in the text after line {at + 1}); refresh the patch")
        out += lines[at:found]
        at = found
        for tag, content in hunk:
            if tag in (" ", "-"):
                at += 1
                if tag == " ":
                    out.append(content)
            elif tag == "+":
                out.append(content)
    out += lines[at:]
    return "".join(out)


def starter_path(lab: Lab) -> Path:
    return STARTERS / f"{lab.name}.py"


def build(names: list[str] | None = None) -> list[Path]:
    """Write the chosen labs' starters (all by default); returns the paths that changed."""
    written = []
    STARTERS.mkdir(parents=True, exist_ok=True)
    for lab in [get(n) for n in names] if names else LABS:
        path, text = starter_path(lab), cut(lab)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def stale(names: list[str] | None = None) -> list[Path]:
    """Committed starters that differ from what the engine's modules cut now (or are missing),
    and starters of no lab."""
    out = [starter_path(lab) for lab in ([get(n) for n in names] if names else LABS)
           if not starter_path(lab).is_file() or starter_path(lab).read_text(encoding="utf-8") != cut(lab)]
    if not names:
        out += [p for p in sorted(STARTERS.glob("*.py")) if p.stem not in BY_NAME]
    return out


def strip_solutions(source: str, filename: str, labs: set[str] | None = None) -> str:
    """A module's source with the solution regions of ``labs`` (every lab by default) replaced by
    their starter bodies (the handout's engine); the other labs' regions stay, markers and all."""
    from engine.core.lab_impl import solution_regions

    lines = source.splitlines(keepends=True)
    parts = {p.regions[0].begin: p for ps in lab_parts(source, filename).values() for p in ps}
    by_begin = {r.begin: (r, next(p for p in parts.values() if r in p.regions)) for r in solution_regions(source, filename)
                if labs is None or r.lab in labs}
    out, skip_to = [], 0
    for number, line in enumerate(lines, 1):
        if number <= skip_to:
            continue
        if number in by_begin:
            region, part = by_begin[number]
            out.append(f"{region.indent}{TODO.format(lab=region.lab)}\n")
            out.append(f'{region.indent}raise NotImplementedError("lab {region.lab}: {part.qualname}")\n')
            skip_to = region.end
        else:
            out.append(line)
    return "".join(out)


HANDOUT_LEFT_OUT = ("lessons/solutions/", "labs/bugs/", "tests/", ".github/")


def _tracked() -> list[str]:
    """The repository's files: git's list, or in a tree that is no git checkout (a handout, where a
    teacher adds next week's labs) every file but caches and build outputs."""
    done = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode == 0:
        return [p for p in done.stdout.splitlines() if (ROOT / p).is_file()]
    skip = {"__pycache__", ".git", ".ipynb_checkpoints", ".pytest_cache", "build", "site"}
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                  if p.is_file() and not skip & set(p.relative_to(ROOT).parts) and p.suffix not in (".pyc", ".so"))


def chosen_labs(names: list[str] | None = None, through_lesson: int | None = None) -> list[Lab] | None:
    """The labs a handout gives out: those named, and those that go with lessons up to
    ``through_lesson`` (:attr:`Lab.lesson`); None when neither is given (every lab).

    Raises:
        LabError: a name that is no lab.
    """
    if not names and through_lesson is None:
        return None
    chosen = {get(n).name for n in names or []}
    if through_lesson is not None:
        chosen |= {lab.name for lab in LABS if lab.lesson <= through_lesson}
    return [lab for lab in LABS if lab.name in chosen]


def handed_out(dest: Path) -> set[str]:
    """The labs whose engine parts a handout in ``dest`` has cut out (its modules' TODO lines),
    and the find-the-bug labs whose starter it holds."""
    from engine.core.lab_impl import starter_regions

    dest = Path(dest)
    cut_out = set()
    for module in lab_modules(ROOT).values():
        path = dest / module.relative_to(ROOT)
        if path.is_file():
            cut_out |= {r.lab for r in starter_regions(path.read_text(encoding="utf-8"))}
    return cut_out | {lab.name for lab in LABS if lab.base is not None and (dest / "labs" / "starters" / f"{lab.name}.py").is_file()}


def write_handout(dest: Path, chosen: list[Lab] | None = None, add: bool = False) -> list[str]:
    """Write the students' tree to ``dest``: every tracked file but :data:`HANDOUT_LEFT_OUT`, with
    the chosen labs' solution regions cut out of the engine's modules (every lab's when ``chosen`` is
    None). A find-the-bug lab comes with the lab it copies (the engine's own part is its fix). Every
    other part stays the engine's own, so the engine, the lessons, the app and ``compare`` run, and a
    chosen lab reaches full marks with only the chosen labs written. ``labs/starters/`` holds the
    chosen labs' starters (``cp -r labs/starters labs/mine`` copies this handout's labs). A find-the-bug
    lab, whose starter holds the answer of the lab it copies, is left out until that lab is in the
    handout already: it comes with a later ``add``.

    ``add``: ``dest`` is a handout already (the student's copy of it): the chosen labs join those it
    has, and only the engine's modules that hold labs and the new starters are written; the
    student's files (``labs/mine/``, notebooks) are left as they are.

    Returns the paths written (relative).

    Raises:
        LabError: ``dest`` is not empty (without ``add``), or is no handout (with ``add``).
    """
    dest = Path(dest)
    everything = chosen is None
    labs_out = list(LABS) if everything else list(chosen)
    if add:
        if everything:
            raise LabError("name the labs to add (--labs or --through-lesson)")
        already = handed_out(dest)
        if not (dest / "lessons" / "labs.py").is_file():
            raise LabError(f"{dest} is no handout (no lessons/labs.py); write one first without --add")
        labs_out = [lab for lab in LABS if lab.name in already or lab in labs_out]
    elif dest.exists() and any(dest.iterdir()):
        raise LabError(f"{dest} is not empty; the handout goes into a new directory (or add labs to it with --add)")
    # A find-the-bug lab's starter is the model answer of the lab it copies, with one bug: it is handed out only
    # into a handout that already holds that lab (a later week's --add, once the lab is graded).
    before = handed_out(dest) if add else set()
    labs_out = [lab for lab in labs_out if lab.base is None or lab.base in before]
    cut_labs = {lab.part_lab for lab in labs_out}
    modules = {str(p.relative_to(ROOT)) for p in lab_modules(ROOT).values()}
    starters = {str(starter_path(lab).relative_to(ROOT)) for lab in labs_out}
    written = []
    for rel in _tracked():
        if rel.startswith(HANDOUT_LEFT_OUT):
            continue
        is_starter = rel.startswith("labs/starters/") and rel.endswith(".py")
        if is_starter and rel not in starters:
            continue
        target = dest / rel
        if add and rel not in modules and not (is_starter and not target.exists()):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel in modules:
            text = strip_solutions((ROOT / rel).read_text(encoding="utf-8"), rel, None if everything else cut_labs)
            target.write_text(text, encoding="utf-8")
        else:
            shutil.copy2(ROOT / rel, target)
        written.append(rel)
    return written


SETUP_SH = """#!/usr/bin/env bash
# Gradescope: installs the engine and the test tools (the image's Python 3.10+).
set -euo pipefail
cd /autograder/source
pip3 install --quiet --extra-index-url https://download.pytorch.org/whl/cpu -e ".[test]"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope: grade the submitted lab files (labs/starters/<lab>.py names), each lab alone, in a process
# that runs as the unprivileged user nobody (docs/labs.md, "What the grader guarantees").
set -uo pipefail
cd /autograder/source
mkdir -p /autograder/results
chmod 700 labs/hidden 2>/dev/null
python3 -m lessons grade {labs}--impl /autograder/submission {hidden}--gradescope /autograder/results/results.json
status=$?
# 0: every lab full marks, 1: marks lost; both wrote results.json last. Anything else: the grader itself
# stopped, and no file it did not finish is trusted.
if [ "$status" -gt 1 ]; then
  printf '{{"score": 0, "output": "The grader stopped (exit status %s) before it finished: no marks were given. Tell your teacher.", "visibility": "visible", "tests": []}}\\n' "$status" > /autograder/results/results.json
fi
exit 0
"""


def write_autograder(zip_path: Path, hidden_tests: Path | None = None, labs: list[Lab] | None = None) -> Path:
    """Gradescope's autograder zip (unpacked to ``/autograder/source``): ``setup.sh``,
    ``run_autograder`` and the repository (the engine with its model answers: the zip stays with the
    teacher; each lab's run cuts its own answer out of its copy), plus the hidden tests
    (``labs/hidden/``) when given. ``labs``: grade only these (a week's assignment, out of its points);
    default every lab."""
    zip_path = Path(zip_path)
    hidden = "--tests labs/hidden " if hidden_tests else ""
    chosen = "".join(f"{lab.name} " for lab in labs) if labs else ""
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER.format(hidden=hidden, labs=chosen))):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            zf.writestr(info, text)
        for rel in _tracked():
            zf.write(ROOT / rel, rel)
        if hidden_tests:
            for path in sorted(Path(hidden_tests).rglob("*.py")):
                zf.write(path, f"labs/hidden/{path.relative_to(hidden_tests)}")
    return zip_path

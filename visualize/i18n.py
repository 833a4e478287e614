"""Every label, help text and explanation of the app, in English and Chinese, in one catalogue.

    from visualize.i18n import t
    t("step", "zh")  # -> "单步"

A key missing from the catalogue raises KeyError at once (a typo must not show up as a blank
label in class); ``{name}`` placeholders are filled from keyword arguments.
The lesson notebooks may use the same catalogue.
"""

from __future__ import annotations

LANGUAGES = ("en", "zh")
LANGUAGE_NAMES = {"en": "English", "zh": "中文"}

CATALOGUE: dict[str, tuple[str, str]] = {
    # --- app shell
    "app_title": ("PagedAttention Lab", "PagedAttention 实验室"),
    "language": ("Language", "语言"),
    "page_live": ("Live engine", "实时引擎"),
    "page_compare": ("Paged vs contiguous", "分页 vs 连续"),
    "page_kernel": ("Kernel lab", "内核实验"),
    "page_lessons": ("Lessons", "课程"),
    "live_intro": (
        "A real model generates text one scheduler step at a time. Watch its KV cache fill the block pool.",
        "一个真实模型按调度步逐步生成文本。观察它的 KV 缓存如何填满块池。",
    ),
    # --- sidebar: engine settings
    "settings": ("Engine settings", "引擎设置"),
    "settings_help": ("Changing a setting restarts the run.", "修改设置会重新开始运行。"),
    "model": ("Model", "模型"),
    "model_default": ("Default: SmolLM2-135M-Instruct", "默认：SmolLM2-135M-Instruct"),
    "model_local": ("Local path or hub id", "本地路径或 Hub 模型名"),
    "model_path": ("Model path", "模型路径"),
    "model_path_help": (
        "A Hugging Face directory (config.json + safetensors), a .gguf file or a hub id.",
        "Hugging Face 目录（config.json + safetensors）、.gguf 文件或 Hub 模型名。",
    ),
    "block_size": ("Block size (tokens per block)", "块大小（每块 token 数）"),
    "block_size_help": (
        "KV slots per block. Small blocks waste less in the last block; large blocks mean shorter block tables.",
        "每块的 KV 槽位数。块越小，最后一块浪费越少；块越大，块表越短。",
    ),
    "pool_unit": ("KV pool size in", "KV 池大小单位"),
    "blocks": ("blocks", "块"),
    "mib": ("MiB", "MiB"),
    "pool_blocks": ("KV pool (blocks)", "KV 池（块）"),
    "pool_mib": ("KV pool (MiB)", "KV 池（MiB）"),
    "pool_capacity": (
        "{blocks} blocks × {block_size} = **{tokens} tokens**, {mib:.1f} MiB ({slot_kib:.1f} KiB per token)",
        "{blocks} 块 × {block_size} = **{tokens} 个 token**，{mib:.1f} MiB（每 token {slot_kib:.1f} KiB）",
    ),
    "allocator": ("Allocator", "分配器"),
    "allocator_paged": ("paged (PagedAttention)", "分页（PagedAttention）"),
    "allocator_contiguous": ("contiguous (before vLLM)", "连续（vLLM 之前）"),
    "reservation": ("Reservation policy", "预留策略"),
    "reservation_help": (
        "max: reserve max_model_len; pow2: the next power of two of the final length; oracle: exactly the final length.",
        "max：预留 max_model_len；pow2：最终长度向上取 2 的幂；oracle：恰好预留最终长度。",
    ),
    "backend": ("Attention backend", "注意力后端"),
    "backend_help": (
        "torch: gather + softmax (fast on CPU). triton: the PagedAttention kernels (interpreted on CPU, slow).",
        "torch：gather + softmax（CPU 上快）。triton：PagedAttention 内核（CPU 上解释执行，较慢）。",
    ),
    "max_batch": ("Max batch (requests per step)", "最大批量（每步请求数）"),
    "sampling": ("Sampling", "采样"),
    "temperature": ("Temperature", "温度"),
    "seed": ("Seed", "随机种子"),
    # --- workload editor
    "workload": ("Workload", "工作负载"),
    "workload_help": (
        "One request per row. Edit, add or delete rows; the run restarts with the new workload.",
        "每行一个请求。可编辑、添加或删除行；运行会以新负载重新开始。",
    ),
    "preset": ("Classroom preset", "课堂预设"),
    "preset_short_chat": ("Short chat", "简短对话"),
    "preset_long_story": ("Long story", "长篇故事"),
    "preset_preemption": ("Mix that forces preemption", "会触发抢占的混合负载"),
    "load_preset": ("Load preset", "载入预设"),
    "prompt": ("Prompt", "提示词"),
    "max_tokens": ("Max tokens", "最大生成 token 数"),
    "too_many_requests": ("At most {n} requests; the rest are ignored.", "最多 {n} 个请求，其余忽略。"),
    "prompt_truncated": ("Prompts are cut to {n} characters.", "提示词截断为 {n} 个字符。"),
    # --- controls
    "step": ("Step", "单步"),
    "run_n": ("Run N steps", "运行 N 步"),
    "n_steps": ("N", "N"),
    "play": ("Play", "播放"),
    "pause": ("Pause", "暂停"),
    "reset": ("Reset", "重置"),
    "speed": ("Seconds between steps", "每步间隔（秒）"),
    "loading_model": ("Loading the model {model}…", "正在加载模型 {model}…"),
    "building_engine": ("Building the engine…", "正在构建引擎…"),
    "all_done": ("All requests finished. Press Reset to run again.", "所有请求已完成。按“重置”重新运行。"),
    "no_steps_yet": ("Press Step to run the first scheduler iteration.", "按“单步”运行第一次调度迭代。"),
    "error_engine": ("Could not build the engine: {error}", "无法构建引擎：{error}"),
    "error_request": ("Request {row} rejected: {error}", "请求 {row} 被拒绝：{error}"),
    "error_step": ("The step failed: {error}", "该步执行失败：{error}"),
    # --- step summary
    "step_summary": ("Step {step}", "第 {step} 步"),
    "phase": ("Phase", "阶段"),
    "phase_prefill": ("prefill", "预填充"),
    "phase_decode": ("decode", "解码"),
    "phase_mixed": ("mixed", "混合"),
    "phase_idle": ("idle", "空闲"),
    "scheduled": ("Requests scheduled", "调度的请求"),
    "tokens_processed": ("Tokens processed", "处理的 token"),
    "step_time": ("Step time", "步耗时"),
    "preemptions": ("Preemptions", "抢占"),
    "time_per_phase": ("Time per phase (ms)", "各阶段耗时（毫秒）"),
    "running_waiting": ("Running / waiting / finished", "运行 / 等待 / 完成"),
    # --- requests
    "requests": ("Requests and their text", "请求及其生成文本"),
    "request": ("Request", "请求"),
    "status_waiting": ("waiting", "等待中"),
    "status_running": ("running", "运行中"),
    "status_finished": ("finished ({reason})", "已完成（{reason}）"),
    "status_preempted": ("preempted", "被抢占"),
    "preempted_times": ("preempted ×{n}", "被抢占 ×{n}"),
    # --- pool and block tables
    "pool": ("Physical KV block pool", "物理 KV 块池"),
    "pool_caption": (
        "One cell per physical block, coloured by the request that owns it (free: grey). The darker bar is the filled part; "
        "black borders: blocks touched this step. Hover a block for details.",
        "每格是一个物理块，颜色表示占用它的请求（空闲为灰色）。深色条是已填充部分；黑框：本步被改动的块。鼠标悬停查看详情。",
    ),
    "block": ("Block", "块"),
    "owner": ("Owner", "占用者"),
    "free": ("free", "空闲"),
    "logical_index": ("Logical block", "逻辑块"),
    "tokens_held": ("Tokens held", "存放 token 数"),
    "touched": ("Touched this step", "本步改动"),
    "block_tables": ("Block tables", "块表"),
    "block_tables_caption": (
        "Each request's logical blocks (in order) and the physical block each maps to, with filled slots.",
        "每个请求的逻辑块（按顺序）及其映射的物理块，以及已填充的槽位。",
    ),
    "no_live_requests": ("No request holds KV blocks right now.", "当前没有请求占用 KV 块。"),
    "slot_range": ("slots {start}–{end}", "槽位 {start}–{end}"),
    # --- memory
    "memory": ("Memory over steps", "各步内存"),
    "memory_unit": ("Unit", "单位"),
    "tokens": ("tokens", "token"),
    "token_states": ("token states", "token 状态"),
    "reserved": ("reserved", "预留"),
    "internal_fragmentation": ("internal fragmentation", "内部碎片"),
    "external_fragmentation": ("external fragmentation", "外部碎片"),
    "step_axis": ("step", "步"),
    "memory_caption": (
        "The paper's Figure 2 categories: only token states are useful; the rest is waste or free.",
        "论文图 2 的分类：只有 token 状态是有用的，其余是浪费或空闲。",
    ),
    # --- events
    "events": ("This step's events", "本步事件"),
    "event_kind": ("Event", "事件"),
    "event_detail": ("Detail", "详情"),
    "ev_allocate": ("allocate", "分配"),
    "ev_write": ("write", "写入"),
    "ev_free": ("free", "释放"),
    "ev_preempt": ("preempt", "抢占"),
    "ev_finish": ("finish", "完成"),
    "ev_cache_hit": ("cache hit", "缓存命中"),
    "ev_evict": ("evict", "驱逐"),
    "ev_cache_hit_detail": ("logical block {logical} → cached block {block}, not computed",
                            "逻辑块 {logical} → 已缓存的块 {block}，无需计算"),
    "ev_evict_detail": ("cached block {block} reused: its hash {hash}… dropped", "已缓存的块 {block} 被重新分配：丢弃其哈希 {hash}…"),
    "ev_allocate_detail": ("logical block {logical} → physical block {block}", "逻辑块 {logical} → 物理块 {block}"),
    "ev_free_detail": ("physical block {block} (logical {logical}) returned", "物理块 {block}（逻辑块 {logical}）归还"),
    "ev_write_detail": (
        "{count} token(s), positions {first}–{last}, into slots of blocks {blocks}",
        "{count} 个 token，位置 {first}–{last}，写入块 {blocks} 的槽位",
    ),
    "ev_write_one_detail": ("position {position} → slot {slot} (block {block})", "位置 {position} → 槽位 {slot}（块 {block}）"),
    "ev_preempt_detail": ("evicted; will be recomputed", "被驱逐，之后重新计算"),
    "no_events": ("No events this step.", "本步没有事件。"),
    "save_png": ("Download PNG", "下载 PNG"),
    # --- compare page
    "compare_intro": (
        "The same workload through the paged allocator and a contiguous one. Small workloads run the real engine; "
        "large ones run the model-free simulator (same scheduler and allocators, lengths only).",
        "同一工作负载分别经过分页分配器和连续分配器。小负载用真实引擎运行；大负载用无模型模拟器（相同调度器和分配器，只用长度）。",
    ),
    "source": ("Run with", "运行方式"),
    "source_engine": ("real engine (the sidebar workload)", "真实引擎（侧边栏工作负载）"),
    "source_sim": ("simulator (a paper workload)", "模拟器（论文工作负载）"),
    "run_compare": ("Run both", "运行两者"),
    "max_steps": ("Step limit", "步数上限"),
    "num_requests": ("Requests", "请求数"),
    "sim_workload": ("Workload", "工作负载"),
    "kv_slots": ("KV pool (token slots)", "KV 池（token 槽位）"),
    "replay_step": ("Replay: step", "回放：步"),
    "concurrency": ("Concurrent requests", "并发请求数"),
    "throughput": ("Throughput", "吞吐量"),
    "tokens_per_step": ("tokens / step", "token / 步"),
    "mean_running": ("mean running requests", "平均运行请求数"),
    "token_state_share": ("token states share", "token 状态占比"),
    "steps_taken": ("steps", "步数"),
    "paper_bars": ("KV memory waste, paper style (Figure 2)", "KV 内存浪费（论文图 2 风格）"),
    "paper_unavailable": ("visualize/paper.py is not available yet.", "visualize/paper.py 尚不可用。"),
    "compare_hint": ("Press “Run both” to compare.", "按“运行两者”开始比较。"),
    "running_compare": ("Running {allocator}…", "正在运行 {allocator}…"),
    # --- kernel lab
    "kernel_intro": (
        "Runs the Triton PagedAttention decode kernel on the real state of the last step: for every request "
        "scheduled in it, the query of its newest token (captured from the layer's q_proj during the step, then "
        "rotated with RoPE exactly as the model does), that layer's real K/V pools and the request's block table. "
        "On a GPU Triton compiles the kernel; on CPU its interpreter runs it with numpy.",
        "在上一步的真实状态上运行 Triton PagedAttention 解码内核：对本步调度的每个请求，取其最新 token 的查询向量"
        "（在该步中从该层的 q_proj 捕获，再像模型一样施加 RoPE 旋转）、该层真实的 K/V 池和该请求的块表。"
        "有 GPU 时 Triton 编译内核；在 CPU 上由其解释器用 numpy 执行。",
    ),
    "layer": ("Layer", "层"),
    "num_splits": ("Partitions (split-K)", "分区数（split-K）"),
    "run_kernel": ("Run the kernel", "运行内核"),
    "kernel_need_step": ("Run at least one step on the Live engine page first.", "请先在“实时引擎”页面运行至少一步。"),
    "kernel_no_rows": (
        "No request scheduled in the last step still holds its blocks (all finished). Reset and step again.",
        "上一步调度的请求都已完成并释放了块。请重置后再运行。",
    ),
    "program_grid": ("Program grid", "程序网格"),
    "program_grid_caption": (
        "On a GPU one program handles one (sequence, KV head, partition). Cell = program id; it serves the query heads "
        "listed and reads the physical blocks listed.",
        "在 GPU 上，每个程序处理一个（序列、KV 头、分区）。格中数字为程序编号；它服务所列的查询头，读取所列的物理块。",
    ),
    "interpreter_note": (
        "Under the CPU interpreter the kernel batches up to {pairs} (sequence, KV head) pairs per program to save Python overhead; the math per pair is the same.",
        "在 CPU 解释器下，内核把最多 {pairs} 个（序列、KV 头）对放进一个程序以减少 Python 开销；每对的计算相同。",
    ),
    "block_reads": ("Block-table reads", "块表读取"),
    "max_diff_ref": ("max |kernel − torch reference|", "最大 |内核 − torch 参考|"),
    "max_diff_engine": ("max |kernel − engine's attention in the step|", "最大 |内核 − 该步引擎的注意力输出|"),
    "kernel_time": ("Kernel time", "内核耗时"),
    "reference_time": ("Reference time", "参考实现耗时"),
    "sequence": ("Sequence", "序列"),
    "kv_head": ("KV head", "KV 头"),
    "query_heads": ("Query heads", "查询头"),
    "partition": ("Partition", "分区"),
    "token_range": ("Tokens", "token 范围"),
    "physical_blocks": ("Physical blocks read", "读取的物理块"),
    "context_len": ("Context length", "上下文长度"),
    # --- lessons
    "lessons_intro": (
        "Jupyter notebooks that walk through the ideas with the same engine and charts. Open one with `jupyter lab <path>`.",
        "用同一引擎和图表逐步讲解的 Jupyter 笔记本。用 `jupyter lab <路径>` 打开。",
    ),
    "no_lessons": ("No lesson notebooks found in {path}.", "在 {path} 中没有找到课程笔记本。"),
    "goal": ("Goal", "目标"),
    "path": ("Path", "路径"),
}


def t(key: str, lang: str = "en", **values) -> str:
    """The text of ``key`` in ``lang`` ("en" or "zh"), with ``{placeholders}`` filled from ``values``."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    text = CATALOGUE[key][LANGUAGES.index(lang)]
    return text.format(**values) if values else text

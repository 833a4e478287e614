"""The catalogue's Chinese: no English words left in it, one rendering per term, and the engine's finish
reasons and the pages' separators in Chinese.

``untranslated`` finds whole English phrases of the catalogue in a Chinese page; it cannot see an English
value put into a Chinese sentence (``已完成（stop）``, the engine's raw finish reason) or English words
written into the Chinese itself (``最大 |full - cached|``). ``english_words`` reads the Chinese text for
any English word a Chinese reader should not meet; ``gloss_mismatches`` finds a term rendered otherwise
than the glossary says (空闲链表 beside 空闲列表 for "free list").
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from visualize.i18n import (
    CATALOGUE,
    FORBIDDEN_VARIANTS,
    GLOSSARY,
    english_words,
    finish_reason_text,
    gloss_mismatches,
    t,
)

ROOT = Path(__file__).resolve().parents[1]

# Chinese texts the lab once showed, each with what a reader saw wrong in it.
OLD_ENGLISH = {
    "已完成（stop）": ["stop"],  # status_finished with the engine's raw finish_reason
    "全部 12 个 token 上的最大 |full - cached|：3.10e-06": ["full", "cached"],  # lesson 2's printed line
    "它的块回到空闲列表（`FREE`，detail 为空）": ["detail"],  # lesson 7
    "它们先被 **touch**：在分配任何块之前就从空闲队列中取出": ["touch"],  # lesson 8
}
OLD_VARIANTS = [
    "只有其余部分需要预填充，并通过块表注意到已缓存的块。",  # attending to, read as "notices"
    "内存池用尽时，请求如何让出显存",  # the GPU KV pool called 内存池
    "小内存池，交换式抢占",
    "画法与 GPU 内存池相同",
    "解码步受内存带宽限制（第 1 课）",  # memory-bound, lesson 1 says 访存受限
    "请求结束时，它的所有块都回到空闲链表（free list）",
    "以已缓存块开头的提示直接复用它们的 KV",  # prompt is 提示词; 提示 is "hint"
    "再给提示词的下一块；这一块通过块表关注（attend）它前面已经算好的块",  # a chunk written 块 (= block)
    "最后给新的提示词，切成块。",
    "处理完该分块后的运行最大值 m",  # running max
    "束 0：累计对数概率 -3.2",
    "重算的 token 数",  # recompute is 重计算
    "它们每个 token 的等待时间有上限",  # time per token
    "GPU 的屋脊线模型",
    "预填充（decode）",  # a gloss that does not match its term
    "把同一个提示词交给单个不分离的引擎",  # colocated is 共置
]


@pytest.mark.parametrize("text", OLD_ENGLISH)
def test_english_words_finds_the_old_leftovers(text):
    assert english_words(text) == OLD_ENGLISH[text]


@pytest.mark.parametrize("text", OLD_VARIANTS)
def test_gloss_mismatches_finds_the_old_renderings(text):
    assert gloss_mismatches(text), f"{text!r}: no glossary mismatch found"


def test_english_words_keeps_names_code_units_and_glosses():
    kept = ("预填充（prefill）把 KV 池（KV pool）填进 `block_table`：vLLM 的 Triton 内核，SmolLM2-135M 在 A100-40GB 上，"
            "12 GiB，max_model_len，FAIL：slot 仍是 None，见 engine/runfile.py，$m = \\max x$，{n} 个 token")
    assert english_words(kept) == []


def test_the_chinese_catalogue_has_no_english_words():
    found = {key: english_words(zh) for key, (_, zh) in CATALOGUE.items() if english_words(zh)}
    assert found == {}, f"English words in the Chinese catalogue: {found}"


def test_the_chinese_catalogue_renders_every_term_one_way():
    found = {key: gloss_mismatches(zh) for key, (_, zh) in CATALOGUE.items() if gloss_mismatches(zh)}
    assert found == {}, f"terms rendered otherwise than the glossary: {found}"


# Terms whose English, wherever the catalogue's English has it, must come with the glossary's Chinese.
PARALLEL_TERMS = ("free list", "free queue", "prompt", "chunk", "memory-bound", "running max", "recompute",
                  "copy-on-write", "block table", "prefill", "preemption", "swap space", "beam", "fork")
EXTRA = {"free queue": "空闲队列", "preemption": "抢占", "beam": "束"}


@pytest.mark.parametrize("term", PARALLEL_TERMS)
def test_an_english_term_gets_the_same_chinese_in_every_entry(term):
    chinese = GLOSSARY.get(term) or EXTRA[term]
    pattern = re.compile(rf"(?<![A-Za-z_]){re.escape(term)}(?:s|es|ed|ing)?(?![A-Za-z_])", re.IGNORECASE)
    entries = {k: zh for k, (en, zh) in CATALOGUE.items() if pattern.search(re.sub(r"\{[^}]*\}|`[^`]*`", "", en))}
    assert entries or term in ("memory-bound", "running max"), f"no catalogue entry says {term!r}: a vacuous check"
    missing = {k: zh for k, zh in entries.items() if chinese not in zh}
    assert missing == {}, f"{term!r} is {chinese} in the glossary, but not in: {missing}"


def test_the_lessons_chinese_lines_set_no_space_after_full_width_punctuation():
    """A lesson's printed line or chart text in Chinese: no space after a full-width mark, written or made by a
    padded placeholder right after one ("：{ms:6.1f}"), and no engine constant's name (COPY_ON_WRITE)."""
    space = re.compile(r"[，。：；、！？（）](?: |\{[^}]*:[<>^=]?\d)")
    constant = re.compile(r"(?<![\w.])[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9](?![\w.])")
    found = {k: zh for k, (_, zh) in CATALOGUE.items()
             if re.match(r"l[pc]?\d+_", k) and (space.search(zh) or constant.search(re.sub(r"`[^`]*`", "", zh)))}
    assert found == {}, f"spaces after full-width punctuation or constant names in: {found}"


# The words that have meant two things in the Chinese text, each with the rendering that was wrong.
AMBIGUOUS = [
    "投机解码（N 元语法）",  # prompt lookup named as an n-gram language model
    "2 核笔记本上约 1 分钟",  # a laptop, where 笔记本 is the lessons' Jupyter notebook
    "本实验室在驱逐请求的那一步计入抢占",  # a preemption called an eviction (驱逐 is a cached block's)
    "本服务器启动时对其他机器开放",  # the Streamlit app, where 服务器 is the engine server
    "根据实测的接受率 α 和 k",  # lesson 10's α (accepted / judged) is not the app's 接受率 (accepted / proposed)
    "平均 token 间延迟 TPOT（毫秒）",  # token 间延迟 is ITL
    "就像这个请求从未投机过一样",  # bare 投机
    "每个系统用同一批请求",  # the same requests, not the same batch
]


@pytest.mark.parametrize("text", AMBIGUOUS)
def test_gloss_mismatches_finds_the_ambiguous_words(text):
    assert gloss_mismatches(text), f"{text!r}: no glossary mismatch found"


def test_the_glossary_names_speculative_decoding_and_serving():
    terms = ("speculative decoding", "draft", "proposer", "prompt lookup", "acceptance rate", "verification", "rollback",
             "lookahead slot", "bonus token", "ttft", "tpot", "itl", "goodput", "request rate", "throughput", "preemption")
    assert [term for term in terms if term not in GLOSSARY] == []
    # each gloss of the new terms is accepted beside its rendering, and refused beside another
    assert gloss_mismatches("提示词查找（prompt lookup）、前瞻槽位（lookahead slot）、首 token 延迟（TTFT）") == []
    assert gloss_mismatches("草稿（proposer）")


def test_every_forbidden_variant_differs_from_its_term():
    for term, variants in FORBIDDEN_VARIANTS.items():
        assert term in GLOSSARY.values() or term in ("显存", "注意力计算", "Roofline 模型", "token", "单元格", "仅为前者的",
                                                     "已完成的请求"), term
        for variant in variants:
            assert not re.search(variant, term), f"{variant!r} would forbid {term} itself"


def _finish_reasons_in_engine() -> set[str]:
    """Every finish reason the engine's source sets: finish(...) / finish_seq(...) arguments, assignments
    to finish_reason, FINISH events' details (emitted or built) and what _finish_reason returns."""
    reasons = set()
    for path in (ROOT / "engine").rglob("*.py"):
        src = path.read_text()
        reasons |= set(re.findall(r"\bfinish(?:_seq)?\([^()]*,\s*\"(\w+)\"\)", src))
        reasons |= set(re.findall(r"finish_reason\s*=\s*\"(\w+)\"", src))
        reasons |= set(re.findall(r"(?:Event\(|emit\()FINISH,[^)]*detail=\"(\w+)\"", src))
        for pair in re.findall(r"\breason\s*=\s*\"(\w+)\"(?:\s+if\b[^\n]*?else\s+\"(\w+)\")?", src):
            reasons |= set(pair)
        for body in re.findall(r"def _finish_reason\(.*?(?=\n    def |\Z)", src, re.S):
            reasons |= set(re.findall(r"return \"(\w+)\"", body))
    return reasons - {""}


def test_every_finish_reason_the_engine_sets_has_chinese():
    reasons = _finish_reasons_in_engine()
    assert {"stop", "length", "abort", "pruned"} <= reasons, reasons  # the scan sees the engine's reasons
    for reason in reasons:
        assert f"finish_{reason}" in CATALOGUE, f"finish reason {reason!r} has no catalogue key finish_{reason}"
        shown = t("status_finished", "zh", reason=finish_reason_text(reason, "zh"))
        assert english_words(shown) == [] and reason not in shown, shown
        assert t("status_finished", "en", reason=finish_reason_text(reason, "en")) == f"finished ({reason})"


def test_a_real_run_shows_its_finish_reasons_and_events_in_chinese(tiny_llama_dir):
    """The tiny engine ends one request by length, one by a stop token and aborts one; the Chinese request
    status (the Live page's) and event table show each reason in Chinese, with full-width separators."""
    from app_pages.replay import RequestView, request_views, status_text
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams
    from visualize.pool import event_log_rows, pool_frame

    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=32, block_size=4))
    vocab = engine.hf_config.vocab_size
    ids = [engine.add_request("Hello there", SamplingParams(max_tokens=3, ignore_eos=True, n=2)),
           engine.add_request("Hello there", SamplingParams(max_tokens=8, stop_token_ids=list(range(vocab)))),
           engine.add_request("Count to ten", SamplingParams(max_tokens=8, ignore_eos=True))]
    reports = [engine.step()]
    engine.abort_request(ids[2])
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    prompts = dict(zip(ids, ["Hello there", "Hello there", "Count to ten"]))
    views = {v.request_id: v for v in request_views(prompts, reports, len(reports) - 1)}
    # an abort happens between steps: no step report lists it as finished, the engine's output does
    aborted = engine.get_output(ids[2])
    views[ids[2]] = RequestView(ids[2], prompts[ids[2]], aborted.text, 1, "finished", aborted.finish_reason, 0)
    assert {rid: views[rid].finish_reason for rid in ids} == dict(zip(ids, ["length", "stop", "abort"]))
    for rid, chinese in zip(ids, ["达到长度上限", "遇到结束符或停止词", "已中止"]):
        shown = status_text(views[rid], "zh")
        assert shown == f"已完成（{chinese}）" and english_words(shown) == [], shown
    finish_rows = [row for r in reports for row in event_log_rows(r, "zh") if row["kind"] == "finish"]
    assert {row["detail"] for row in finish_rows} == {"达到长度上限", "遇到结束符或停止词", "已中止"}
    # the two samples of request 0 hold its prompt blocks together: listed with 、 in Chinese, ", " in English
    holders = [x for x in pool_frame(reports[0], 4, "zh")["holders_text"] if "（请求 0）" in x]
    assert any("、" in x for x in holders) and not any(", " in x for x in holders), holders
    assert any(", " in x for x in pool_frame(reports[0], 4, "en")["holders_text"])
    assert t("sep_list", "zh") == "、" and t("sep_colon", "zh") == "：" and t("paren", "zh", text="x") == "（x）"


def _chinese_of_the_labs_and_docs() -> dict[str, str]:
    """The Chinese a student reads beside the lessons: each lab's title and goal (lessons/labs.py, copied into
    the starters), the Chinese labs guide and the README's Chinese paragraph."""
    from lessons.labs import LABS

    texts = {f"lessons/labs.py: {lab.name}": f"{lab.title[1]}\n{lab.goal[1]}" for lab in LABS}
    texts["docs/labs.zh.md"] = (ROOT / "docs" / "labs.zh.md").read_text()
    texts["README.md"] = next(p for p in (ROOT / "README.md").read_text().split("\n\n") if "一个可单步执行" in p)
    return texts


def test_the_labs_text_and_the_chinese_docs_keep_the_glossary():
    """The labs' text once said 词元 for token, 奖励 for bonus, 叶子 and 加锁 for the tree's leaves and locks."""
    found = {where: gloss_mismatches(text) for where, text in _chinese_of_the_labs_and_docs().items() if gloss_mismatches(text)}
    assert found == {}, f"terms off the glossary: {found}"
    assert gloss_mismatches("n 个词元需要几个块；全部 k 个都接受时是额外的奖励词元；最久未用的未加锁叶子；少 4.0 倍")


def test_the_readmes_count_the_lessons_there_are():
    names = sorted(p.name for p in (ROOT / "lessons" / "src").glob("[0-9][0-9]_*.py"))
    words = {11: ("Eleven", "十一"), 12: ("Twelve", "十二"), 13: ("Thirteen", "十三"), 14: ("Fourteen", "十四")}[len(names)]
    readme, lessons = (ROOT / "README.md").read_text(), (ROOT / "lessons" / "README.md").read_text()
    assert f"{words[0]} lesson notebooks" in readme and f"{words[1]}个课程笔记本" in readme
    assert f"{words[0]} notebooks, in order" in lessons and f"{words[1]}个笔记本，按顺序学习" in lessons
    assert "\n" not in next(p for p in readme.split("\n\n") if "一个可单步执行" in p), "a Chinese paragraph on one line"

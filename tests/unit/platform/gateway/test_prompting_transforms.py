"""The prompt strategies' transformations on fixed inputs (issue #34 item 3): dialogue-state
slots, the hard/soft split and its token allocation, per-window entropy pruning, and the
surprisal read from an ``echo`` + ``logprobs`` answer in either server convention."""

from __future__ import annotations

import math

import pytest

from ablab.platform.gateway.prompting import transforms as tf
from ablab.platform.gateway.prompting.pipeline import slot_programs
from ablab.platform.strategy import DialogueState

STATE = DialogueState(slots={"name": r"(?i)my name is (\w+)", "city": r"(?i)i live in ([A-Z][a-z]+)",
                             "order": r"order #\d+"})
CONVERSATION = [
    {"role": "system", "content": "You are a concierge."},
    {"role": "user", "content": "Hi, my name is Ada and I live in Paris."},
    {"role": "assistant", "content": "Hello Ada! How can I help? I live in Nowhere."},
    {"role": "user", "content": "About order #4521: it is late."},
    {"role": "assistant", "content": "Sorry to hear that."},
    {"role": "user", "content": [{"type": "text", "text": "Actually I live in Lyon now."}]},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": "Where do I live, and what is my order?"},
]


def test_slots_are_read_in_order_and_change_only_when_a_later_turn_sets_them() -> None:
    slots = tf.extract_slots(CONVERSATION, slot_programs(STATE), STATE.roles)
    # city: Paris, then Lyon (a later user turn sets it); the assistant's "Nowhere" is not a user turn
    assert slots == {"name": "Ada", "city": "Lyon", "order": "order #4521"}  # declared order; no group: the whole match
    with_assistant = tf.extract_slots(CONVERSATION, slot_programs(STATE), ("user", "assistant"))
    assert with_assistant["city"] == "Lyon"  # the assistant's Nowhere came before Lyon
    assert tf.extract_slots(CONVERSATION[:3], slot_programs(STATE), ("user", "assistant"))["city"] == "Nowhere"
    # a turn that does not match leaves the slot as it was; the last match within a turn counts
    later = [*CONVERSATION, {"role": "user", "content": "my name is Bo, no wait, my name is Cy"}]
    assert tf.extract_slots(later, slot_programs(STATE), ("user",)) == {"name": "Cy", "city": "Lyon", "order": "order #4521"}


def test_dialogue_state_keeps_system_messages_slots_and_the_last_turn() -> None:
    result = tf.apply_dialogue_state(CONVERSATION, slot_programs(STATE), roles=STATE.roles, header=STATE.header)
    assert result.messages == [
        {"role": "system", "content": "You are a concierge."},
        {"role": "system", "content": "Known facts from earlier in this conversation:\n- name: Ada\n- city: Lyon\n"
                                      "- order: order #4521"},
        {"role": "user", "content": "Where do I live, and what is my order?"},
    ]
    assert (result.turns_in, result.turns_out) == (7, 1)
    # no system message: the state goes first; no slot set: no state message at all
    bare = CONVERSATION[1:]
    assert tf.apply_dialogue_state(bare, slot_programs(STATE), roles=("user",), header="S:").messages[0]["content"].startswith("S:\n")
    quiet = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "bye"}]
    assert tf.apply_dialogue_state(quiet, slot_programs(STATE), roles=("user",), header="S:").messages == [quiet[-1]]
    # the last turn includes what follows the last user message (a tool result, say)
    tooled = [*quiet, {"role": "assistant", "content": None, "tool_calls": []}, {"role": "tool", "content": "42"}]
    assert tf.apply_dialogue_state(tooled, slot_programs(STATE), roles=("user",), header="S:").messages == tooled[2:]
    # no user message: nothing to anchor on, unchanged
    only_sys = [{"role": "system", "content": "x"}]
    assert tf.apply_dialogue_state(only_sys, slot_programs(STATE), roles=("user",), header="S:").messages == only_sys


def test_split_segments_take_the_text_before_the_first_delimiter_as_hard() -> None:
    body = {"messages": [{"role": "system", "content": "Rules.<<<soft>>>Example A<<<soft>>>Example B"},
                         {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                                      {"type": "text", "text": "<<<soft>>>old chat"}]},
                         {"role": "user", "content": "Question?"}]}
    segs = tf.split_segments(body, "<<<soft>>>", chat=True)
    assert [(s.message, s.part, s.hard, s.soft) for s in segs] == [
        (0, None, "Rules.", "Example AExample B"), (1, 1, "", "old chat"), (2, None, "Question?", None)]
    assert [(s.hard, s.soft) for s in tf.split_segments({"prompt": "H|S"}, "|", chat=False)] == [("H", "S")]
    out = {**body, "messages": list(body["messages"])}
    tf.replace_segment(out, segs[1], "kept")
    assert out["messages"][1]["content"][1] == {"type": "text", "text": "kept"}
    assert body["messages"][1]["content"][1]["text"] == "<<<soft>>>old chat"  # the caller's body is untouched


@pytest.mark.parametrize(("soft", "budget", "keep", "expected"), [
    ([10, 20, 30], 100, "end", [10, 20, 30]),
    ([10, 20, 30], 45, "end", [0, 15, 30]),   # the latest soft text first, the oldest cut first
    ([10, 20, 30], 45, "start", [10, 20, 15]),
    ([10, 20, 30], 0, "end", [0, 0, 0]),
    ([10, 20, 30], -7, "start", [0, 0, 0]),   # the hard prefix alone is over budget: all soft text goes
])
def test_allocate_serves_soft_texts_in_keep_order(soft, budget, keep, expected) -> None:
    assert tf.allocate(soft, budget, keep=keep) == expected


def test_cuts_by_tokens_and_by_estimated_characters() -> None:
    assert tf.cut_ids([1, 2, 3, 4, 5], 2, keep="end") == [4, 5]
    assert tf.cut_ids([1, 2, 3, 4, 5], 2, keep="start") == [1, 2]
    assert tf.cut_ids([1, 2, 3], 0, keep="end") == []
    assert tf.cut_chars("abcdefghij", 3, 5, keep="end") == "efghij"
    assert tf.cut_chars("abcdefghij", 3, 5, keep="start") == "abcdef"
    assert tf.cut_chars("abcdefghij", 5, 5, keep="end") == "abcdefghij"
    assert tf.cut_chars("abcdefghij", 0, 5, keep="end") == ""


def test_prune_mask_keeps_surprising_tokens_and_each_windows_best() -> None:
    s = [1.0, 0.1, 0.5, 0.05, 0.02, 0.01, 0.03, 0.9, 0.1, 0.0]
    assert tf.prune_mask(s, tau=0.18, window=3) == [True, False, True, False, False, False, True, True, False, True]
    # window 3 over [0.05, 0.02, 0.01]: none reaches tau, the best (0.05) is kept
    assert tf.prune_mask([1.0, 0.05, 0.02, 0.01, 0.5], tau=0.18, window=3) == [True, True, False, False, True]
    assert tf.prune_mask([], tau=0.18, window=32) == []
    assert tf.prune_mask([0.0], tau=0.18, window=32) == [True]
    assert all(tf.prune_mask(s, tau=0.0, window=4))


def _echo(pieces, same, top):
    return {"tokens": [*pieces, " next"], "text_offset": [], "token_logprobs": same, "top_logprobs": top}


def test_surprisal_from_an_openai_style_echo() -> None:
    pieces = ["The", " cat", " sat", "."]
    same = [None, -math.log(65536) * 0.5, -0.1, -math.log(65536) * 2, -1.0]
    top = [None, {" cat": same[1], " dog": -9.0}, {" sat": -0.1}, {".": same[3], "!": -20.0}, {" next": -1.0}]
    scored = tf.surprisal_from_echo("The cat sat.", _echo(pieces, same, top), vocab=65536, top_k=20)
    assert scored.alignment == "same" and scored.pieces == pieces
    assert scored.surprisal == pytest.approx([1.0, 0.5, 0.1 / math.log(65536), 1.0])


def test_surprisal_from_a_llama_cpp_python_echo_reads_the_next_tokens_distribution() -> None:
    # llama-cpp-python (no BOS): index i holds the distribution after token i, and token_logprobs[i]
    # is token i's own log-probability under it (low); top_logprobs[0] is blanked to None
    pieces = ["The", " cat", " sat", " on", " it"]
    same = [None, -12.0, -11.0, -13.0, -10.0, -9.0]
    top = [None,
           {" sat": -0.2, " ran": -2.0, " cat": -12.0},          # after " cat": " sat" is likely
           {" under": -0.5, " by": -1.0, " sat": -11.0},          # after " sat": " on" is not in the top k
           {" it": -0.05, " on": -13.0},
           {" next": -1.0, " it": -10.0}]
    scored = tf.surprisal_from_echo("The cat sat on it", _echo(pieces, same, top), vocab=1000, top_k=2)
    assert scored.alignment == "next"
    ln = math.log(1000)
    # " cat": top_logprobs[0] is None -> unknown -> 1; " on": not in the top 2 -> the 2nd's -1.0
    assert scored.surprisal == pytest.approx([1.0, 1.0, 0.2 / ln, 1.0 / ln, 0.05 / ln])


def test_surprisal_needs_pieces_that_join_to_the_prompt() -> None:
    assert tf.surprisal_from_echo("abc", {"tokens": ["x", "y", "z"], "token_logprobs": [None, -1, -1]}, vocab=10, top_k=2) is None
    by_offsets = {"tokens": ["?", "?"], "text_offset": [0, 2], "token_logprobs": [None, -1.0], "top_logprobs": None}
    scored = tf.surprisal_from_echo("abcd", by_offsets, vocab=10, top_k=2)
    assert scored.pieces == ["ab", "cd"] and scored.alignment == "same"

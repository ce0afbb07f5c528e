"""Grading the real LLM's free-text answers, and the labeler taking a record's own grade."""

from ablab.cli.supervisor.llm_demo import QUESTIONS, grade
from ablab.inference.labeler import Labeler, LabelerConfig
from ablab.inference.serving.events import ListSink


def test_grade_accepts_the_answer_as_a_word_only():
    assert grade("The capital of France is Paris.", ("paris",))
    assert grade("PARIS", ("paris",))
    assert grade("A spider has 8 legs.", ("8", "eight"))
    assert grade("Twenty-four hours.", ("24", "twenty-four"))
    assert not grade("Parisian food is good.", ("paris",))
    assert not grade("A spider has 88 legs.", ("8", "eight"))
    assert not grade("", ("blue",))


def test_every_question_has_a_lowercase_answer():
    assert len({q for q, _ in QUESTIONS}) == len(QUESTIONS)
    assert all(answers and all(a == a.lower() for a in answers) for _, answers in QUESTIONS)


def test_labeler_uses_the_grade_a_record_carries():
    sink = ListSink()
    lab = Labeler(LabelerConfig(fraction=1.0, delay_median_s=0.0, source="auto"), sink)
    lab.offer({"trace_id": "t1", "output": "It is Paris.", "answer": "paris", "correct": 1})
    lab.offer({"trace_id": "t2", "output": "paris", "answer": "paris", "correct": 0})
    lab.offer({"trace_id": "t3", "output": "132", "answer": "132"})  # no grade: graded by exact match
    assert lab.emit_due() == 3
    assert {e["trace_id"]: e["correct"] for e in sink.events} == {"t1": 1, "t2": 0, "t3": 1}

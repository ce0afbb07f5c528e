import pytest

from ablab.platform.assignment.engine import assign
from ablab.platform.assignment.payload import config_from_payload
from ablab.platform.assignment.targeting import (
    MAX_ATTRIBUTES,
    MAX_PATTERN_CHARS,
    MAX_VALUE_CHARS,
    Condition,
    Op,
    Unsatisfiable,
    attributes_problem,
    matches_all,
    parse_semver,
    rules_from_stored,
)


@pytest.mark.parametrize(
    ("op", "value", "actual", "expected"),
    [
        (Op.eq, "de", "de", True),
        (Op.ne, "de", "fr", True),
        (Op.in_, ["de", "fr"], "fr", True),
        (Op.not_in, ["de", "fr"], "us", True),
        (Op.gt, 10, 11, True),
        (Op.gte, 10, 10, True),
        (Op.lt, 10, "9.5", True),
        (Op.lte, 10, 11, False),
        (Op.regex, r"^pro-\d+$", "pro-42", True),
        (Op.regex, r"^pro-\d+$", "free", False),
        (Op.semver_gte, "1.10.0", "1.9.9", False),
        (Op.semver_gte, "1.10.0", "1.10.0", True),
        (Op.semver_gt, "2.0.0-rc.1", "2.0.0", True),
        (Op.semver_lt, "2.0.0", "2.0.0-beta", True),
        (Op.semver_eq, "1.2", "1.2.0", True),
        (Op.gt, 5, "not a number", False),
    ],
)
def test_operators(op: Op, value: object, actual: object, expected: bool) -> None:
    assert Condition("a", op, value).matches({"a": actual}) is expected


def test_missing_attribute_never_matches() -> None:
    assert not Condition("a", Op.ne, "x").matches({})
    assert not matches_all((Condition("a", Op.eq, 1),), None)
    assert matches_all((), None)


def test_bad_rules_fail_at_configuration_time() -> None:
    with pytest.raises(ValueError):
        Condition("a", Op.in_, "not-a-list")
    with pytest.raises(ValueError):
        Condition("a", Op.regex, "(unclosed")
    with pytest.raises(ValueError):
        Condition("v", Op.semver_gt, "one.two")


def test_semver_prerelease_ordering() -> None:
    order = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-beta", "1.0.0-rc.1", "1.0.0", "1.0.1"]
    assert sorted(order, key=parse_semver) == order


# -- linear time and bounded input ------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        (r"(a)\1", "backreferences"),
        (r"(?=a)a", "lookaround"),
        (r"(?<!a)b", "lookaround"),
        ("a" * (MAX_PATTERN_CHARS + 1), f"at most {MAX_PATTERN_CHARS}"),
        ("((a{1000}){1000}){1000}", "RE2"),
        (42, "string pattern"),
    ],
)
def test_patterns_re2_cannot_compile_are_refused_with_the_reason(pattern: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Condition("a", Op.regex, pattern)


def test_a_catastrophic_pattern_compiles_and_means_what_it_says() -> None:
    rule = Condition("tier", Op.regex, "(a+)+$")
    assert rule.matches({"tier": "a" * MAX_VALUE_CHARS})
    assert not rule.matches({"tier": "a" * (MAX_VALUE_CHARS - 1) + "b"})  # the backtracking worst case: no match
    assert rule.matches({"tier": "xaa"})


def test_text_rules_never_look_at_values_past_the_limit() -> None:
    rule = Condition("tier", Op.regex, "^a")
    assert rule.matches({"tier": "a" * MAX_VALUE_CHARS})
    assert not rule.matches({"tier": "a" * (MAX_VALUE_CHARS + 1)})
    assert not rule.matches({"tier": ["a"]})  # a list is not text
    assert not Condition("v", Op.semver_gte, "1.0.0").matches({"v": "1." + "0" * MAX_VALUE_CHARS})


@pytest.mark.parametrize(
    ("op", "value"),
    [(Op.gt, float("nan")), (Op.lte, "inf"), (Op.gt, "ten"), (Op.gte, True), (Op.in_, [1, float("nan")]),
     (Op.in_, list(range(1001))), (Op.eq, {"nested": 1}), (Op.eq, "x" * (MAX_VALUE_CHARS + 1))],
)
def test_rule_values_are_bounded_and_finite(op: Op, value: object) -> None:
    with pytest.raises(ValueError):
        Condition("a", op, value)


def test_stored_rules_that_no_longer_compile_match_nobody_instead_of_failing() -> None:
    rules = rules_from_stored([{"attribute": "tier", "op": "regex", "value": r"(a)\1"},
                               {"attribute": "tier", "op": "eq", "value": "pro"}], experiment="old")
    assert isinstance(rules[0], Unsatisfiable) and isinstance(rules[1], Condition)
    payload = {
        "revision": 1, "bucket_space": 10_000, "layers": [], "holdouts": [],
        "experiments": [
            {"key": key, "salt": key, "phase": 1, "unit": "user", "status": "running", "traffic": 1.0, "control": "a",
             "targeting": targeting, "variants": [{"key": "a", "weight": 1, "strategy": {}}]}
            for key, targeting in (("old", [{"attribute": "tier", "op": "regex", "value": r"(a)\1"}]), ("fine", []))
        ],
    }
    config = config_from_payload(payload)  # one bad stored rule does not stop every experiment
    assert [a.experiment for a in assign(config, "u1", {"tier": "aa"})] == ["fine"]


def test_attributes_problem_names_the_attribute() -> None:
    assert attributes_problem(None) is None
    assert attributes_problem({"tier": "pro", "n": 3, "ok": True, "x": None, "f": 1.5}) is None
    assert attributes_problem({"tier": "a" * (MAX_VALUE_CHARS + 1)})[0] == "tier"
    assert attributes_problem({"tier": {"nested": 1}})[0] == "tier"
    assert attributes_problem({"f": float("inf")})[0] == "f"
    assert attributes_problem({"k" * 65: 1})[1].startswith("attribute names")
    assert attributes_problem({f"a{i}": i for i in range(MAX_ATTRIBUTES + 1)})[0] == ""


@pytest.mark.parametrize("pattern", [r"^pro-\d+$", r"(?i)^(de|fr)-", "é+$", r"\bteam\b", "(a+)+$", ""])
@pytest.mark.parametrize("text", ["pro-42", "FR-paris", "caféé", "a team b", "a" * 50, "", "ünï\u00e9-pro-1", "\ud800"])
def test_the_fast_boolean_path_agrees_with_the_bindings_search(pattern: str, text: str) -> None:
    from ablab.platform.assignment.targeting import _searcher, compile_regex

    program = compile_regex(pattern)
    try:
        expected = program.search(text) is not None
    except UnicodeEncodeError:  # a lone surrogate is no text either engine can read
        expected = False
    assert Condition("a", Op.regex, pattern).matches({"a": text}) is expected
    fast = _searcher(program)
    if text != "\ud800":
        assert fast(text) is expected

import pytest

from ablab.platform.assignment.targeting import Condition, Op, matches_all, parse_semver


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

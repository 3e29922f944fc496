"""math:statistics and math:calendar against their definitions."""

import statistics
from datetime import UTC, datetime

import pytest

from amity.suite.tools import calendar, statistics as stats_tool
from amity.suite.tools.base import ToolContext, ToolError, ToolSettings

CONTEXT = ToolContext(ToolSettings())


def describe(numbers):
    return stats_tool.TOOL.run({"numbers": numbers}, CONTEXT).result["result"]


def test_statistics_of_a_known_sample():
    out = describe([2, 4, 4, 4, 5, 5, 7, 9])
    assert out["count"] == 8 and out["sum"] == 40 and out["mean"] == 5
    assert out["median"] == 4.5 and out["mode"] == [4] and out["range"] == 7
    assert out["pstdev"] == 2 and out["pvariance"] == 4
    assert out["stdev"] == pytest.approx(statistics.stdev([2, 4, 4, 4, 5, 5, 7, 9]))
    assert out["quartiles"] == [4, 4.5, 5.5]


def test_statistics_accepts_a_string_of_numbers():
    assert describe("1, 2, 3 4")["mean"] == 2.5
    assert describe("[1.5, 2.5]")["sum"] == 4
    single = describe([7])
    assert single["mean"] == 7 and "stdev" not in single  # undefined for one value


@pytest.mark.parametrize("bad", [[], "a, b", [1, "x"], [True], [float("nan")], None,
                                 list(range(100_001))])
def test_statistics_refuses_what_is_not_numbers(bad):
    with pytest.raises(ToolError):
        describe(bad)


def cal(**args):
    return calendar.TOOL.run(args, CONTEXT).result["result"]


def test_weekday_and_difference():
    assert cal(operation="weekday", date="2024-09-14")["weekday"] == "Saturday"
    diff = cal(operation="difference", date="2024-01-01", other_date="2024-12-25")
    assert diff["days"] == 359 and diff["weeks_and_days"] == [51, 2]
    assert cal(operation="difference", date="2024-01-01T12:00",
               other_date="2024-01-01")["days"] == -0.5


def test_add_clamps_month_ends_and_handles_leap_years():
    assert cal(operation="add", date="2024-01-31", months=1)["date"] == "2024-02-29"
    assert cal(operation="add", date="2023-01-31", months=1)["date"] == "2023-02-28"
    assert cal(operation="add", date="2024-02-29", years=1)["date"] == "2025-02-28"
    assert cal(operation="add", date="2024-03-01", days=-1)["date"] == "2024-02-29"
    assert cal(operation="add", date="2024-09-14T23:00", hours=2)["datetime"] == \
        "2024-09-15T01:00:00+00:00"


def test_time_zones():
    seoul = cal(operation="convert", date="2024-09-14T09:30", timezone="Asia/Seoul",
                to_timezone="America/New_York")
    assert seoul["datetime"] == "2024-09-13T20:30:00-04:00" and seoul["weekday"] == "Friday"
    # A summer and a winter date: the offset follows daylight saving time.
    assert cal(operation="convert", date="2024-01-15T12:00Z",
               to_timezone="Europe/Paris")["datetime"].endswith("+01:00")
    assert cal(operation="convert", date="2024-07-15T12:00Z",
               to_timezone="Europe/Paris")["datetime"].endswith("+02:00")


def test_now_is_the_current_time_in_the_zone():
    before = datetime.now(UTC)
    now = datetime.fromisoformat(cal(operation="now", timezone="Asia/Seoul")["datetime"])
    assert now.utcoffset().total_seconds() == 9 * 3600
    assert abs((now - before).total_seconds()) < 60


@pytest.mark.parametrize("args", [
    {"operation": "explode"}, {"operation": "weekday"}, {"operation": "weekday", "date": "soon"},
    {"operation": "now", "timezone": "Mars/Olympus"},
    {"operation": "add", "date": "9999-12-31", "days": 2},
    {"operation": "add", "date": "2024-01-01", "months": 1.5},
    {"operation": "add", "date": "2024-01-01", "years": 10**9},
])
def test_calendar_refuses_bad_arguments(args):
    with pytest.raises(ToolError) as error:
        calendar.TOOL.run(args, CONTEXT)
    assert error.value.type == "invalid_arguments"

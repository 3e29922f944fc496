"""`math:calendar`: dates and times. Operations: `now` (in a time zone), `weekday`,
`difference` between two dates or times, `add` a duration, `convert` between time
zones. Dates are ISO 8601 (`2024-09-14`, `2024-09-14T09:30`, with or without an
offset); time zones are IANA names (zoneinfo), `UTC` by default. Adding months or
years keeps the day, clamped to the month's last (Jan 31 + 1 month = Feb 29 in 2024)."""

import calendar as cal
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from amity.suite.tools.base import BuiltinTool, ToolContext, ToolError, ToolOutput

OPERATIONS = ("now", "weekday", "difference", "add", "convert")
UNITS = ("years", "months", "weeks", "days", "hours", "minutes", "seconds")
MAX_YEARS = 10_000


def _bad(msg: str) -> ToolError:
    return ToolError("invalid_arguments", msg)


def _zone(name) -> ZoneInfo:
    if name is None or name == "":
        return ZoneInfo("UTC")
    if not isinstance(name, str) or len(name) > 64:
        raise _bad("a time zone is an IANA name such as `Asia/Seoul`")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise _bad(f"unknown time zone {name!r}; use an IANA name such as `Europe/Paris`") from None


def _moment(args: dict, key: str, zone: ZoneInfo) -> datetime:
    text = args.get(key)
    if not isinstance(text, str) or not text.strip() or len(text) > 64:
        raise _bad(f"`{key}` must be an ISO 8601 date or date-time, e.g. 2024-09-14T09:30")
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise _bad(f"`{key}` {text!r} is not an ISO 8601 date or date-time") from None
    return moment.replace(tzinfo=zone) if moment.tzinfo is None else moment


def _show(moment: datetime) -> dict:
    return {"datetime": moment.isoformat(), "date": moment.date().isoformat(),
            "weekday": cal.day_name[moment.weekday()], "timezone": str(moment.tzinfo)}


def _add_months(moment: datetime, months: int) -> datetime:
    index = moment.year * 12 + moment.month - 1 + months
    year, month = divmod(index, 12)
    if not 1 <= year <= 9999:
        raise _bad("the result is outside years 1..9999")
    day = min(moment.day, cal.monthrange(year, month + 1)[1])
    return moment.replace(year=year, month=month + 1, day=day)


def _amount(args: dict, unit: str) -> float:
    value = args.get(unit, 0) or 0
    if isinstance(value, bool) or not isinstance(value, int | float) or abs(value) > 366 * MAX_YEARS * 86400:
        raise _bad(f"`{unit}` must be a number")
    if unit in ("years", "months") and value != int(value):
        raise _bad(f"`{unit}` must be a whole number")
    return value


def compute(args: dict, today: datetime | None = None) -> dict:
    operation = args.get("operation")
    if operation not in OPERATIONS:
        raise _bad(f"`operation` is one of {', '.join(OPERATIONS)}")
    zone = _zone(args.get("timezone"))
    try:
        if operation == "now":
            return _show((today or datetime.now(UTC)).astimezone(zone))
        moment = _moment(args, "date", zone)
        if operation == "weekday":
            return _show(moment)
        if operation == "convert":
            return _show(moment.astimezone(_zone(args.get("to_timezone"))))
        if operation == "difference":
            other = _moment(args, "other_date", zone)
            delta = other - moment
            seconds = delta.total_seconds()
            days = seconds / 86400
            return {"days": int(days) if days.is_integer() else days,
                    "whole_days": abs(delta).days * (1 if seconds >= 0 else -1),
                    "weeks_and_days": list(divmod(abs(delta).days, 7)), "seconds": seconds,
                    "from": moment.isoformat(), "to": other.isoformat()}
        months = int(_amount(args, "years")) * 12 + int(_amount(args, "months"))
        shifted = _add_months(moment, months) + timedelta(
            weeks=_amount(args, "weeks"), days=_amount(args, "days"), hours=_amount(args, "hours"),
            minutes=_amount(args, "minutes"), seconds=_amount(args, "seconds"))
        return _show(shifted)
    except OverflowError:
        raise _bad("the result is outside years 1..9999") from None


def run(args: dict, context: ToolContext) -> ToolOutput:
    return ToolOutput({"result": compute(args)})


TOOL = BuiltinTool(
    type="math:calendar",
    description="Dates and times: the current date and time in a time zone (`now`), the "
                "weekday of a date (`weekday`), the time between two dates (`difference`), "
                "a date plus a duration (`add`), a time in another time zone (`convert`).",
    parameters={"type": "object", "properties": {
        "operation": {"type": "string", "enum": list(OPERATIONS)},
        "date": {"type": "string", "description": "ISO 8601 date or date-time."},
        "other_date": {"type": "string", "description": "The second date, for `difference`."},
        "timezone": {"type": "string", "description": "IANA time zone, default UTC."},
        "to_timezone": {"type": "string", "description": "Target time zone, for `convert`."},
        **{unit: {"type": "number", "description": "For `add` (may be negative)."}
           for unit in UNITS}},
        "required": ["operation"]},
    run=run,
)

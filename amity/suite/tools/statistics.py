"""`math:statistics`: descriptive statistics over the numbers given (Python's
`statistics`, exact on the floats it is handed). `numbers` may be a JSON array or, as
small models often write it, a string of numbers separated by commas or spaces."""

import json
import math
import re
import statistics

from amity.suite.tools.base import BuiltinTool, ToolContext, ToolError, ToolOutput

MAX_NUMBERS = 100_000


def _numbers(value) -> list[float]:
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else [
                float(part) for part in re.split(r"[,;\s]+", text) if part]
        except ValueError:
            raise ToolError("invalid_arguments", "`numbers` must be a list of numbers") from None
    if not isinstance(value, list) or not value:
        raise ToolError("invalid_arguments", "`numbers` must be a non-empty list of numbers")
    if len(value) > MAX_NUMBERS:
        raise ToolError("invalid_arguments", f"at most {MAX_NUMBERS} numbers")
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | float | str):
            raise ToolError("invalid_arguments", f"{item!r} is not a number")
        try:
            number = float(item)
        except ValueError:
            raise ToolError("invalid_arguments", f"{item!r} is not a number") from None
        if not math.isfinite(number):
            raise ToolError("invalid_arguments", f"{item!r} is not a finite number")
        out.append(number)
    return out


def _plain(x: float) -> float | int:
    x = float(x)
    return int(x) if x.is_integer() and abs(x) < 2**53 else x


def describe(numbers: list[float]) -> dict:
    result = {
        "count": len(numbers), "sum": math.fsum(numbers), "mean": statistics.fmean(numbers),
        "median": statistics.median(numbers), "mode": statistics.multimode(numbers),
        "min": min(numbers), "max": max(numbers), "range": max(numbers) - min(numbers),
    }
    if len(numbers) > 1:
        q1, q2, q3 = statistics.quantiles(numbers, n=4, method="inclusive")
        result |= {"variance": statistics.variance(numbers), "stdev": statistics.stdev(numbers),
                   "pvariance": statistics.pvariance(numbers),
                   "pstdev": statistics.pstdev(numbers), "quartiles": [q1, q2, q3]}
    return {k: [_plain(x) for x in v] if isinstance(v, list) else
            v if isinstance(v, int) else _plain(v) for k, v in result.items()}


def run(args: dict, context: ToolContext) -> ToolOutput:
    return ToolOutput({"result": describe(_numbers(args.get("numbers")))})


TOOL = BuiltinTool(
    type="math:statistics",
    description="Descriptive statistics of a list of numbers: count, sum, mean, median, "
                "mode, min, max, range, sample and population variance and standard "
                "deviation, quartiles.",
    parameters={"type": "object", "properties": {
        "numbers": {"type": "array", "items": {"type": "number"},
                    "description": "The data."}},
        "required": ["numbers"]},
    run=run,
)

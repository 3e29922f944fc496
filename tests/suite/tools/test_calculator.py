"""math:calculator against its definition: exact results, Friendli's format, and
hostile expressions refused before they cost anything."""

import pytest

from amity.suite.tools.base import ToolContext, ToolError, ToolSettings
from amity.suite.tools.calculator import MAX_BITS, TOOL, evaluate


def call(expression):
    return TOOL.run({"expression": expression}, ToolContext(ToolSettings())).result["result"]


@pytest.mark.parametrize("expression, expected", [
    ("150 * 1.60934", "150 * 1.60934=241.401000000000"),  # Friendli's own example
    ("2 + 3 * 4", "2 + 3 * 4=14"),
    ("2^10", "2^10=1024"),
    ("-2**2", "-2**2=-4"),
    ("7 // 2 + 7 % 3", "7 // 2 + 7 % 3=4"),
    ("1/3", "1/3=1/3≈0.333333333333333"),
    ("sqrt(2)", "sqrt(2)=sqrt(2)≈1.41421356237310"),
    ("sin(pi/6)", "sin(pi/6)=1/2≈0.500000000000000"),
    ("log(1000, 10)", "log(1000, 10)=3"),
    ("factorial(20)", "factorial(20)=2432902008176640000"),
    ("0.1 + 0.2", "0.1 + 0.2=0.300000000000000"),
    ("2**200", f"2**200={2**200}"),
    ("max(3, 1, 2) - min(4, 5)", "max(3, 1, 2) - min(4, 5)=-1"),
])
def test_exact_results(expression, expected):
    assert call(expression) == expected


@pytest.mark.parametrize("expression", [
    "9**9**9", "10**100000", "2^(2^20)", "factorial(100000)", "(1/2)**-10**6",
    "0.5**-10**9", "(10**3000)**12",
    "__import__('os')", "__import__('os').system('true')", "().__class__", "x + 1",
    "open('/etc/passwd')", "'a' * 3", "[1, 2]", "lambda: 1", "(1).real", "True + 1",
    "exec('1')", "1 if 1 else 2", "a := 3", "sqrt(x=4)", "1" * 600,
    "-" * 300 + "1", "+".join(["1"] * 150), "(" * 300 + "1" + ")" * 300,
])
def test_hostile_or_non_arithmetic_refused(expression):
    with pytest.raises(ToolError) as error:
        evaluate(expression)
    assert error.value.type == "invalid_expression"


def test_intermediate_sizes_are_capped():
    # Each factor is small; their product passes the cap and is refused mid-way.
    with pytest.raises(ToolError, match=f"{MAX_BITS} bits"):
        evaluate("*".join(["10**3000"] * 5))


@pytest.mark.parametrize("expression", ["1/0", "log(0)", "0**-1"])
def test_undefined_results_are_math_errors(expression):
    with pytest.raises(ToolError) as error:
        evaluate(expression)
    assert error.value.type == "math_error"


def test_missing_argument():
    with pytest.raises(ToolError) as error:
        TOOL.run({}, ToolContext(ToolSettings()))
    assert error.value.type == "invalid_arguments"

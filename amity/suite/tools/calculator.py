"""`math:calculator`: exact arithmetic with sympy, behind a parser that admits only
arithmetic. The model's text is never `eval`ed (sympy's `sympify` would): Python's
`ast` parses it, a walk admits numbers, the operators, a few named constants and
functions, and builds the sympy expression itself, checking sizes at every step.

`150 * 1.60934` -> `{"result": "150 * 1.60934=241.401000000000"}`, the format of
Friendli's example (sympy prints Floats with 15 significant digits). A result that
is not a plain number (1/3, sqrt(2)) also carries its decimal value: `1/3=1/3≈0.333...`.
`^` is a power, as on a calculator. Time is bounded through size: integers are
capped at MAX_BITS bits, powers and factorials are refused before they are computed
when their result would pass it, and the expression's length and node count are capped.
"""

import ast
import math

import sympy

from amity.suite.tools.base import BuiltinTool, ToolContext, ToolError, ToolOutput, string_arg

MAX_CHARS = 500
MAX_NODES = 200
MAX_BITS = 33_220  # about 10,000 decimal digits
MAX_FACTORIAL = 2_000
MAX_DIGITS = 15  # of a decimal value

CONSTANTS = {"pi": sympy.pi, "e": sympy.E, "E": sympy.E, "tau": 2 * sympy.pi}


def _log(x, base=None):
    return sympy.log(x) if base is None else sympy.log(x, base)


def _factorial(n):
    if not (n.is_Integer and 0 <= n <= MAX_FACTORIAL):
        raise ToolError("invalid_expression",
                        f"factorial takes an integer from 0 to {MAX_FACTORIAL}")
    return sympy.factorial(n)


# name: (function, fewest arguments, most arguments)
FUNCTIONS = {
    "sqrt": (sympy.sqrt, 1, 1), "cbrt": (sympy.cbrt, 1, 1), "exp": (sympy.exp, 1, 1),
    "log": (_log, 1, 2), "ln": (sympy.log, 1, 1), "log10": (lambda x: sympy.log(x, 10), 1, 1),
    "log2": (lambda x: sympy.log(x, 2), 1, 1),
    "sin": (sympy.sin, 1, 1), "cos": (sympy.cos, 1, 1), "tan": (sympy.tan, 1, 1),
    "asin": (sympy.asin, 1, 1), "acos": (sympy.acos, 1, 1), "atan": (sympy.atan, 1, 1),
    "sinh": (sympy.sinh, 1, 1), "cosh": (sympy.cosh, 1, 1), "tanh": (sympy.tanh, 1, 1),
    "abs": (sympy.Abs, 1, 1), "floor": (sympy.floor, 1, 1), "ceil": (sympy.ceiling, 1, 1),
    "factorial": (_factorial, 1, 1), "gcd": (sympy.gcd, 2, 2), "lcm": (sympy.lcm, 2, 2),
    "min": (sympy.Min, 1, 16), "max": (sympy.Max, 1, 16),
}


def _refuse(msg: str) -> ToolError:
    return ToolError("invalid_expression", msg)


def _bits(value) -> int:
    if value.is_Rational:
        return max(int(value.p).bit_length(), int(value.q).bit_length())
    return 0


def _checked(value):
    if _bits(value) > MAX_BITS:
        raise _refuse(f"a number in the calculation passes {MAX_BITS} bits")
    return value


def _magnitude_bits(x) -> float:
    """About |log2 |x||: how many bits each unit of an exponent adds."""
    if x.is_Rational:
        return abs(int(x.p).bit_length() - int(x.q).bit_length()) + 1
    try:
        return abs(math.log2(abs(float(x))))
    except (OverflowError, ValueError):
        return math.inf


def _power(base, exponent):
    if base.is_number and exponent.is_number and base.is_real and exponent.is_real:
        if abs(base) not in (0, 1) and abs(exponent) > 1:
            if abs(float(exponent)) * max(_magnitude_bits(base), 1.0) > MAX_BITS:
                raise _refuse(f"the power would pass {MAX_BITS} bits")
    return sympy.Pow(base, exponent)


BINARY = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: sympy.floor(a / b),
    ast.Mod: sympy.Mod, ast.Pow: _power, ast.BitXor: _power,
}


def _build(node: ast.AST):
    if isinstance(node, ast.Expression):
        return _build(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise _refuse(f"{node.value!r} is not a number")
        if isinstance(node.value, float):
            # The literal's digits, not the binary value's, at sympy's default precision.
            return sympy.Float(repr(node.value), MAX_DIGITS)
        return _checked(sympy.Integer(node.value))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _build(node.left), _build(node.right)
        return _checked(BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _build(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name):
        if node.id not in CONSTANTS:
            raise _refuse(f"unknown name {node.id!r}; constants: {', '.join(CONSTANTS)}")
        return CONSTANTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id not in FUNCTIONS:
            raise _refuse(f"unknown function {node.func.id!r}; functions: {', '.join(FUNCTIONS)}")
        function, fewest, most = FUNCTIONS[node.func.id]
        if not fewest <= len(node.args) <= most:
            raise _refuse(f"{node.func.id} takes {fewest}..{most} arguments")
        return _checked(function(*[_build(a) for a in node.args]))
    raise _refuse(f"only arithmetic is allowed, not {type(node).__name__}")


def evaluate(expression: str) -> str:
    """`expression=value`, or ToolError."""
    text = expression.strip()
    if len(text) > MAX_CHARS:
        raise _refuse(f"the expression may be at most {MAX_CHARS} characters")
    try:
        tree = ast.parse(text.replace("×", "*").replace("÷", "/"), mode="eval")
    except (SyntaxError, ValueError) as error:
        raise _refuse(f"not an arithmetic expression: {error.msg if hasattr(error, 'msg') else error}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise _refuse(f"the expression may have at most {MAX_NODES} parts")
    try:
        value = _build(tree)
    except (ZeroDivisionError, OverflowError, TypeError, ValueError) as error:
        raise ToolError("math_error", str(error)) from None
    if value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        raise ToolError("math_error", "the result is undefined (a division by zero?)")
    if not value.is_number:
        raise ToolError("math_error", f"the result {value} is not a number")
    if value.is_Integer or value.is_Float:
        return f"{text}={value}"
    return f"{text}={value}≈{sympy.N(value, MAX_DIGITS)}"


def run(args: dict, context: ToolContext) -> ToolOutput:
    return ToolOutput({"result": evaluate(string_arg(args, "expression", MAX_CHARS))})


TOOL = BuiltinTool(
    type="math:calculator",
    description="Evaluate an arithmetic expression exactly, e.g. `150 * 1.60934` or "
                "`sqrt(2) * (3 + 4)^2`. Operators + - * / // % ** (or ^); constants pi, e; "
                "functions " + ", ".join(FUNCTIONS) + ".",
    parameters={"type": "object", "properties": {
        "expression": {"type": "string", "description": "The expression to evaluate."}},
        "required": ["expression"]},
    run=run,
)

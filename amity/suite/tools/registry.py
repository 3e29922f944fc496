"""The built-in tools by Friendli name and by the function name the model sees."""

from amity.suite.tools import calculator, calendar, file_text, interpreter, statistics, web_url
from amity.suite.tools.base import BuiltinTool
from amity.suite.tools.web_search import LINKUP_SEARCH, WEB_SEARCH

BUILTIN_TOOLS: dict[str, BuiltinTool] = {t.type: t for t in (
    calculator.TOOL, statistics.TOOL, calendar.TOOL, interpreter.TOOL, file_text.TOOL,
    web_url.TOOL, WEB_SEARCH, LINKUP_SEARCH)}
BY_FUNCTION_NAME: dict[str, BuiltinTool] = {t.function_name: t for t in BUILTIN_TOOLS.values()}

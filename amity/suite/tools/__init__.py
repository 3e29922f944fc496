"""Built-in tools of tool-assisted chat and the loop that runs them (issue 21)."""

"""Serverless: the model catalog and tool-assisted chat (issue 21)."""

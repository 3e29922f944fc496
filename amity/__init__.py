"""amity: an LLM inference engine and the Friendli Container API around it."""

__version__ = "0.1.0"

"""audit: gate LLM-generated token data before it trains an EAGLE-3 drafter."""

__version__ = "0.1.0"

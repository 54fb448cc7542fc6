"""Data steps: readers for text, JSONL, CSV/TSV and STS files."""

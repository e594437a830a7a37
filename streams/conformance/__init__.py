"""Conformance runners: upstream's transcribed test cases and the golden random traces."""

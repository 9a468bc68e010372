"""Helpers and plain references only the tests use (tests/ is on the tests' path, so they
import ``support.<module>``); what benchmarks use as well lives in benchmarks/harness/."""

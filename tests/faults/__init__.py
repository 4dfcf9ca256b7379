"""The seeded fault test (issue #25): workers take locks while a controller injects faults,
and a checker reads back what happened. See docs/faults.md."""

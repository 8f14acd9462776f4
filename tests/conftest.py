"""The suite's fixtures live in one plugin, tests/support/plugin.py; helpers are imported from tests.support."""

pytest_plugins = ["tests.support.plugin", "pytester"]

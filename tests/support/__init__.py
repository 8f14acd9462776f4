"""What tests share: helpers to import (ports, waiting, simulator processes, machine-wide resources) and
the one pytest plugin (`tests.support.plugin`, loaded by the root conftest) that holds the shared fixtures.

Test modules import helpers from here, never from another package's conftest or test module.
"""

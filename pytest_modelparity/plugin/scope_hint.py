"""Say what to do when a conftest overrides one of the plugin's fixtures with too narrow a scope.

Why: ``@pytest.fixture def modelparity_source()`` (function scope, pytest's default) makes pytest
stop every test with a bare ``ScopeMismatch: You tried to access the function scoped fixture
modelparity_source with a module scoped request object``: true, but it names neither the cause
(the plugin builds the reference and the candidates once, from that fixture) nor the fix.
"""

from __future__ import annotations

import re

# The fixtures a suite overrides in conftest.py, read by the plugin's module/session fixtures.
OVERRIDABLE = ("modelparity_source", "modelparity_load_options", "modelparity_export_options",
               "modelparity_elements")

_MISMATCH = re.compile(r"ScopeMismatch: You tried to access the (\w+) scoped fixture (\w+) with a (\w+) scoped "
                       r"request object")


def scope_mismatch_message(text: str) -> str | None:
    """The plugin's explanation of pytest's ``ScopeMismatch`` text, or None when it is about
    another fixture."""
    found = _MISMATCH.search(text)
    if found is None or found.group(2) not in OVERRIDABLE:
        return None
    scope, name, needed = found.groups()
    defined = re.search(r"Requested fixture:\s*\n\s*(\S+:\d+)", text)  # "conftest.py:3:  def ..."
    at = f" ({defined.group(1)})" if defined else ""
    return (f"modelparity: the fixture {name}{at} is {scope}-scoped, but the plugin reads it from {needed}-scoped "
            f"fixtures (parity_reference and parity_candidate are built once and shared across tests), so pytest "
            f"cannot give it to them. Declare it session-scoped in conftest.py:\n\n"
            f"    @pytest.fixture(scope=\"session\")\n"
            f"    def {name}():\n"
            f"        ...\n\n"
            f"(pytest said: {found.group(0)})")

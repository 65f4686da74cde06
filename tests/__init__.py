"""The tests. The shared helpers' ``assert`` statements (tests/helpers/) are rewritten as the tests'
are, so a failing one shows both sides: registered here, before anything imports them."""

import pytest

pytest.register_assert_rewrite("tests.helpers")

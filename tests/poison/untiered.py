"""A self-test that says nothing of what it needs (no tier marker): tests/test_tiers.py collects it and must see the
collection fail in one line naming it. Never collected by ``pytest tests`` (not a test_*.py file)."""


def test_without_a_tier():
    assert True

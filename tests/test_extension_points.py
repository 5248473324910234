"""Extension points (issue 30 item 4): `Software.at_least` is the one "installed version >= X" test, a
quantization method is one record, an attention backend is one record. A method or backend registered in
its table alone is planned, with no edit elsewhere."""

from __future__ import annotations

from cudaload.facts.machine import Software


def test_at_least_compares_installed_versions_by_pep440() -> None:
    software = Software(packages=(("odd", "not-a-version"), ("torch", "2.8.0"), ("transformers", "5.23.0rc1")))
    assert software.at_least("torch", "2.8")
    assert not software.at_least("torch", "2.9")
    assert not software.at_least("peft", "0")  # not installed
    assert not software.at_least("odd", "0")  # a version that does not parse is never new enough
    # A ".dev0" minimum admits the minor's pre-releases (the rule "release >= (5, 23)" it replaces).
    assert software.at_least("transformers", "5.23.dev0")
    assert not software.at_least("transformers", "5.23.0")

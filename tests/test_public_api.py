import re
import subprocess
import sys
from pathlib import Path

import pytest

import cudaload

DOCS = Path(__file__).parents[1] / "docs" / "api.md"


def test_all_is_exactly_what_the_api_page_documents() -> None:
    documented = set(re.findall(r"^### `([A-Za-z_]+)", DOCS.read_text(), re.MULTILINE))
    assert documented == set(cudaload.__all__) - {"__version__"}


def test_every_public_name_resolves() -> None:
    for name in cudaload.__all__:
        assert getattr(cudaload, name) is not None


def test_import_has_no_side_effects() -> None:
    code = (
        "import socket, sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "def refuse(*a, **k): raise SystemExit('network touched at import')\n"
        "socket.socket.connect = refuse\n"
        "import cudaload\n"
        "heavy = [m for m in ('torch', 'transformers', 'pynvml', 'accelerate') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    assert out.stderr == ""


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="not_a_thing"):
        cudaload.not_a_thing  # noqa: B018

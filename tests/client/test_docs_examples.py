"""Every ```python example in docs/client.md runs against a live meshmq (its ports
substituted for the documented 61613 / 1883)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.brokers import ThreadBroker

DOC = Path(__file__).parents[2] / "docs" / "client.md"
# A phrase in an example's code -> what that example must print.
EXPECTED = {"/queue/orders": "order 1 42", "EUR 1.08": "EUR 1.08",
            "topology/member/activated": "event: member-1",
            "plant/boiler": "plant/boiler/temperature b'81.5'"}
EXAMPLES = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_examples() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_example_runs(index: int, meshmq: ThreadBroker, capsys: pytest.CaptureFixture[str]
                      ) -> None:
    assert meshmq.runtime is not None
    stomp = meshmq.runtime.addresses["stomp"][1]
    mqtt = meshmq.runtime.addresses["mqtt"][1]
    code = EXAMPLES[index].replace(":61613", f":{stomp}").replace(":1883", f":{mqtt}")
    exec(compile(code, f"docs/client.md example {index + 1}", "exec"), {"__name__": "doc"})
    out = capsys.readouterr().out
    if "print(" in code:
        assert out.strip(), "the example printed nothing"
    for marker, expected in EXPECTED.items():
        if marker in code:
            assert expected in out

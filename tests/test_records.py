"""broker/records.py: the records made per message compare as attrs classes did."""

from __future__ import annotations

import pytest

from broker.related import Related
from broker.requestmap import InFlight, InputRound
from broker.session import Forward, Reply
from broker.upstream_actions import Deliver, SendUpstream

MESSAGE = {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_a_record_equals_one_of_its_type_with_equal_fields() -> None:
    assert Reply(dict(MESSAGE)) == Reply(dict(MESSAGE))
    assert Deliver("s", MESSAGE) == Deliver("s", MESSAGE, None)
    assert Deliver("s", MESSAGE, related=1) != Deliver("s", MESSAGE, related=2)
    assert InFlight("s", 1, "tools/call") == InFlight("s", 1, "tools/call", None, None)
    assert InFlight("s", 1, "tools/call") != InFlight("s", "1", "tools/call")
    assert InputRound(MESSAGE, 1) != InputRound(MESSAGE, 2)


def test_records_of_other_types_differ_whatever_their_fields() -> None:
    assert Reply(MESSAGE) != SendUpstream(MESSAGE)
    assert Forward("s", MESSAGE) != Deliver("s", MESSAGE)
    assert Reply(MESSAGE) != MESSAGE


def test_a_record_shows_its_fields_and_cannot_be_hashed() -> None:
    assert repr(Forward("a", MESSAGE)) == f"Forward('a', {MESSAGE!r})"
    assert repr(InputRound(MESSAGE)) == f"InputRound({MESSAGE!r}, 0)"
    with pytest.raises(TypeError):
        hash(Reply(MESSAGE))


def test_a_related_message_is_a_record_hashed_by_its_request() -> None:
    assert Related(MESSAGE, 1) == Related(dict(MESSAGE), 1)
    assert Related(MESSAGE, 1) != Related(MESSAGE, "1")
    assert hash(Related(MESSAGE, "a")) == hash(Related({}, "a"))
    assert repr(Related(MESSAGE, 1)) == f"Related({MESSAGE!r}, 1)"

"""Checks of a Trace Event Format export (the chrome format of ``hpcopt export``), shared by the
serial and the MPI timeline tests."""

from __future__ import annotations


def check_trace_event_format(document: dict) -> list[dict]:
    """The JSON Object Format of the Trace Event Format: {"traceEvents": [...]}, every event
    with its required fields and types; the complete ("X") events, returned."""
    assert isinstance(document, dict) and isinstance(document["traceEvents"], list)
    complete = []
    for event in document["traceEvents"]:
        assert isinstance(event["name"], str) and isinstance(event["ph"], str), event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "process_sort_index", "thread_name"), event
            assert isinstance(event["args"], dict), event
        else:
            assert event["ph"] == "X", event
            assert isinstance(event["cat"], str), event
            assert isinstance(event["ts"], (int, float)) and isinstance(event["dur"], (int, float)), event
            assert event["dur"] >= 0, event
            complete.append(event)
    return complete


def assert_nested(events: list[dict]) -> None:
    """On each thread, any two spans are disjoint or one holds the other (how viewers stack them)."""
    threads: dict[tuple[int, int], list[dict]] = {}
    for event in events:
        threads.setdefault((event["pid"], event["tid"]), []).append(event)
    slack = 0.01  # microseconds: the export rounds to nanoseconds
    for spans in threads.values():
        open_ends: list[float] = []
        for event in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= event["ts"] + slack:
                open_ends.pop()
            end = event["ts"] + event["dur"]
            assert not open_ends or end <= open_ends[-1] + slack, event
            open_ends.append(end)

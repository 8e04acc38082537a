"""The host line: connection state and the free space where a host's runs write, red once it is low."""
from __future__ import annotations

from orchestrator.watch.model import HostView
from tui.widgets.host_status import host_text


def test_a_host_shows_its_free_space_and_marks_it_when_low() -> None:
    assert host_text(HostView(name="pve1", connected=True)).plain == "● pve1"
    roomy = host_text(HostView(name="pve1", connected=True, free_bytes=300 * 1024 ** 3, total_bytes=10 ** 12))
    assert roomy.plain == "● pve1 300 GiB free"
    low = host_text(HostView(name="pve2", connected=True, free_bytes=512 * 1024, total_bytes=10 ** 9,
                             low_disk=True))
    assert low.plain == "● pve2 512 KiB free"
    assert any("red" in str(span.style) for span in low.spans)
    assert not any("red" in str(span.style) for span in roomy.spans)


def test_a_host_that_answers_names_its_containers_that_do_not() -> None:
    partly = host_text(HostView(name="pve1", connected=True, unreachable=("pve1/201", "pve1/202"),
                                error="the watch agent ended (exit code 2)"))
    assert partly.plain == "● pve1 (201, 202 not answering)"

"""What can have run on a sender while its request waits in a queue (rules/history.py): the
cases where kvtrace must NOT narrow it, on generated trees (the shapes of
tests/property/test_stage_guard_property.py, with one more statement)."""

from __future__ import annotations

from pathlib import Path

from tests.property.test_stage_guard_property import BOOTSTRAP, Shape, raised_while_queued, render_prefill, write_tree

from kvtrace.scan import scan_path

# send() sets the flag poll() raises on, and only the later stage calls it.
LATER_SEND = Shape((("prepare", "later"), ("init", "drain"), ("send", "later")), ("send",), "Bootstrapping")


def raises_reported(root: Path) -> list[str]:
    return [f.message for f in scan_path(root).findings
            if f.rule == "poll-raises" and f.backend == "calm" and f.queue == BOOTSTRAP]


def test_a_flag_only_the_later_stage_sets_is_no_raise_in_the_queue(tmp_path: Path) -> None:
    root = write_tree(tmp_path, LATER_SEND)
    assert raised_while_queued(root) is False
    assert raises_reported(root) == []


def test_a_request_appended_back_with_its_old_sender_keeps_the_raise(tmp_path: Path) -> None:
    """The later stage puts a request back into the queue's list (`...bootstrap_queue.queue.append`,
    as 0.5.13's optimistic-prefill retry does) after send() ran on its sender: that request
    brings the flag with it. kvtrace cannot tie that append to a fresh sender: no narrowing."""
    root = write_tree(tmp_path, LATER_SEND)
    prefill = root / "disaggregation" / "prefill.py"
    prefill.write_text(render_prefill(LATER_SEND) + "            self.disagg_prefill_bootstrap_queue.queue.append(req)\n")
    assert raises_reported(root), "a re-entered request's sender has run send()"


def test_an_entry_that_does_not_build_the_sender_keeps_the_raise(tmp_path: Path) -> None:
    """The entry appends a request whose sender was built elsewhere (it may have run anything)."""
    root = write_tree(tmp_path, LATER_SEND)
    prefill = root / "disaggregation" / "prefill.py"
    text = render_prefill(LATER_SEND).replace("        req.disagg_kv_sender = sender_class(None, req.room)\n", "")
    prefill.write_text(text)
    assert raises_reported(root), "the appended request's sender has a past kvtrace cannot see"


def test_a_loop_over_the_queue_that_sends_keeps_the_raise(tmp_path: Path) -> None:
    """Code that walks the queued requests and calls send() on them (not only the later stage)."""
    root = write_tree(tmp_path, LATER_SEND)
    prefill = root / "disaggregation" / "prefill.py"
    prefill.write_text(render_prefill(LATER_SEND) + "\n    def flush(self):\n"
                       "        for req in self.disagg_prefill_bootstrap_queue.queue:\n"
                       "            req.disagg_kv_sender.send()\n")
    assert raises_reported(root), "send() runs on queued requests"

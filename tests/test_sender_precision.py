"""Sender analysis precision: stores made by functions nested in methods (thread targets,
callbacks), the line of the `return` a state comes from, and values handed back in tuples.
Each tree is hand-written in the shape of a transfer backend."""

from __future__ import annotations

from pathlib import Path

from kvtrace.report.verdicts import NOT_RETURNED, UNKNOWN, verdict_grid
from kvtrace.rules.samples import STANDARD_BRANCHES, drain
from kvtrace.scan import scan_path
from tests.trees import write_tree


def _tree(tmp_path: Path, manager_methods: str, sender_methods: str = "") -> Path:
    """A `relay` backend: a manager whose status table is `self.rooms`, moved along by
    `manager_methods`; a sender whose poll() returns what the table holds (no abort, no deadline)."""
    conn = f'''\
import threading

from ..base.conn import BaseKVSender, KVPoll


class BaseKVManager:
    pass


class RelayKVManager(BaseKVManager):
    def __init__(self, args):
        self.rooms = {{}}
        self.lock = threading.Lock()

    def check_status(self, room):
        return self.rooms[room]

    def update_status(self, room, status):
        self.rooms[room] = status

{manager_methods}

class RelayKVSender(BaseKVSender):
    def __init__(self, mgr: RelayKVManager, addr, room):
        self.kv_mgr = mgr
        self.room = room
        self.kv_mgr.update_status(room, KVPoll.Bootstrapping)

    def poll(self):
        return self.kv_mgr.check_status(self.room)
{sender_methods}'''
    return write_tree(tmp_path, {"disaggregation/prefill.py": drain(STANDARD_BRANCHES),
                                 "disaggregation/relay/conn.py": conn})


def _relay(tmp_path: Path, manager_methods: str, sender_methods: str = ""):
    report = scan_path(_tree(tmp_path, manager_methods, sender_methods))
    assert all(f.status == "ok" for f in report.files), [(f.path, f.error) for f in report.files]
    return report, next(b for b in report.backends if b.name == "relay")


def test_a_thread_closure_store_is_reached(tmp_path: Path) -> None:
    """The worker is started as a thread, never called by name: its stores still happen."""
    report, relay = _relay(tmp_path, '''\
    def start_workers(self):
        def worker(room, ok):
            self.update_status(room, KVPoll.WaitingForInput)
            self.update_status(room, KVPoll.Success if ok else KVPoll.Failed)

        threading.Thread(target=worker, args=(0, True), daemon=True).start()
''')
    assert relay.returns == ["Failed", "Bootstrapping", "WaitingForInput", "Success"]
    pinned = {f.state for f in report.findings if f.rule == "pinned-state" and f.backend == "relay"}
    assert pinned == {"Bootstrapping", "WaitingForInput"}  # no abort, no deadline


def test_a_closure_reaches_a_method_through_the_enclosing_self(tmp_path: Path) -> None:
    """A closure in __init__ reads `self` from the enclosing method and hands a message to a
    method that stores the state (a method called only from the closure is not an entry point)."""
    _, relay = _relay(tmp_path, '''\
    def serve(self, sock):
        def on_message():
            while True:
                msg = sock.recv()
                self._on_ready(msg)

        threading.Thread(target=on_message).start()

    def _on_ready(self, msg):
        with self.lock:
            self.update_status(msg.room, KVPoll.Transferring)
''')
    assert "Transferring" in relay.returns


def test_a_closure_in_a_closure_and_a_nested_class_are_told_apart(tmp_path: Path) -> None:
    """A closure nested two levels deep runs; a class defined in a method has its own `self`,
    so its store is not tied to the manager: every stored state counts (never dropped)."""
    _, relay = _relay(tmp_path, '''\
    def start(self):
        def outer():
            def inner():
                self.update_status(0, KVPoll.Transferring)
            threading.Thread(target=inner).start()
        threading.Thread(target=outer).start()

        class Handler:
            def handle(this, mgr):
                mgr.update_status(0, KVPoll.WaitingForInput)
        self.handler = Handler()
''')
    assert {"Transferring", "WaitingForInput"} <= set(relay.returns)


def test_a_callback_lambda_store_is_never_dropped(tmp_path: Path) -> None:
    """A lambda body is not run, so the table's reachable values cannot be refined: the state
    the lambda stores still counts, and the grid never says 'poll() never returns it'."""
    report, relay = _relay(tmp_path, '''\
    def register(self, bus):
        bus.on_done(lambda room: self.update_status(room, KVPoll.Success))
''')
    assert "Success" in relay.returns
    assert verdict_grid(report).cells["relay", "Success"][0] not in (NOT_RETURNED, UNKNOWN)


def test_without_the_closure_the_state_is_never_returned(tmp_path: Path) -> None:
    """The counterpart: a state no code stores is `-`, so the tests above are not vacuous."""
    report, relay = _relay(tmp_path, '''\
    def start_workers(self):
        def worker(room):
            self.lock.acquire()

        threading.Thread(target=worker, args=(0,)).start()
''')
    assert relay.returns == ["Bootstrapping"]
    assert verdict_grid(report).cells["relay", "WaitingForInput"][0] == NOT_RETURNED


# --- the line a state is returned at ----------------------------------------------------------


def _pin_chain(report, backend: str, state: str):
    finding = next(f for f in report.findings if f.rule == "pinned-state" and f.backend == backend and f.state == state)
    backend_info = next(b for b in report.backends if b.name == backend)
    return finding, backend_info.verdicts[state].chain


def test_the_chain_cites_the_return_and_names_the_table_only_when_it_is_read(tmp_path: Path) -> None:
    """poll() returns Transferring from a constant once the chunks are sent, whatever the table
    holds (Failed included): the link cites that `return` and never says 'when the table holds
    Failed'. The WaitingForInput it hands back from the table names the table's value."""
    root = _tree(tmp_path, '''\
    def on_decode_ready(self, room):
        self.update_status(room, KVPoll.WaitingForInput)

    def on_error(self, room):
        self.update_status(room, KVPoll.Failed)
''', '''
    def send(self, chunk):
        self.sent = True
''')
    conn = root / "disaggregation/relay/conn.py"
    text = conn.read_text().replace('''    def poll(self):
        return self.kv_mgr.check_status(self.room)''', '''    def poll(self):
        if not self.sent:
            status = self.kv_mgr.check_status(self.room)
            return status
        return KVPoll.Transferring''').replace("        self.room = room\n", "        self.room = room\n        self.sent = False\n")
    conn.write_text(text)
    lines = text.splitlines()
    report = scan_path(root)
    finding, chain = _pin_chain(report, "relay", "Transferring")
    first = chain[0]
    assert lines[first.line - 1].strip() == "return KVPoll.Transferring"
    assert first.note == f"RelayKVSender.poll() returns Transferring at line {first.line}"
    assert "holds" not in finding.message.split("has no way out of it:")[1]
    _, chain = _pin_chain(report, "relay", "WaitingForInput")
    assert lines[chain[0].line - 1].strip() == "return status"
    assert chain[0].note.endswith("when rooms holds WaitingForInput for the room")
    from kvtrace.report.verdicts import way_out_text
    relay = next(b for b in report.backends if b.name == "relay")
    assert way_out_text(relay.verdicts["Transferring"]).endswith(f"returned at {first.path}:{first.line}")


def test_a_state_returned_through_a_helper_cites_the_helper_return(tmp_path: Path) -> None:
    """`return self._settled()` hands back what the helper returns: the helper's `return` line."""
    root = _tree(tmp_path, "", '''
    def _settled(self):
        return KVPoll.WaitingForInput
''')
    conn = root / "disaggregation/relay/conn.py"
    text = conn.read_text().replace("        return self.kv_mgr.check_status(self.room)\n",
                                    "        return self._settled()\n")
    conn.write_text(text)
    _, chain = _pin_chain(scan_path(root), "relay", "WaitingForInput")
    assert text.splitlines()[chain[0].line - 1].strip() == "return KVPoll.WaitingForInput"
    assert "_settled" in text.splitlines()[chain[0].line - 2]


# --- values handed back in tuples ---------------------------------------------------------------


def _poll_tree(tmp_path: Path, poll_body: str, helpers: str) -> tuple[Path, str]:
    root = _tree(tmp_path, "", helpers)
    conn = root / "disaggregation/relay/conn.py"
    text = conn.read_text().replace("        return self.kv_mgr.check_status(self.room)\n", poll_body)
    conn.write_text(text)
    return root, text


def test_a_state_returned_in_a_tuple_is_followed(tmp_path: Path) -> None:
    """`status, _ = self._give_up(...)` with `return KVPoll.Failed, reason`, a literal tuple
    unpacked, and `f()[0]`: each element is followed by position, nothing is unknown."""
    root, _ = _poll_tree(tmp_path, '''\
        status = self.kv_mgr.check_status(self.room)
        if status == KVPoll.Bootstrapping and self.gave_up:
            failed, _ = self._give_up("peer gone")
            return failed
        if status == KVPoll.Bootstrapping and self.stalled:
            first, second = (KVPoll.Success, "done")
            return first
        if self.redirected:
            return self._pair()[1]
        return status
''', '''
    def _give_up(self, why):
        return KVPoll.Failed, why

    def _pair(self):
        return "ignored", KVPoll.WaitingForInput
''')
    report = scan_path(root)
    relay = next(b for b in report.backends if b.name == "relay")
    assert relay.returns_unknown == []
    assert relay.returns == ["Failed", "Bootstrapping", "WaitingForInput", "Success"]
    grid = verdict_grid(report)
    assert grid.cells["relay", "Failed"][0] != UNKNOWN and grid.cells["relay", "Transferring"][0] == NOT_RETURNED


def test_an_unknown_value_names_the_function_and_line_it_comes_from(tmp_path: Path) -> None:
    """A starred unpacking is not followed: the `unknown:` line says which return hands it back."""
    root, text = _poll_tree(tmp_path, '''\
        if self.concluded:
            return self._last()
        return KVPoll.Bootstrapping
''', '''
    def _last(self):
        *_, status = self.history()
        return status
''')
    relay = next(b for b in scan_path(root).backends if b.name == "relay")
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.strip() == "return status")
    assert relay.returns_unknown == [
        f"a value kvtrace cannot follow: RelayKVSender._last() returns it at disaggregation/relay/conn.py:{line}"]

"""NIXL transfer backend (kvtrace fixture "nixl-pin").

The sender's abort() records the failure in conclude_state, but poll() never
looks at it, and nothing on this path times out. A room that was cleared reads
as WaitingForInput through the manager's default, so the request is polled as
"still waiting" forever.
"""

from __future__ import annotations

import logging
import threading
from typing import Dict, List, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import (
    BaseKVManager,
    BaseKVReceiver,
    BaseKVSender,
    KVArgs,
    KVPoll,
)

logger = logging.getLogger(__name__)


class NixlKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        from nixl._api import nixl_agent

        self.kv_args = args
        self.agent = nixl_agent(f"prefill-{args.engine_rank}", None)
        self.request_status: Dict[int, int] = {}
        self.failure_records: Dict[int, str] = {}
        self.status_lock = threading.Lock()

    def check_status(self, bootstrap_room: int) -> int:
        # An unknown room is reported as still waiting for decode.
        return self.request_status.get(bootstrap_room, KVPoll.WaitingForInput)  # expect: absent-room-default[:WaitingForInput]

    def update_status(self, bootstrap_room: int, status: int) -> None:
        with self.status_lock:
            if bootstrap_room not in self.request_status:  # expect: silent-status-drop[:Failed]
                # The room was already cleared, so a late update changes nothing.
                return
            if status == KVPoll.Failed:
                self.request_status[bootstrap_room] = KVPoll.Failed
            else:
                current = self.request_status[bootstrap_room]
                self.request_status[bootstrap_room] = max(current, status)  # expect: failed-not-sticky[:Failed]

    def add_transfer_request(self, bootstrap_room, kv_indices, index_slice, is_last, chunk_id, aux_index):
        ...


class NixlKVSender(BaseKVSender):
    def __init__(self, mgr: NixlKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_server_url = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self.aux_index: Optional[int] = None
        self.xfer_handles: List[object] = []
        self.has_sent = False
        self.chunk_id = 0
        self.conclude_state: Optional[int] = None

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32], index_slice: slice, is_last: bool):
        handles = self.kv_mgr.add_transfer_request(
            self.bootstrap_room, kv_indices, index_slice, is_last, self.chunk_id, self.aux_index
        )
        self.xfer_handles.extend(handles)
        self.chunk_id += 1
        if is_last:
            self.has_sent = True

    def poll(self) -> KVPoll:  # expect: pinned-state[nixl:WaitingForInput], pinned-state[nixl:Transferring] ; expect: abort-ignored[nixl:], no-timeout[nixl:Bootstrapping], no-timeout[nixl:Transferring], no-timeout[nixl:WaitingForInput]
        if not self.has_sent:
            # The bootstrap thread moves the room along in request_status.
            return self.kv_mgr.check_status(self.bootstrap_room)
        states = [self.kv_mgr.agent.check_xfer_state(h) for h in self.xfer_handles]
        if any(s == "ERR" for s in states):
            return KVPoll.Failed
        if all(s == "DONE" for s in states):
            return KVPoll.Success
        return KVPoll.Transferring

    def abort(self) -> None:
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed

    def failure_exception(self):
        reason = self.kv_mgr.failure_records.pop(self.bootstrap_room, "no reason recorded")
        raise RuntimeError(f"NIXL transfer for room {self.bootstrap_room} failed, {reason}")


class NixlKVReceiver(BaseKVReceiver):
    """Decode side; not a sender, so never a prefill backend."""

    def __init__(self, mgr: NixlKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.started = False

    def init(self, kv_indices: npt.NDArray[np.int32], aux_index: Optional[int] = None):
        self.started = True

    def poll(self) -> KVPoll:
        if not self.started:
            return KVPoll.Bootstrapping
        return self.kv_mgr.check_status(self.bootstrap_room)

    def failure_exception(self):
        raise RuntimeError(f"NIXL receive for room {self.bootstrap_room} failed")

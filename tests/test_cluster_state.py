"""The state several ``aoq serve`` workers share (aoq_serve.cluster): exact counts across two
workers' views of one file, and a dead worker's share dropped."""

from __future__ import annotations

import threading
import time

from aoq_serve.cluster.board import Board
from aoq_serve.cluster.budget import SharedMemoryBudget
from aoq_serve.cluster.connections import SharedConnections
from aoq_serve.cluster.state import Shared


def _two_workers(tmp_path, max_connections: int = 10) -> tuple[Shared, Shared]:
    first = Shared.create(tmp_path, 2, max_connections)
    return first, first.reopen()


def test_connection_caps_count_both_workers(tmp_path):
    a, b = _two_workers(tmp_path)
    w0, w1 = SharedConnections(a, 0, 5, 3), SharedConnections(b, 1, 5, 3)
    assert [w0.admit("10.0.0.1"), w1.admit("10.0.0.1"), w0.admit("10.0.0.1")] == [True, True, True]
    assert not w1.admit("10.0.0.1") and not w0.admit("10.0.0.1")  # the client's cap, over both workers
    assert w1.admit("10.0.0.2") and w1.admit("10.0.0.3")
    assert not w0.admit("10.0.0.4")  # 5 open in all
    w1.release("10.0.0.1")
    assert w0.admit("10.0.0.1")
    a.forget(0)  # worker 0 died: its three connections from 10.0.0.1 no longer count
    assert [w1.admit("10.0.0.1") for _ in range(4)] == [True, True, True, False]


def test_many_addresses_reuse_freed_rows(tmp_path):
    a, _ = _two_workers(tmp_path, max_connections=4)
    conns = SharedConnections(a, 0, 4, 4)
    for i in range(10 * a.slots):  # far more addresses than rows, one open at a time
        assert conns.admit(f"10.1.{i // 256}.{i % 256}")
        conns.release(f"10.1.{i // 256}.{i % 256}")
    assert int(a.conns[:, 1:].sum()) == 0


def test_decode_budget_is_shared_and_a_dead_workers_share_is_freed(tmp_path):
    a, b = _two_workers(tmp_path)
    first, second = SharedMemoryBudget(a, 0, 100), SharedMemoryBudget(b, 1, 100)
    got = threading.Event()

    def reserve_second() -> None:
        with second.reserve(60):
            got.set()

    with first.reserve(60):
        thread = threading.Thread(target=reserve_second)
        thread.start()
        time.sleep(0.1)
        assert not got.is_set() and second.in_use == 60  # waits for the other worker's 60
    thread.join(5)
    assert got.is_set() and first.in_use == 0

    held = first.reserve(80)
    held.__enter__()  # worker 0 dies holding 80: never released by itself
    a.forget(0)
    with second.reserve(100):
        assert second.in_use == 100


def test_reload_requests_reach_the_other_worker(tmp_path):
    a, b = _two_workers(tmp_path)
    board0, board1 = Board(a, 0), Board(b, 1)
    board0.join()
    board1.join()
    assert board1.pending() is None
    number = board0.request_reload()
    assert board0.pending() is None and board1.pending() == number
    assert not board0.wait_all(number, 0.05)
    board1.done(number)
    assert board0.wait_all(number, 1.0)
    board1.publish({"generation": 3})
    assert board0.states()[-1] == {"generation": 3, "worker": 1, "pid": board0.states()[-1]["pid"]}


def test_index_arrays_are_shared_once_or_kept_when_the_directory_cannot_hold_them(tmp_path):
    import numpy as np

    from aoq_serve.index import shared as sharing

    array = np.arange(24, dtype=np.float32).reshape(4, 6)
    try:
        sharing.set_share_dir(tmp_path)
        first, second = sharing.shared(array), sharing.shared(array.copy())
        assert isinstance(first, np.memmap) and first.filename == second.filename  # one file for both
        assert np.array_equal(first, array) and not first.flags.writeable
        sharing.set_share_dir(tmp_path / "missing")  # cannot be written: the array itself
        assert sharing.shared(array) is array
    finally:
        sharing.set_share_dir(None)

import pytest
from containers.fifo import Empty, Queue


def test_interleaved():
    q = Queue()
    q.enqueue("a")
    q.enqueue("b")
    assert q.dequeue() == "a"
    q.enqueue("c")
    assert [q.dequeue(), q.dequeue()] == ["b", "c"]


def test_empty():
    with pytest.raises(Empty):
        Queue().dequeue()

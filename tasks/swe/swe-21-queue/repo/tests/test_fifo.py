from containers.fifo import Queue


def test_len():
    q = Queue()
    q.enqueue(1)
    assert len(q) == 1


def test_order():
    q = Queue()
    for i in range(3):
        q.enqueue(i)
    assert [q.dequeue() for _ in range(3)] == [0, 1, 2]

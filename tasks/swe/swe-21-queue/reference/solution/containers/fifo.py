"""A FIFO queue."""

from collections import deque


class Empty(Exception):
    pass


class Queue:
    def __init__(self):
        self._items = deque()

    def enqueue(self, item):
        self._items.append(item)

    def dequeue(self):
        if not self._items:
            raise Empty("dequeue from an empty queue")
        return self._items.popleft()

    def __len__(self):
        return len(self._items)

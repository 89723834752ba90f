"""Breadth-first shortest paths in unweighted graphs (adjacency dicts)."""

from collections import deque


def shortest_path(graph, start, goal):
    """The nodes of a shortest path from ``start`` to ``goal``, both included; None if there is none."""
    parents = {start: None}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        if node == goal:
            path = []
            while parents[node] is not None:
                path.append(node)
                node = parents[node]
            return path[::-1]
        for nxt in graph.get(node, ()):
            if nxt not in parents:
                parents[nxt] = node
                todo.append(nxt)
    return None

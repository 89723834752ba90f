"""Task libraries as data and reward: procedural generators whose rows a run trains on and whose own
scorers grade the replies (``data.train=reasoning-gym:...``: ``reasoning_gym.py``), and repository
tasks with a world, graded by the sandbox (``data.train=swe:DIR``: ``swe.py``)."""

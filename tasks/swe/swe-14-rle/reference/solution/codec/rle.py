"""Run-length encoding."""


def rle_encode(text):
    """``text`` as (character, run length) pairs."""
    runs = []
    for ch in text:
        if runs and runs[-1][0] == ch:
            runs[-1] = (ch, runs[-1][1] + 1)
        else:
            runs.append((ch, 1))
    return runs


def rle_decode(runs):
    return "".join(ch * n for ch, n in runs)

"""Run-length encoding."""


def rle_encode(text):
    """``text`` as (character, run length) pairs."""
    runs, current, count = [], None, 0
    for ch in text:
        if ch == current:
            count += 1
        else:
            if current is not None:
                runs.append((current, count))
            current, count = ch, 1
    return runs


def rle_decode(runs):
    return "".join(ch * n for ch, n in runs)

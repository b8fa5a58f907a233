"""Sizes on the benchmarks' command lines, for the scripts in tools/bench
(each runs as a script, so this folder is on its sys.path):

    from sizes import parse_size
    parse_size("4G") == 4 << 30; parse_size("1.5m") == 3 << 19; parse_size("4096") == 4096

A whole number of bytes, or a number with a binary unit K, M, G or T (either
case: KiB, MiB, GiB, TiB). Anything else raises ValueError.
"""

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text):
    text = str(text).strip().upper()
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)
